"""Shared test settings."""
from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _no_clock_kicks_between_tests(monkeypatch):
    """A test that runs a reconcile through controller.handlers schedules that model on the
    clock; left running, it would reconcile it again seconds later, in another test, against
    whatever fake API that test has put in place. Each test gets a clock that kicks nothing."""
    handlers = sys.modules.get("rankops.controller.handlers")
    if handlers is not None:
        from rankops.controller.clock import Clock
        monkeypatch.setattr(handlers, "CLOCK", Clock(lambda key: None, 10, 600, start=False))
    yield
