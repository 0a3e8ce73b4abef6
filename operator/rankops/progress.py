"""Progress lines on stderr for long steps, for a person watching a terminal.

Quiet when stderr is not a TTY (a gate Job's log, CI, a pipe): there the step's result is the
output, and a log full of progress lines only hides it.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`step(msg)` writes `[  12.3s] prefix: msg` to `stream` (default stderr) when it is a TTY."""

    def __init__(self, prefix: str, stream: TextIO | None = None) -> None:
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        try:
            self.enabled = bool(self.stream.isatty())
        except (AttributeError, ValueError):  # closed or not a file
            self.enabled = False

    def step(self, message: str) -> None:
        if self.enabled:
            print(f"[{time.monotonic() - self.started:6.1f}s] {self.prefix}: {message}", file=self.stream, flush=True)
