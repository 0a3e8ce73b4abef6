"""Overload: what a replica serves within its P99 budget at 0.5x..3x its sustainable rate, with
and without the queue policy of `slo.overload: shed` (issue 40, item 5).

The model is the timed stand-in (tests/triton/timed_model.py: a Python-backend model that sleeps
t(b) = a + b·items ms per batch, and stretches by 1 + slowdown while another instance of it runs)
served by real Triton 2.51. The plan and the config are the operator's: a RankingModel spec with
`batching: auto`, `slo {p99LatencyMs, targetQps, overload}` and `planning.latencyProfile` = the
stand-in's true t(b) goes through the planner (rankops.planner) for the sustainable rate of one
replica (qpsPerGpu x 1 GPU) and through the renderer (render_config_pbtxt with the planned
ServingShape) for config.pbtxt; the rendered `dynamic_batching { ... }` block, max_batch_size and
instance count are spliced into the stand-in's config. "with policy" renders the spec with
`overload: shed`, "without" the same spec with `overload: queue` (what users have today: a queue
with no deadline). `--policy-block` adds hand-written fields to the shed run's dynamic_batching
block instead (`approx`: REJECT after budget - compute(max batch, instances sharing) - 10% margin,
a large max_queue_size, 2 priority levels): for a tree whose renderer emits no queue policy yet;
when it does, the shed run uses the rendered block untouched unless --policy-block is given.

Load: open loop. Requests arrive at Poisson times at each rate whatever the answers (asyncio, raw
HTTP/1.1 keep-alive streams, KServe v2 JSON, a connection per request in flight: in-flight is
unbounded, so a queue without a policy grows and its requests wait). Each point is a fresh server
(Triton's summary P99 is a sliding window), `--warmup` s of load not counted, then `--seconds` s
counted; after the last arrival the client waits up to `--drain` s for the answers still due
(a request not answered by then counts as not served). Latency is from a request's scheduled
arrival to its answer, client side. 503 = shed (Triton answers both queue timeouts and full
queues with 503).

Printed per (policy, rate): P50/P99 of the requests served (200), the share of all requests
served within the budget, the shed ratio, goodput (answers within the budget per second), errors
and unanswered requests, the generator's achieved vs intended arrival rate and its lateness P99
(a warning when it sent >5% slower than asked: then the client, not the server, limited the run),
and Triton's own summary P99 and REJECTED counter (nv_inference_request_failure{reason="REJECTED"},
which counts queue timeouts; full-queue rejections are counted nowhere) for cross-check. Then the
run's parameters and the issue's goal: with the policy, served P99 within the budget at 2x and 3x
and goodput at 2x >= goodput at 1x.

    .venv/bin/python benchmarks/overload_bench.py --policy-block approx        # ~6 min, both policies
    .venv/bin/python benchmarks/overload_bench.py --policy-block approx --json out.json
    .venv/bin/python benchmarks/overload_bench.py --policies shed --fractions 2,3 --seconds 10
    .venv/bin/python benchmarks/overload_bench.py --policy-block \\
        'priority_levels: 2 default_priority_level: 1 default_queue_policy { timeout_action: REJECT
         default_timeout_microseconds: 45000 allow_timeout_override: true max_queue_size: 1000 }'

On a 2-core shared machine: the stand-in sleeps rather than computes, and the default service
time (20 + 5·b ms, batches up to 8) keeps 3x within what one Python event loop sends.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "dev")]
sys.path.insert(0, str(ROOT / "tests" / "triton"))

MODEL = "timed"
A_MS, B_MS, SLOWDOWN = 20.0, 5.0, 0.5
PROFILE_SIZES = (1, 2, 4, 8)
FRACTIONS = (0.5, 1.0, 1.5, 2.0, 3.0)
POLICIES = ("shed", "queue")
MARGIN = 0.10                # of the budget, kept off the approximated timeout
APPROX_MAX_QUEUE = 1000      # a memory backstop well above the rate x timeout the timeout leaves queued
BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 0.0, 0.0, 0.0]}]})


class BenchError(SystemExit):
    """A bad option or a config that cannot be built: the message says which and what to do."""

    def __init__(self, message: str):
        super().__init__(f"overload_bench: {message}")


# --- the operator's plan and config ---------------------------------------------------------

def spec_for(budget_ms: float, target_qps: float, overload: str, a_ms: float = A_MS, b_ms: float = B_MS,
             slowdown: float = SLOWDOWN) -> dict:
    """The RankingModel spec a user would write for the stand-in (camelCase, as in a manifest)."""
    return {
        "version": "1",
        "versions": [{"name": "1", "modelUri": f"s3://models/{MODEL}/1", "format": "onnx"}],
        "inputs": [{"name": "x", "dataType": "FP32", "dims": [4]}],
        "outputs": [{"name": "y", "dataType": "FP32", "dims": [1]}],
        "batching": "auto",
        "slo": {"p99LatencyMs": budget_ms, "targetQps": target_qps, "overload": overload},
        "planning": {
            # the stand-in's true service time: the plan is made for the server that is measured
            "latencyProfile": {b: a_ms + b_ms * b for b in PROFILE_SIZES},
            "sharedGpuSlowdown": slowdown,
            "headroom": 0, "failureTolerance": 0,
        },
    }


@dataclass
class Rendered:
    overload: str
    plan: object               # rankops.planner.PlanResult
    config_text: str           # the whole rendered config.pbtxt
    block: str                 # its dynamic_batching { ... } block


def render(spec_dict: dict) -> Rendered:
    """Validate the spec, plan it and render config.pbtxt with the planned shape, as the operator does."""
    from rankops.api.rankingmodel import RankingModelSpec
    from rankops.render.desired import resolve_shape
    from rankops.render.tritonconfig import render_config_pbtxt

    spec = RankingModelSpec.model_validate(spec_dict)
    resolved = resolve_shape(spec)
    version = spec.versions[0]
    text = render_config_pbtxt(MODEL, "bench", spec, version, resolved.shape)
    return Rendered(spec_dict["slo"]["overload"], resolved.plan, text, dynamic_batching_block(text))


def dynamic_batching_block(config_text: str) -> str:
    """The `dynamic_batching { ... }` block of a config.pbtxt, its nested braces included."""
    found = re.search(r"^\s*dynamic_batching\s*\{", config_text, re.M)
    if found is None:
        raise BenchError("the rendered config.pbtxt has no dynamic_batching block (a plan of max batch 1?)")
    depth, start = 0, config_text.index("dynamic_batching", found.start())
    for at in range(found.end() - 1, len(config_text)):
        depth += {"{": 1, "}": -1}.get(config_text[at], 0)
        if depth == 0:
            return config_text[start:at + 1]
    raise BenchError("the rendered dynamic_batching block is not closed")


def has_queue_policy(block: str) -> bool:
    """Whether the block sheds: a default queue policy (every block has the gates' priority level 2 policy)."""
    return "default_queue_policy" in block


def add_fields(block: str, fields: str) -> str:
    """`block` with hand-written fields added before its closing brace."""
    return block[:block.rindex("}")].rstrip() + "\n  " + " ".join(fields.split()) + "\n}"


def approx_policy(budget_ms: float, max_batch_ms: float, instances: int, slowdown: float,
                  overhead_ms: float = 0.0) -> tuple[str, str]:
    """The queue policy fields issue 40 asks for, approximated by hand: a request may wait what is
    left of the budget after the longest execution it can join (`max_batch_ms`, the plan's max
    batch, slowed by every other instance executing too), the overhead and a 10% margin; then it
    is rejected (503). Returns the fields and the arithmetic."""
    compute = max_batch_ms * (1 + slowdown * (instances - 1))
    timeout_ms = budget_ms - compute - overhead_ms - MARGIN * budget_ms
    arithmetic = (f"timeout = budget {budget_ms:g} - compute {max_batch_ms:g} ms x (1 + {slowdown:g} x "
                  f"{instances - 1}) - overhead {overhead_ms:g} - margin {MARGIN * budget_ms:g} = {timeout_ms:g} ms")
    if timeout_ms <= 0:
        raise BenchError(f"--policy-block approx: {arithmetic}: no time left to queue; raise --budget")
    fields = ("priority_levels: 2 default_priority_level: 1 default_queue_policy { timeout_action: REJECT "
              f"default_timeout_microseconds: {int(round(timeout_ms * 1000))} allow_timeout_override: true "
              f"max_queue_size: {APPROX_MAX_QUEUE} }}")
    return fields, arithmetic


def plan_policy(budget_ms: float, plan, slowdown: float) -> tuple[str, str]:
    return approx_policy(budget_ms, plan.inputs.profile.compute_ms(plan.max_batch_size), plan.instances_per_gpu,
                         slowdown, plan.inputs.overhead_ms)


def checked_block(block: str) -> str:
    """The block as Triton's own config parser reads it (a typo fails here, not at load)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        text_format.Parse(block, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise BenchError(f"the dynamic_batching block does not parse as Triton's ModelConfig ({exc}):\n{block}")
    return block


def write_model(root: Path, plan, block: str, a_ms: float, b_ms: float, slowdown: float) -> Path:
    """The stand-in's repository with the planned max batch and instances and `block` spliced in."""
    import timed_model

    models = timed_model.write_repository(root, MODEL, a_ms=a_ms, b_ms=b_ms, slowdown=slowdown,
                                          max_batch=plan.max_batch_size, instances=plan.instances_per_gpu)
    config = models / MODEL / "config.pbtxt"
    text, replaced = re.subn(r"^dynamic_batching \{.*\}$", lambda _: block, config.read_text(), count=1, flags=re.M)
    if replaced != 1:
        raise BenchError("timed_model.CONFIG has no one-line dynamic_batching block to replace")
    config.write_text(text)
    return models


# --- the open-loop load generator -----------------------------------------------------------

@dataclass
class Load:
    latency_ms: np.ndarray     # scheduled arrival to answer; NaN when not answered
    status: np.ndarray         # HTTP status; 0 = connection error, -1 = not answered by the drain
    late_ms: np.ndarray        # how late each request was written; NaN: never written
    sent_at: np.ndarray        # seconds from the schedule's start; NaN: never written
    connections: int           # connections opened (the most in flight at once, about)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, bool]:
    writer.write(request)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if "content-length" not in headers:
        raise ConnectionError(f"answer without Content-Length: {lines[0]}")
    await reader.readexactly(int(headers["content-length"]))
    return status, headers.get("connection", "").lower() != "close"


async def open_loop(host: str, port: int, arrivals_s: np.ndarray, drain_s: float) -> Load:
    """Send a request at each arrival time (seconds from now), whatever the answers."""
    request = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n{BODY}").encode()
    n = len(arrivals_s)
    latency = np.full(n, np.nan)
    status = np.full(n, -1, dtype=int)
    late = np.full(n, np.nan)
    sent_at = np.full(n, np.nan)
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    opened = [0]
    start = time.perf_counter() + 0.2

    async def one(i: int) -> None:
        due = start + arrivals_s[i]
        writer = None
        try:
            if idle:
                reader, writer = idle.pop()
            else:
                reader, writer = await asyncio.open_connection(host, port)
                opened[0] += 1
            now = time.perf_counter()
            late[i], sent_at[i] = (now - due) * 1000, now - start
            code, keep = await _exchange(reader, writer, request)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            status[i] = 0
            if writer is not None:
                writer.close()
            return
        latency[i], status[i] = (time.perf_counter() - due) * 1000, code
        if keep:
            idle.append((reader, writer))
        else:
            writer.close()

    tasks = []
    for i in range(n):
        delay = start + arrivals_s[i] - time.perf_counter()
        # always yield: requests already due must be written, not only scheduled
        await asyncio.sleep(max(0.0, delay))
        tasks.append(asyncio.create_task(one(i)))
    _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for _, writer in idle:
        writer.close()
    return Load(latency, status, late, sent_at, opened[0])


# --- one point ------------------------------------------------------------------------------

@dataclass
class Point:
    policy: str
    fraction: float
    rate: float                    # intended arrivals per second
    requests: int                  # arrivals counted (after the warm-up)
    served: int                    # answered 200
    shed: int                      # answered 503
    errors: int                    # other answers, connection errors
    unanswered: int                # no answer by the end of the drain
    p50_ms: float | None           # of the requests served
    p99_ms: float | None
    within_share: float            # served within the budget / all counted requests
    shed_ratio: float
    goodput: float                 # served within the budget per second
    achieved_rate: float           # what the generator sent, per second
    late_p99_ms: float
    connections: int
    triton_p99_ms: float | None    # Triton's summary P99 (sliding window: warm-up included)
    shed_all: int                  # 503s of the whole run, warm-up included (to set against Triton's)
    triton_rejected: float | None  # nv_inference_request_failure{reason="REJECTED"} over the run
    triton_failures: float | None
    avg_batch: float | None
    warnings: list[str] = field(default_factory=list)


def _rejected(text: str) -> float:
    """Sum of nv_inference_request_failure{model=MODEL, reason="REJECTED"} (a tree without the
    operator's `rejected` counter key reads it here)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure{") and f'model="{MODEL}"' in line \
                and 'reason="REJECTED"' in line:
            total += float(line.rsplit(None, 1)[1])
    return total


def _triton(metrics_url: str) -> tuple:
    from rankops.triton import metrics

    host, port = metrics_url.rsplit(":", 1)
    text = metrics.fetch(host, int(port))
    counters = metrics.parse(text, MODEL)
    rejected = counters.values["rejected"] if "rejected" in counters.values else _rejected(text)
    return counters, rejected


def _scrape_when_up(metrics_url: str, wait_s: float = 15.0):
    from rankops.triton import metrics

    deadline = time.monotonic() + wait_s
    while True:
        try:
            return _triton(metrics_url)
        except metrics.MetricsUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_point(install, work: Path, policy: str, fraction: float, sustainable: float, plan, block: str,
              args) -> Point:
    import timed_model
    from rankops.triton import metrics

    rate = sustainable * fraction
    root = work / f"{policy}-{fraction:g}"
    write_model(root, plan, block, args.a_ms, args.b_ms, args.slowdown)
    total = int(round(rate * (args.warmup + args.seconds)))
    arrivals = _arrivals(rate, total, args.seed)
    with timed_model.server(install, root, [MODEL]) as server:
        before, rejected_before = _scrape_when_up(server.metrics_url)
        host, port = server.http_url.rsplit(":", 1)
        load = asyncio.run(open_loop(host, int(port), arrivals, args.drain))
        after, rejected_after = _triton(server.metrics_url)
    counted = arrivals >= args.warmup
    status, latency = load.status[counted], load.latency_ms[counted]
    n = int(counted.sum())
    ok = status == 200
    within = int((ok & (latency <= args.budget)).sum())
    served = latency[ok]
    written = ~np.isnan(load.sent_at)
    sent = load.sent_at[written]
    span = float(sent.max() - sent.min()) if len(sent) > 1 else 0.0
    achieved = (len(sent) - 1) / span if span > 0 else 0.0
    intended_span = float(arrivals[-1] - arrivals[0]) if total > 1 else 0.0
    intended = (total - 1) / intended_span if intended_span > 0 else rate
    report = metrics.run_report(before, after)
    warnings = []
    if achieved < 0.95 * intended:
        warnings.append(f"the generator sent {achieved:.0f} req/s of {intended:.0f} asked (>5% short): "
                        "the client limited this point")
    return Point(
        policy=policy, fraction=fraction, rate=rate, requests=n, served=int(ok.sum()),
        shed=int((status == 503).sum()), errors=int(((status != 200) & (status != 503) & (status != -1)).sum()),
        unanswered=int((status == -1).sum()),
        p50_ms=float(np.percentile(served, 50)) if len(served) else None,
        p99_ms=float(np.percentile(served, 99)) if len(served) else None,
        within_share=within / n if n else 0.0, shed_ratio=float((status == 503).sum()) / n if n else 0.0,
        goodput=within / args.seconds, achieved_rate=achieved,
        late_p99_ms=float(np.percentile(load.late_ms[written], 99)) if written.any() else 0.0,
        connections=load.connections, triton_p99_ms=report["p99Ms"],
        shed_all=int((load.status == 503).sum()), triton_rejected=rejected_after - rejected_before,
        triton_failures=report["failures"],
        avg_batch=report["avgBatchSize"], warnings=warnings)


def _arrivals(rate: float, count: int, seed: int) -> np.ndarray:
    from rankops.planner.simulator import poisson_arrivals_ms

    return poisson_arrivals_ms(rate, count, seed) / 1000.0


# --- the run --------------------------------------------------------------------------------

def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(points: list[Point], budget: float) -> None:
    print(f"{'policy':6} {'x':>4} {'req/s':>6} {'sent/s':>6} {'late99':>6} {'count':>6} {'P50':>7} "
          f"{'P99 srv':>8} {'within':>7} {'shed':>6} {'goodput':>7} {'err':>4} {'unans':>5} "
          f"{'Tr P99':>7} {'503s':>5} {'Tr REJ':>6} {'batch':>5}")
    for p in points:
        print(f"{p.policy:6} {p.fraction:4g} {p.rate:6.0f} {p.achieved_rate:6.0f} {p.late_p99_ms:6.1f} "
              f"{p.requests:6d} {_fmt(p.p50_ms):>7} {_fmt(p.p99_ms):>8} {p.within_share:7.1%} "
              f"{p.shed_ratio:6.1%} {p.goodput:7.1f} {p.errors:4d} {p.unanswered:5d} {p.connections:5d} "
              f"{_fmt(p.triton_p99_ms):>7} {p.shed_all:5d} {_fmt(p.triton_rejected, '.0f'):>6} "
              f"{_fmt(p.avg_batch, '.2f'):>5}"
              + ("  !" if p.warnings else ""))
        for w in p.warnings:
            print(f"    ! {w}")
    print(f"(ms; P99 srv = of the answers 200, from scheduled arrival; within = share of all requests "
          f"served within {budget:g} ms; goodput = those per second; "
          "late99 = generator's lateness P99; conns = connections opened (~most in flight); "
          "503s = all sheds incl. warm-up; Tr = Triton's own, whole run)")


def goal(points: list[Point], budget: float) -> list[str]:
    """The issue's goal, checked on the shed run."""
    shed = {p.fraction: p for p in points if p.policy == "shed"}
    lines = []
    for x in (2.0, 3.0):
        if x in shed:
            p99 = shed[x].p99_ms
            lines.append(f"with policy at {x:g}x: served P99 {_fmt(p99)} ms "
                         f"{'within' if p99 is not None and p99 <= budget else 'OVER'} the budget {budget:g} ms")
    if 1.0 in shed and 2.0 in shed:
        g1, g2 = shed[1.0].goodput, shed[2.0].goodput
        lines.append(f"with policy: goodput at 2x {g2:.1f}/s {'>=' if g2 >= g1 else '<'} at 1x {g1:.1f}/s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=150.0, help="slo.p99LatencyMs (default 150)")
    parser.add_argument("--a-ms", type=float, default=A_MS, help="stand-in's fixed ms per batch")
    parser.add_argument("--b-ms", type=float, default=B_MS, help="stand-in's ms per batch item")
    parser.add_argument("--slowdown", type=float, default=SLOWDOWN,
                        help="stand-in's and planning.sharedGpuSlowdown's stretch per other instance")
    parser.add_argument("--fractions", default=",".join(map(str, FRACTIONS)),
                        help="rates as multiples of the plan's sustainable rate of one replica")
    parser.add_argument("--policies", default=",".join(POLICIES), help="shed,queue (either or both)")
    parser.add_argument("--policy-block", default=None, metavar="TEXT",
                        help="fields added to the shed run's dynamic_batching block (replacing the "
                             "renderer's policy, if any); 'approx' computes them from the budget and plan")
    parser.add_argument("--seconds", type=float, default=20.0, help="counted load per point")
    parser.add_argument("--warmup", type=float, default=3.0, help="load per point before counting")
    parser.add_argument("--drain", type=float, default=45.0, help="most seconds to wait for answers after "
                        "the last arrival (a backlog without a policy drains slowly)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-': stdout)")
    args = parser.parse_args()
    try:
        fractions = [float(x) for x in args.fractions.split(",")]
    except ValueError:
        raise BenchError(f"--fractions {args.fractions!r}: give numbers separated by commas, e.g. 0.5,1,2")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies or any(p not in POLICIES for p in policies):
        raise BenchError(f"--policies {args.policies!r}: give shed, queue or shed,queue")
    if min(fractions) <= 0 or args.seconds <= 0 or args.warmup < 0 or args.drain <= 0:
        raise BenchError("--fractions and --seconds must be > 0, --warmup >= 0, --drain > 0")

    from rankops_dev import triton

    began = time.perf_counter()
    blocks, notes, plans = {}, [], {}
    for policy in policies:
        rendered = render(spec_for(args.budget, 1.0, policy, args.a_ms, args.b_ms, args.slowdown))
        plans[policy] = rendered.plan
        block, source = rendered.block, "renderer"
        if policy == "shed":
            if args.policy_block:
                fields = args.policy_block
                if fields.strip() == "approx":
                    fields, arithmetic = plan_policy(args.budget, rendered.plan, args.slowdown)
                    notes.append(f"--policy-block approx: {arithmetic}")
                block, source = add_fields(without_policy(block), fields), "--policy-block"
            elif not has_queue_policy(block):
                raise BenchError("the renderer emitted no queue policy for slo.overload: shed; "
                                 "pass --policy-block approx, or --policy-block with the fields")
        elif has_queue_policy(block):
            notes.append("overload: queue rendered a queue policy; run as rendered")
        blocks[policy] = (checked_block(block), source)
    plan = plans[policies[0]]
    if any(p.config != plan.config or p.qps_per_gpu != plan.qps_per_gpu for p in plans.values()):
        raise BenchError("the plans with overload: shed and queue differ: the comparison would not be one plan")
    sustainable = plan.qps_per_gpu * plan.inputs.gpus_per_replica

    install = triton.ensure_installed()
    work = triton.scratch_dir("rankops-overload-")
    print(f"stand-in: t(b) = {args.a_ms:g} + {args.b_ms:g}·b ms, slowdown {args.slowdown:g} per other instance; "
          f"budget P99 {args.budget:g} ms")
    print(f"plan: {plan.explanation[0]}")
    print(f"one replica sustains {sustainable:.1f} req/s (qpsPerGpu x {plan.inputs.gpus_per_replica} GPU); "
          f"points at {', '.join(f'{x:g}x' for x in fractions)}; {args.warmup:g} s warm-up + {args.seconds:g} s "
          f"counted per point, drain up to {args.drain:g} s, seed {args.seed}")
    for policy, (block, source) in blocks.items():
        print(f"{policy} ({source}): {' '.join(block.split())}")
    for note in notes:
        print(f"note: {note}")
    parameters = (f"t(b) = {args.a_ms:g} + {args.b_ms:g}·b ms, slowdown {args.slowdown:g}, budget {args.budget:g} ms, "
                  f"plan {plan.config.describe()}, sustainable {sustainable:.1f} req/s, "
                  f"{args.warmup:g}+{args.seconds:g} s per point, seed {args.seed}, "
                  + "; ".join(f"{p}: {s}" for p, (_, s) in blocks.items()))
    sys.stdout.flush()

    points = []
    for policy in policies:
        for fraction in fractions:
            point = run_point(install, work, policy, fraction, sustainable, plan, blocks[policy][0], args)
            points.append(point)
            print(f"  {policy} {fraction:g}x done: P99 served {_fmt(point.p99_ms)} ms, "
                  f"within {point.within_share:.1%}, shed {point.shed_ratio:.1%} "
                  f"({time.perf_counter() - began:.0f} s)", flush=True)
    print()
    print_table(points, args.budget)
    print(f"parameters: {parameters}")
    verdict = goal(points, args.budget)
    for line in verdict:
        print(line)
    print(f"total {time.perf_counter() - began:.0f} s")
    if args.json:
        doc = {"parameters": {k: getattr(args, k) for k in ("budget", "a_ms", "b_ms", "slowdown", "seconds",
                                                             "warmup", "drain", "seed")},
               "fractions": fractions, "sustainableQps": sustainable, "plan": plan.to_status(),
               "blocks": {p: {"source": s, "text": b} for p, (b, s) in blocks.items()},
               "notes": notes, "points": [asdict(p) for p in points], "goal": verdict}
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


def without_policy(block: str) -> str:
    """`block` without its queue policy and priority fields (a --policy-block replaces the renderer's)."""
    block = re.sub(r"\n?[ \t]*(priority_levels|default_priority_level)\s*:\s*\d+", "", block)
    for name in ("default_queue_policy", "priority_queue_policy"):
        while (found := re.search(rf"\n?\s*{name}\s*\{{", block)) is not None:
            depth = 0
            for at in range(found.end() - 1, len(block)):
                depth += {"{": 1, "}": -1}.get(block[at], 0)
                if depth == 0:
                    block = block[:found.start()] + block[at + 1:]
                    break
            else:
                raise BenchError(f"{name} in the rendered block is not closed")
    return block


if __name__ == "__main__":
    sys.exit(main())
