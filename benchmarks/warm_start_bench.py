"""What the warm container costs a Triton pod's start (issue 17), on the real-Triton fixture.

Per run, a pod's two processes start at once as the kubelet starts them: tritonserver with the
rendered arguments, and the rendered `rankops warm` command on the same address. Prints, per
run and as medians: seconds to Triton ready (what a pod without warm waits for), to warm's
/ready 200 (what a pod with warm waits for), the difference (the extra start time), the warm
process's CPU seconds and peak RSS, and its summary (rounds, cold max, warm P99).

    .venv/bin/python benchmarks/warm_start_bench.py [--runs 3] [--model manifests/examples/rankingmodel-ctr-ranker.yaml]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
from rankops_dev import triton  # noqa: E402
from rankops_dev.ports import free_ports  # noqa: E402

HOST = "127.0.0.1"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _status(url: str) -> int | None:
    try:
        with _DIRECT.open(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _warm_argv(deployment: dict, ports: dict[str, int], port: int) -> list[str]:
    [warm] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "warm"]
    argv = [a.replace("$(POD_IP)", HOST) for a in warm["command"]]
    for flag, value in (("--http-port", ports["http"]), ("--metrics-port", ports["metrics"]), ("--port", port)):
        argv[argv.index(flag) + 1] = str(value)
    return [str(Path(sys.executable).parent / "rankops"), *argv[1:]]


def _proc_stats(pid: int) -> tuple[float, int]:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
               if line.startswith("VmHWM"))
    return cpu, hwm // 1024


def one_run(doc: dict, work: Path) -> dict:
    _, server = triton.server_for_model(doc, work)
    _, deployment, _ = triton.rendered_serving(doc)
    *ports, port = free_ports(4, HOST)
    server.ports = dict(zip(("http", "grpc", "metrics"), ports))
    log = open(work / "warm.log", "wb")
    start = time.monotonic()
    warm = subprocess.Popen(_warm_argv(deployment, server.ports, port), stdout=log, stderr=subprocess.STDOUT)
    server.start()
    triton_ready = warm_ready = None
    try:
        while warm_ready is None:
            if triton_ready is None and _status(f"http://{server.http_url}/v2/health/ready") == 200:
                triton_ready = time.monotonic() - start
            if _status(f"http://{HOST}:{port}/ready") == 200:
                warm_ready = time.monotonic() - start
            time.sleep(0.05)
        cpu, rss = _proc_stats(warm.pid)
    finally:
        warm.terminate()
        warm.wait(10)
        server.stop()
        log.close()
    summary = next(json.loads(line) for line in (work / "warm.log").read_text().splitlines()
                   if line.startswith("{") and json.loads(line)["event"] == "warm")
    return {"tritonReadyS": triton_ready or warm_ready, "warmReadyS": warm_ready, "cpuS": cpu, "peakRssMiB": rss,
            "rounds": summary["rounds"], "coldMaxMs": summary["coldMaxMs"], "p99Ms": summary["p99Ms"],
            "replayS": summary["warmingS"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default=str(ROOT / "manifests" / "examples" / "rankingmodel-ctr-ranker.yaml"))
    args = parser.parse_args()
    doc = yaml.safe_load(Path(args.model).read_text())
    rows = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="warm-bench-") as work:
            row = one_run(doc, Path(work))
        row["extraS"] = row["warmReadyS"] - row["tritonReadyS"]
        rows.append(row)
        print(f"run {run + 1}: Triton ready {row['tritonReadyS']:.2f}s, warm ready {row['warmReadyS']:.2f}s "
              f"(+{row['extraS']:.2f}s; replay {row['replayS']:.2f}s, {row['rounds']} round(s), cold max "
              f"{row['coldMaxMs']:.1f} ms, warm P99 {row['p99Ms']:.1f} ms); warm process {row['cpuS']:.2f} CPU s, "
              f"peak RSS {row['peakRssMiB']} MiB")
    med = {k: statistics.median(r[k] for r in rows) for k in ("tritonReadyS", "warmReadyS", "extraS", "cpuS", "peakRssMiB")}
    print(f"median of {len(rows)}: Triton ready {med['tritonReadyS']:.2f}s, warm ready {med['warmReadyS']:.2f}s, "
          f"extra start time {med['extraS']:.2f}s, warm CPU {med['cpuS']:.2f}s, peak RSS {med['peakRssMiB']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
