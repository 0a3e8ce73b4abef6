"""Does loading a new version beside the serving one fail or stall its requests? (issue 41, first slice)

The example model of tests/triton/test_conformance.py served by the real-Triton fixture (tritonserver
2.51, CPU) with the rendered Deployment's arguments; v2 (other weights) exported beside v1 and loaded
through rankops' repository client with a config override whose version policy lists both, while two
closed-loop clients send requests to v1 by name and to the model without a version. Printed: how
long the load took to answer, each client's (ok, failed) over the ~4 s around it, and Triton's
lifecycle lines (a config change lists v1 as "loading" again; one instance is created: v2's).

    PYTHONPATH=operator:dev .venv/bin/python benchmarks/inplace_load_bench.py

A CPU stand-in says nothing of GPU memory or of a GPU load's interference: that is the next round's
e2e on real containers.
"""
from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "triton"))

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from rankops.api.rankingmodel import ModelFormat
from rankops.render import names
from rankops.render.serving import API_KEY_HEADER, API_KEY_SECRET_KEY
from rankops.triton.client import Endpoint, GateClientError
from rankops.triton.repository import Repository, with_versions
from rankops.triton.samples import Sample
from rankops_dev import spec_models, triton
from test_conformance import _doc

rm, server = triton.server_for_model(_doc(), Path(tempfile.mkdtemp()))
with server:
    key = server.secrets[names.api_key_secret_name("ranker")][API_KEY_SECRET_KEY]
    host, port = server.http_url.rsplit(":", 1)
    repo = Repository(host, int(port), {API_KEY_HEADER: key})
    spec_models.export(rm.spec, ModelFormat.onnx, server.repository / "ranker" / "2", seed=7)
    config = json.loads(json_format.MessageToJson(text_format.Parse(
        (server.repository / "ranker" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()),
        preserving_proto_field_name=True))
    inputs = spec_models.request_arrays(rm.spec, candidates=5)
    stop, counts = threading.Event(), {}

    def drive(version):
        c = Endpoint(server.http_url, "ranker", version).connect()
        req = c.build_request(Sample(line=1, inputs=inputs), c.model_info())
        ok = failed = 0
        while not stop.is_set():
            try:
                c.infer(req)
                ok += 1
            except GateClientError as exc:
                failed += 1
                counts.setdefault(f"error {version or 'unnamed'}", str(exc)[:120])
        counts[version or "unnamed"] = (ok, failed)

    threads = [threading.Thread(target=drive, args=(v,)) for v in ("1", "")]
    for t in threads:
        t.start()
    time.sleep(2)
    t0 = time.monotonic()
    repo.load("ranker", with_versions(config, [1, 2]))
    took = time.monotonic() - t0
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join()
    print(f"load of v2 beside v1: {took * 1000:.0f} ms; requests (ok, failed) over ~4 s around it: {counts}")
    print("\n".join(l for l in server.log_text().splitlines() if "model_lifecycle" in l or "Initialize" in l))
