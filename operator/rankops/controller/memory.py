"""Give the memory of a burst back to the system (glibc only; elsewhere nothing is done).

What the operator holds once settled is ~110 MiB at N=300 (tracemalloc: ~50 of it code), yet its
RSS stayed at the peak of the burst that made the models (every watch event of N new models and
their children parsed at once): glibc keeps freed memory in its heaps, and a heap per thread
(kopf's workers, the kicks' pool) multiplies what it keeps. So: at most ARENAS heaps, set before
threads start, and every TRIM_S the free pages are returned (malloc_trim, a few ms).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from typing import Any, Callable

log = logging.getLogger("rankops.memory")
ARENAS = 2
TRIM_S = 30.0
M_ARENA_MAX = -8   # glibc's mallopt parameter


def glibc() -> Any:
    """The C library when it is glibc (it has malloc_trim and mallopt), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt   # noqa: B018 - glibc has both; musl has neither
    except (OSError, AttributeError):
        return None
    return libc


def start(load: Callable[[], Any] = glibc, trim_s: float = TRIM_S, stop: threading.Event | None = None) -> bool:
    """Bound glibc's heaps and start the thread that trims them every `trim_s` (until `stop` is
    set, if given); False where the C library is not glibc. `load`: what finds the C library
    (glibc, or a test's double)."""
    libc = load()
    if libc is None:
        return False
    libc.mallopt(M_ARENA_MAX, ARENAS)
    stop = stop or threading.Event()

    def trim() -> None:
        while not stop.wait(trim_s):
            libc.malloc_trim(0)

    threading.Thread(target=trim, name="rankops-malloc-trim", daemon=True).start()
    return True
