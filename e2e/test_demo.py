"""`rankops dev demo`, the README's first command, ends with real scores from the example model.

It brings up its own local control plane, so it needs nothing from the suite's cluster.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys


def test_the_demo_serves_the_example_model_and_prints_its_scores():
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run([sys.executable, "-m", "rankops", "dev", "demo", "--timeout", "240"], env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "t4-process-0 [" not in output  # the process node's validator really ran: no simulated verdict
    assert re.search(r"kwok-t4-2 \[nouveau-loaded\]: NOT ready", output), output[-4000:]
    assert "ctr-ranker at ctr-ranker.reco.svc:8000: 100 candidates scored (scores); top 5:" in output, output[-4000:]
    scores = [float(s) for s in re.findall(r"^\s+\d\. candidate\s+\d+\s+score (-?\d+\.\d+)$", output, re.M)]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True), output[-2000:]
