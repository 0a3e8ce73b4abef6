"""Shared test settings.

A test that runs a reconcile through the controllers builds its own (controller/runtime.py): a
ModelController whose clock and queue are not started kicks nothing on its own, so nothing it
schedules runs later, in another test, against another test's fake API."""
from __future__ import annotations
