"""`rankops dev demo`, the README's first command, ends with real scores from the example model,
served by Triton in a container on a real kubelet's node.

It brings up its own local cluster (control plane, real node, S3 server), so it needs nothing from
the suite's cluster; the images are built once and cached by content (the real-pod tests share them).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys


def test_the_demo_serves_the_example_model_from_containers_and_prints_its_scores():
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    done = subprocess.run([sys.executable, "-m", "rankops", "dev", "demo", "--timeout", "300"], env=env,
                          capture_output=True, text=True, timeout=1500)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    real_node = re.search(r"control plane up with (rankops-[0-9a-f]+-node-0), a node whose pods run in real", output)
    assert real_node, output[-4000:]
    node = re.escape(real_node.group(1))
    # Its validator ran in a container (no simulated verdict for it) and passed the sample RHEL host.
    assert not re.search(rf"{node} \[", output), output[-4000:]
    assert re.search(rf"^{node}\s+g4dn\.xlarge\s+t4-pool\s+true\s+535\.", output, re.M), output[-4000:]
    assert re.search(r"kwok-t4-2 \[nouveau-loaded\]: NOT ready", output), output[-4000:]
    # The serving pods are containers of the real runtime on that node.
    serving = re.findall(rf"^ctr-ranker-\S+\s+{node}\s+10\.245\.\S+\s+(\S+)$", output, re.M)
    assert len(serving) >= 2 and all(ids.startswith("containerd://") for ids in serving), output[-4000:]
    assert "ctr-ranker at ctr-ranker.reco.svc:8000: 100 candidates scored (scores); top 5:" in output, output[-4000:]
    scores = [float(s) for s in re.findall(r"^\s+\d\. candidate\s+\d+\s+score (-?\d+\.\d+)$", output, re.M)]
    assert len(scores) == 5 and scores == sorted(scores, reverse=True), output[-2000:]
