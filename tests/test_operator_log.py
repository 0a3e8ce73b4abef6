"""The e2e guard that fails a test when the operator logs an error: it must read kopf's log format
(`[ERROR   ]`, what `rankops run` writes) as well as plain logging's, and nothing else."""
from __future__ import annotations

import logging

from kopf._core.actions.loggers import make_formatter  # the formatter `kopf.configure` installs

from rankops_dev.operator_process import error_lines


def _kopf_line(level: int, message: str, name: str = "kopf.objects") -> str:
    record = logging.LogRecord(name, level, __file__, 1, message, None, None)
    return make_formatter().format(record)


def _plain_line(level: int, message: str, fmt: str) -> str:
    return logging.Formatter(fmt).format(logging.LogRecord("rankops.models", level, __file__, 1, message, None, None))


def test_kopf_error_records_are_seen():
    line = _kopf_line(logging.ERROR, "Handler 'rankingmodel_changed' failed temporarily: 403 Forbidden")
    assert "[ERROR   ]" in line and " ERROR " not in line  # what the old " ERROR " guard missed
    assert error_lines(f"{_kopf_line(logging.INFO, 'fine')}\n{line}\n") == [line]
    critical = _kopf_line(logging.CRITICAL, "boom")
    assert error_lines(critical) == [critical]


def test_plain_logging_errors_and_tracebacks_are_seen():
    timed = _plain_line(logging.ERROR, "node t4-a: could not record the validation", "%(asctime)s %(levelname)s %(message)s")
    basic = _plain_line(logging.ERROR, "boom", logging.BASIC_FORMAT)   # ERROR:rankops.models:boom
    text = "\n".join([timed, basic, "Traceback (most recent call last):", "  File 'x.py', line 1"])
    assert error_lines(text) == [timed, basic, "Traceback (most recent call last):"]


def test_other_levels_and_kopfs_retried_requests_are_not_errors():
    quiet = [
        _kopf_line(logging.INFO, "Handler 'rankingmodel_changed' succeeded."),
        _kopf_line(logging.WARNING, "ERRORS are words too, in a warning"),
        _kopf_line(logging.DEBUG, "Patching with: {'status': {'phase': 'Degraded'}}"),
        # kopf's watch retrying a request (429 while a new CRD's storage initialises): it recovers.
        _kopf_line(logging.ERROR, "Request attempt #1/9 failed; will retry: GET /apis -> 429", name="kopf._cogs.clients.api"),
    ]
    assert error_lines("\n".join(quiet)) == []
