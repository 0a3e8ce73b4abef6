"""`rankops gate warmup` and `rankops gate equivalence`: the programs the rollout's gate Jobs run.

Each prints a JSON verdict, writes it to --verdict-file (default the termination-message path
when it exists) and exits 0 pass, 1 fail, 2 could not judge. Every failure, including a bad
command line, ends in a verdict and a message, never a traceback.
"""
from __future__ import annotations

import argparse
import sys

from rankops.triton.client import GATE_PRIORITY, Endpoint, check_priority, normalize_url, parse_model_ref
from rankops.gates.equivalence import METHODS, Criteria, run_equivalence
from rankops.triton.samples import (Sample, SamplesError, generate_samples, load_samples,
                                   parse_batch_sizes, parse_input_spec)
from rankops.gates.verdict import Verdict, default_verdict_file, error_verdict, write_verdict
from rankops.gates.warmup import JUDGED_ON, WarmupConfig, run_warmup


class _GateParser(argparse.ArgumentParser):
    """A bad command line still leaves a verdict, so the operator can say what was wrong."""

    gate_name = "gate"

    def error(self, message: str):  # type: ignore[override]
        verdict = error_verdict(self.gate_name, "BadArguments", f"{self.prog}: {message}")
        self.print_usage(sys.stderr)
        write_verdict(verdict, _verdict_file_from_argv() or default_verdict_file())
        self.exit(2)


def _verdict_file_from_argv() -> str | None:
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg == "--verdict-file" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--verdict-file="):
            return arg.split("=", 1)[1]
    return None


def add_commands(subparsers) -> None:
    gate = subparsers.add_parser("gate", help="run a rollout gate (warmup, equivalence) and report a verdict",
                                 description=__doc__.splitlines()[0])
    gates = gate.add_subparsers(dest="gate", required=True, metavar="GATE", parser_class=_GateParser)

    warmup = gates.add_parser("warmup", help="replay requests until warm; pass if none fails and P99 is within bound",
                              description="Replay requests against the candidate until it is warm, then "
                                          "measure warm P99 per batch size.")
    warmup.gate_name = "warmup"
    warmup.add_argument("--url", required=True, help="candidate server HOST:PORT (HTTP, KServe v2)")
    warmup.add_argument("--model", required=True, help="model NAME or NAME:VERSION")
    warmup.add_argument("--model-version", default="", help="model version (instead of NAME:VERSION)")
    _add_samples_args(warmup)
    warmup.add_argument("--requests", type=int, default=2000, help="warm requests to replay (default 2000)")
    warmup.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    warmup.add_argument("--max-p99-ms", type=float, required=True, help="bound on the warm P99 latency")
    warmup.add_argument("--cold-passes", type=int, default=1,
                        help="untimed passes over the samples before measuring (default 1)")
    warmup.add_argument("--max-errors", type=int, default=10,
                        help="stop sending after this many failed requests (default 10)")
    warmup.add_argument("--metrics-url", default="", metavar="HOST:PORT",
                        help="the candidate's Triton metrics endpoint (port 8002): report what Triton saw "
                             "(batch sizes, queue time, cache hits) and judge on its server-side P99")
    warmup.add_argument("--window-wait-s", type=float, default=70.0,
                        help="with --metrics-url: wait up to this long before the warm run for Triton's "
                             "60 s latency window to drop load-time and cold requests (default 70)")
    warmup.add_argument("--judge-on", choices=JUDGED_ON, default="server",
                        help="whose P99 is judged: Triton's (server, after its latency window clears; the "
                             "default) or the gate's own (client, at once; Triton's numbers are still reported)")
    warmup.add_argument("--processes", type=int, default=0,
                        help="worker processes sending the requests (default 0: one per core)")
    warmup.add_argument("--unique-requests", action="store_true",
                        help="different data in every request, so a response cache cannot answer them")
    _add_common_args(warmup)
    warmup.set_defaults(func=_guarded("warmup", _warmup))

    equivalence = gates.add_parser(
        "equivalence", help="compare candidate outputs with the reference: scores and ranking agreement",
        description="Send the same requests to the reference and the candidate; compare scores "
                    "(|c - r| <= abs + rel*|r|) and ranking agreement (top-K overlap, rank correlation).")
    equivalence.gate_name = "equivalence"
    equivalence.add_argument("--reference-url", help="reference server HOST:PORT (the stable version)")
    equivalence.add_argument("--reference-model", help="reference model NAME or NAME:VERSION")
    equivalence.add_argument("--reference-torchscript", metavar="FILE",
                             help="the original TorchScript model, run here with torch (instead of a server)")
    equivalence.add_argument("--candidate-url", required=True, help="candidate server HOST:PORT")
    equivalence.add_argument("--candidate-model", required=True, help="candidate model NAME or NAME:VERSION")
    _add_samples_args(equivalence)
    equivalence.add_argument("--output", help="the score output whose entries are ranked (default the first)")
    equivalence.add_argument("--abs-tolerance", type=float, required=True,
                             help="absolute score tolerance: a score passes when |c - r| <= abs + rel*|r|")
    equivalence.add_argument("--rel-tolerance", type=float, required=True,
                             help="relative score tolerance, times |r| (see --abs-tolerance)")
    equivalence.add_argument("--top-k", type=int, required=True,
                             help="K of the top-K overlap: how many of the best-ranked entries must agree")
    equivalence.add_argument("--min-topk-overlap", type=float, required=True, help="average over lists, 0..1")
    equivalence.add_argument("--min-rank-correlation", type=float, required=True, help="average over lists, -1..1")
    equivalence.add_argument("--rank-correlation-method", choices=METHODS, default="kendall",
                             help="Kendall tau-b (default) or Spearman rho, per ranked list")
    _add_common_args(equivalence)
    equivalence.set_defaults(func=_guarded("equivalence", _equivalence))


def _add_samples_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("samples (recorded, or generated from the input spec)")
    source = group.add_mutually_exclusive_group(required=True)
    source.add_argument("--samples", metavar="FILE", help="JSON Lines: {\"inputs\": {\"<name>\": <nested list>}}")
    source.add_argument("--generate-samples", type=int, metavar="N", help="generate N random requests")
    group.add_argument("--inputs-spec", metavar="JSON",
                       help="with --generate-samples: the RankingModel inputs [{name, dataType, dims, maxDims}] "
                            "as JSON, or @FILE")
    group.add_argument("--batch-sizes", default="1", metavar="1,4,8",
                       help="with --generate-samples: batch sizes to cycle through; 0 = no batch dimension")
    group.add_argument("--int-high", type=int, default=10,
                       help="with --generate-samples: integers are drawn from [0, INT_HIGH) (default 10)")
    group.add_argument("--seed", type=int, default=0, help="with --generate-samples: random seed")


def _add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-binary-data", dest="binary_data", action="store_false",
                        help="plain JSON tensors, for v2 servers without Triton's binary extension")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="per-request network timeout")
    parser.add_argument("--priority", type=int, default=GATE_PRIORITY, help=PRIORITY_HELP)
    parser.add_argument("--reach-within-s", type=float, default=60.0,
                        help="how long a server that does not answer yet is waited for before the gate reports "
                             "ServerUnreachable (a Service lists a pod a moment after it turns Ready); default 60")
    parser.add_argument("--verdict-file", metavar="PATH",
                        help="where to write the verdict (default /dev/termination-log when it exists)")


PRIORITY_HELP = (f"Triton request priority (1 the highest; default {GATE_PRIORITY}: below live traffic's level 1 "
                 "in the rendered config, so the gate never delays a production request; a level above the "
                 "model's priority_levels counts as its default level); 0 sends none")


def _guarded(gate: str, run):
    """Any failure becomes a could-not-judge verdict with a message, never a traceback."""

    def func(args: argparse.Namespace) -> int:
        try:
            verdict = run(args)
        except (SamplesError, ValueError) as exc:
            verdict = error_verdict(gate, "BadArguments" if not isinstance(exc, SamplesError) else "BadSamples",
                                    str(exc))
        except Exception as exc:  # the last line of defence: report, don't crash
            verdict = error_verdict(gate, "InternalError", f"{type(exc).__name__}: {exc}")
        return write_verdict(verdict, args.verdict_file or default_verdict_file())

    return func


def _samples(args: argparse.Namespace) -> list[Sample]:
    if args.samples:
        return load_samples(args.samples)
    if not args.inputs_spec:
        raise SamplesError("--generate-samples needs --inputs-spec (the RankingModel's inputs as JSON)")
    spec_text = args.inputs_spec
    if spec_text.startswith("@"):
        try:
            with open(spec_text[1:], encoding="utf-8") as fh:
                spec_text = fh.read()
        except OSError as exc:
            raise SamplesError(f"cannot read --inputs-spec file {spec_text[1:]}: {exc.strerror}") from None
    specs = parse_input_spec(spec_text)
    return generate_samples(specs, args.generate_samples, parse_batch_sizes(args.batch_sizes),
                            seed=args.seed, int_high=args.int_high)


def _endpoint(url: str, model_ref: str, args: argparse.Namespace, version: str = "") -> Endpoint:
    name, ref_version = parse_model_ref(model_ref)
    if version and ref_version and version != ref_version:
        raise ValueError(f"model {model_ref!r} names version {ref_version} but --model-version is {version}; "
                         "give the version once")
    if args.timeout_s <= 0:
        raise ValueError(f"--timeout-s must be positive, got {args.timeout_s}")
    if args.reach_within_s < 0:
        raise ValueError(f"--reach-within-s must be 0 or more, got {args.reach_within_s}")
    return Endpoint(url=normalize_url(url), model=name, version=version or ref_version,
                    binary_data=args.binary_data, timeout_s=args.timeout_s, reach_within_s=args.reach_within_s,
                    priority=check_priority(args.priority))


def _warmup(args: argparse.Namespace) -> Verdict:
    endpoint = _endpoint(args.url, args.model, args, version=args.model_version)
    config = WarmupConfig(requests=args.requests, concurrency=args.concurrency, max_p99_ms=args.max_p99_ms,
                          cold_passes=args.cold_passes, max_errors=args.max_errors, processes=args.processes,
                          unique=args.unique_requests, metrics_url=args.metrics_url.strip(),
                          window_wait_s=args.window_wait_s, judge_on=args.judge_on)
    return run_warmup(endpoint, _samples(args), config)


def _equivalence(args: argparse.Namespace) -> Verdict:
    reference = None
    if args.reference_url or args.reference_model:
        if not (args.reference_url and args.reference_model):
            raise ValueError("--reference-url and --reference-model go together")
        if args.reference_torchscript:
            raise ValueError("give --reference-url/--reference-model or --reference-torchscript, not both")
        reference = _endpoint(args.reference_url, args.reference_model, args)
    elif not args.reference_torchscript:
        raise ValueError("no reference: give --reference-url and --reference-model (the stable version), "
                         "or --reference-torchscript FILE (the original model)")
    candidate = _endpoint(args.candidate_url, args.candidate_model, args)
    criteria = Criteria(abs_tolerance=args.abs_tolerance, rel_tolerance=args.rel_tolerance, top_k=args.top_k,
                        min_topk_overlap=args.min_topk_overlap, min_rank_correlation=args.min_rank_correlation,
                        method=args.rank_correlation_method)
    return run_equivalence(_samples(args), candidate, criteria, reference=reference,
                           reference_torchscript=args.reference_torchscript, output=args.output)
