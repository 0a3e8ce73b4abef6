"""controller/clock.py: a model is reconciled `interval` after its last reconcile while time moves
it on, `resync` after it otherwise, and never twice for one due time."""
from __future__ import annotations

import threading
import time

from rankops.controller.clock import Clock


def test_due_counts_from_the_last_reconcile_by_what_the_model_needs():
    now = {"t": 100.0}
    clock = Clock(lambda key: None, interval_s=10, resync_s=600, clock=lambda: now["t"], start=False)
    clock.reconciled("rolling", needs_clock=True)
    clock.reconciled("settled", needs_clock=False)
    now["t"] = 109.9
    assert clock.take_due() == []
    now["t"] = 110.0
    assert clock.take_due() == ["rolling"]
    assert clock.take_due() == [], "once per due time"
    clock.reconciled("rolling", needs_clock=True)   # its reconcile schedules it again
    now["t"] = 115.0
    clock.reconciled("rolling", needs_clock=True)   # an event's reconcile moves the clock on
    now["t"] = 120.5
    assert clock.take_due() == []
    now["t"] = 125.0
    assert clock.take_due() == ["rolling"]
    now["t"] = 700.0
    assert clock.take_due() == ["settled"]


def test_a_forgotten_model_is_not_kicked():
    now = {"t": 0.0}
    clock = Clock(lambda key: None, interval_s=1, resync_s=5, clock=lambda: now["t"], start=False)
    clock.reconciled("gone", needs_clock=True)
    clock.forget("gone")
    now["t"] = 10
    assert clock.take_due() == []


def test_its_thread_kicks_when_due_without_waiting_for_a_later_one():
    kicked = threading.Event()
    clock = Clock(lambda key: kicked.set(), interval_s=0.2, resync_s=3600)
    time.sleep(0.05)   # the thread waits on an empty clock
    started = time.monotonic()
    clock.reconciled("m", needs_clock=True)
    assert kicked.wait(5)
    assert 0.15 <= time.monotonic() - started < 2
