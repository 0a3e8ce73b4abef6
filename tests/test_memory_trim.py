"""rankops run bounds glibc's heaps and gives a burst's freed memory back (controller/memory.py)."""
from __future__ import annotations

import threading

from rankops.controller import memory


def test_on_glibc_the_trimming_thread_runs():
    trimmed = threading.Event()
    libc = memory.glibc()
    assert libc is not None, "the CI image is glibc-based"

    class Spy:
        def mallopt(self, what, value):
            assert (what, value) == (memory.M_ARENA_MAX, memory.ARENAS)
            return 1

        def malloc_trim(self, pad):
            trimmed.set()
            return 1

    stop = threading.Event()
    try:
        assert memory.start(load=Spy, trim_s=0.01, stop=stop)
        assert trimmed.wait(5)
    finally:
        stop.set()
    assert libc.malloc_trim(0) in (0, 1), "the real one answers too"


def test_elsewhere_nothing_is_done():
    assert memory.start(load=lambda: None) is False
