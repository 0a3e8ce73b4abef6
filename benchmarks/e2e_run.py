"""Run one e2e benchmark test (e2e/bench_*.py) in its own pytest, the real-container cluster of
e2e/conftest.py serving it, and read back the report it writes to the file `report_env` names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_e2e(test: str, report_env: str, timeout_s: float, extra_env: dict[str, str] | None = None
            ) -> tuple[dict | None, int]:
    """(the report, pytest's exit code); no report: pytest's output tail is printed, and the code is not 0."""
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
                              cwd=ROOT, env={**os.environ, report_env: str(out), **(extra_env or {})},
                              capture_output=True, text=True, timeout=timeout_s)
        if not out.exists():
            print(done.stdout[-4000:], done.stderr[-2000:], sep="\n")
            return None, done.returncode or 1
        return json.loads(out.read_text()), done.returncode
