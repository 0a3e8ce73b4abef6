"""The real-Triton fixture for the tests: installed once per machine, a server per rendered model.

No test here skips when the server cannot be installed or started: that is a failure (the
fixture's log tail says why).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from rankops_dev import triton


@pytest.fixture(scope="session")
def triton_install() -> triton.TritonInstall:
    try:
        return triton.ensure_installed()
    except triton.TritonError as exc:
        pytest.fail(f"the real-Triton fixture cannot be installed: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def artifacts_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("artifacts")
