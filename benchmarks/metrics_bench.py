"""What a hostile metrics endpoint costs the operator (issue 36): the parser's time on adversarial
1 MB lines and the longest stall it causes another thread, the old label regex beside it, and the
reader against pods that stall, against pods that answer.

    .venv/bin/python benchmarks/metrics_bench.py [--old-timeout 10]

Prints, per adversarial input: parse time (ms) and the longest gap a 1 ms ticker thread saw
(the process "standing still"); then the old regex's time on the same line (killed at
--old-timeout s: it holds the GIL); then one model with 6 silent pods and one honest model on
the same PodMetrics reader: how long the honest model waits for its answer, and the reconcile's
own wait for either.
"""
from __future__ import annotations

import argparse
import multiprocessing
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from rankops.controller.pod_metrics import PodMetrics, Target  # noqa: E402
from rankops.triton.metrics import MetricsRejected, parse  # noqa: E402
from tests.hostile import Endpoint, timed_with_stall  # noqa: E402

MB = 1 << 20
INPUTS = {
    "unquoted 1 MB label": "nv_inference_count{" + "a" * MB + " 1",
    "quoted 1 MB label value": 'nv_inference_count{model="' + "a" * MB + '"} 1',
    "1 MB of escaped quotes": 'nv_inference_count{model="' + '\\"' * (MB // 2) + '"} 1',
    "1 MB number": 'nv_inference_count{model="m",version="1"} ' + "1" * MB,
    "130k labels": "nv_inference_count{" + 'a="b",' * (MB // 8) + "} 1",
    "1 MB of 32k series": 'nv_inference_count{model="m",version="1"} 1\n' * (MB // 32),
}
OLD_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def timed_parse(text: str) -> tuple[float, float]:
    def parse_it():
        try:
            parse(text, "m", "1")
        except MetricsRejected:
            pass
    return timed_with_stall(parse_it)


def _old(text: str) -> None:
    OLD_LABEL.findall(text[text.find("{") + 1:])


def old_parse(text: str, timeout_s: float) -> str:
    proc = multiprocessing.Process(target=_old, args=(text,))
    started = time.perf_counter()
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        return f"> {timeout_s:g} s (killed)"
    return f"{(time.perf_counter() - started) * 1000:.0f} ms"


def honest(conn, stop):
    body = b'nv_inference_request_success{model="m",version="1"} 10\n'
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old-timeout", type=float, default=10.0)
    args = ap.parse_args()
    print(f"{'input':28} {'parse ms':>9} {'max stall ms':>13} {'old regex':>18}")
    for name, text in INPUTS.items():
        took, gap = timed_parse(text)
        old = old_parse(text, args.old_timeout) if "label" in name else "-"
        print(f"{name:28} {took * 1000:9.1f} {gap * 1000:13.1f} {old:>18}")

    silent = Endpoint(lambda conn, stop: stop.wait(30)).port
    answering = Endpoint(honest).port
    kicked: dict[str, float] = {}
    reader = PodMetrics(kick=lambda who: kicked.setdefault(who, time.perf_counter()))
    started = time.perf_counter()
    reader.read("hostile", "m", [Target("stable", f"h{i}", "127.0.0.1", "1", silent) for i in range(6)])
    hostile_wait = time.perf_counter() - started
    started = time.perf_counter()
    reader.read("honest", "m", [Target("stable", "ok", "127.0.0.1", "1", answering)])
    honest_wait = time.perf_counter() - started
    while "honest" not in kicked and time.perf_counter() - started < 10:
        time.sleep(0.001)
    print(f"\nreader: reconcile waited {hostile_wait * 1000:.1f} ms (6 silent pods) and {honest_wait * 1000:.1f} ms "
          f"(honest); the honest model's answer came {(kicked.get('honest', float('nan')) - started) * 1000:.1f} ms "
          "after it asked, beside 6 silent pods (each read ends at its 2 s deadline)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
