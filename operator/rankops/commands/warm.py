"""`rankops warm`: the command line of the container that warms its pod's Triton (gates/warm.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from rankops.triton.client import GATE_PRIORITY, Endpoint, check_priority
from rankops.triton.samples import (Sample, SamplesError, generate_samples, load_samples, parse_batch_sizes,
                                   parse_input_spec)
from rankops.gates.verdict import default_verdict_file
from rankops.gates.warm import (WARM, WarmConfig, Warmer, WarmState, host_port, now, serve_readiness,
                                termination_message)

DEFAULT_PORT = 8090


def add_commands(subparsers) -> None:
    warm = subparsers.add_parser(
        "warm", help="warm the pod's Triton before it takes traffic; serve readiness once warm",
        description="Wait for Triton on --host, replay requests until a round's P99 is within --max-p99-ms "
                    "(or --deadline-s passes), then answer 200 on GET /ready; warm again after a Triton restart.")
    warm.add_argument("--host", default="127.0.0.1", help="the pod's address: Triton's, and where /ready listens")
    warm.add_argument("--http-port", type=int, default=8000, help="Triton's HTTP port (default 8000)")
    warm.add_argument("--metrics-port", type=int, default=8002,
                      help="Triton's metrics port, for its own averages per round; 0: none (default 8002)")
    warm.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"readiness port (default {DEFAULT_PORT})")
    warm.add_argument("--model", required=True, help="the model Triton serves")
    warm.add_argument("--requests", type=int, default=200, help="warm requests per round (default 200)")
    warm.add_argument("--concurrency", type=int, default=2, help="requests in flight (default 2)")
    warm.add_argument("--max-p99-ms", type=float, required=True, help="a round within this client P99 is warm")
    warm.add_argument("--deadline-s", type=float, default=300.0,
                      help="not warm after this long: ready anyway, said in the log (default 300); "
                           "never when the last round failed more than --max-error-ratio")
    warm.add_argument("--max-error-ratio", type=float, default=0.01,
                      help="3 rounds in a row failing more than this share of their requests: exit 1, the "
                           "reason in the termination message, the pod stays un-Ready (default 0.01)")
    warm.add_argument("--termination-file", default=None,
                      help="where the failure is written (default /dev/termination-log when it exists)")
    warm.add_argument("--samples", metavar="FILE", help="recorded JSON Lines requests; when the file is missing, "
                                                        "the generated ones are sent (and the log says so)")
    warm.add_argument("--generate-samples", type=int, default=0, metavar="N", help="generate N random requests")
    warm.add_argument("--inputs-spec", metavar="JSON", help="the RankingModel inputs, for --generate-samples")
    warm.add_argument("--batch-sizes", default="1", metavar="1,4,8", help="batch sizes of the generated requests")
    warm.add_argument("--int-high", type=int, default=10, help="generated integers are drawn from [0, INT_HIGH)")
    warm.add_argument("--unique-requests", action="store_true",
                      help="different data in every request, so a response cache cannot answer them")
    warm.add_argument("--no-binary-data", dest="binary_data", action="store_false",
                      help="plain JSON tensors, for v2 servers without Triton's binary extension")
    warm.add_argument("--request-timeout-s", type=float, default=30.0, help="per-request network timeout")
    warm.add_argument("--priority", type=int, default=GATE_PRIORITY,
                      help=f"Triton request priority (1 the highest; default {GATE_PRIORITY}: below live traffic's "
                           "level 1 in the rendered config); 0 sends none")
    warm.set_defaults(func=_warm)


def _emit(record: dict) -> None:
    print(json.dumps(record, sort_keys=False), flush=True)


def read_samples(args: argparse.Namespace) -> tuple[list[Sample], str]:
    """The recorded samples when their file is there, else generated ones; and where they came from."""
    if args.samples and os.path.exists(args.samples):
        return load_samples(args.samples), args.samples
    if not (args.generate_samples and args.inputs_spec):
        if args.samples:
            raise SamplesError(f"the samples file {args.samples} is missing and there is nothing to generate "
                               "(--generate-samples N --inputs-spec JSON)")
        raise SamplesError("give --samples FILE or --generate-samples N with --inputs-spec JSON")
    samples = generate_samples(parse_input_spec(args.inputs_spec), args.generate_samples,
                               parse_batch_sizes(args.batch_sizes), int_high=args.int_high)
    missing = f" ({args.samples} missing)" if args.samples else ""
    return samples, f"generated{missing}"


def _warm(args: argparse.Namespace) -> int:
    state = WarmState()
    # Listening first: the kubelet's probes get an answer (503) from the start.
    server = serve_readiness(args.host.strip("[]"), args.port, state)
    try:
        samples, source = read_samples(args)
    except SamplesError as exc:
        # Nothing to send: warming cannot happen, and must not keep the replica out of service.
        state.set(WARM, {"ready": "notWarmed", "reason": "BadSamples", "message": str(exc)})
        _emit({"at": now(), "event": "warm", **state.summary})
        threading.Event().wait()
        return 0
    metrics = host_port(args.host, args.metrics_port) if args.metrics_port else ""
    config = WarmConfig(requests=args.requests, concurrency=args.concurrency, max_p99_ms=args.max_p99_ms,
                        timeout_s=args.deadline_s, unique=args.unique_requests, metrics_url=metrics,
                        max_error_ratio=args.max_error_ratio)
    problem = _check(config) or _check_priority(args.priority)
    if problem:
        print(f"rankops warm: {problem}", file=sys.stderr)
        server.shutdown()
        return 2
    endpoint = Endpoint(url=host_port(args.host, args.http_port), model=args.model, binary_data=args.binary_data,
                        timeout_s=args.request_timeout_s, priority=args.priority)
    _emit({"at": now(), "event": "start", "samples": len(samples), "source": source, "priority": args.priority,
           "readiness": f"http://{host_port(args.host, args.port)}/ready"})
    failed = Warmer(endpoint, samples, config, state, _emit).run()
    if failed is None:
        return 0
    # The model fails its requests: exit, so the pod stays un-Ready and its status (the termination
    # message, then the kubelet's restart back-off) says why, where the operator reads it.
    path = args.termination_file or default_verdict_file()
    if path:
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(termination_message(failed))
        except OSError as exc:
            print(f"rankops warm: cannot write the termination message to {path}: {exc.strerror}", file=sys.stderr)
    print(f"rankops warm: {failed['reason']}: {failed['message']}", file=sys.stderr)
    server.shutdown()
    return 1


def _check_priority(priority: int) -> str | None:
    try:
        check_priority(priority)
    except ValueError as exc:
        return str(exc)
    return None


def _check(config: WarmConfig) -> str | None:
    from rankops.gates.warmup import check_load

    problem = check_load(config.requests, config.concurrency, config.max_p99_ms)
    if problem:
        return problem
    if config.timeout_s < 0:
        return f"--deadline-s must be 0 or more, got {config.timeout_s}"
    if not 0 <= config.max_error_ratio < 1:
        return f"--max-error-ratio must be in [0, 1), got {config.max_error_ratio}"
    return None
