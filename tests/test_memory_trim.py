"""rankops run bounds glibc's heaps and gives a burst's freed memory back (controller/memory.py)."""
from __future__ import annotations

import threading

from rankops.controller import memory


def test_on_glibc_the_trimming_thread_runs(monkeypatch):
    trimmed = threading.Event()
    monkeypatch.setattr(memory, "TRIM_S", 0.01)
    libc = memory._libc()
    assert libc is not None, "the CI image is glibc-based"

    class Spy:
        def mallopt(self, what, value):
            assert (what, value) == (memory._M_ARENA_MAX, memory.ARENAS)
            return 1

        def malloc_trim(self, pad):
            trimmed.set()
            return 1

    monkeypatch.setattr(memory, "_libc", Spy)
    assert memory.start()
    assert trimmed.wait(5)
    assert libc.malloc_trim(0) in (0, 1), "the real one answers too"


def test_elsewhere_nothing_is_done(monkeypatch):
    monkeypatch.setattr(memory, "_libc", lambda: None)
    assert memory.start() is False
