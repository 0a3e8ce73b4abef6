"""`rankops render` (the objects the operator would apply, offline) and `rankops crds`."""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from rankops.api import crdgen
from rankops.api.errors import describe
from rankops.commands.output import add_output_flag, format_objects


class InputError(Exception):
    """A manifest that cannot be rendered; the message names the document and field."""


def load_documents(paths: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in paths:
        text = sys.stdin.read() if path == "-" else pathlib.Path(path).read_text()
        try:
            for i, doc in enumerate(yaml.safe_load_all(text)):
                if doc is None:
                    continue
                if not isinstance(doc, dict):
                    raise InputError(f"{path}: document {i + 1} is not a mapping")
                docs.append((f"{path}#{i + 1}", doc))
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not valid YAML: {exc}") from exc
    return docs


def label_arg(text: str) -> tuple[str, str]:
    """KEY=VALUE of a `--service-monitor-label` flag."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def add_service_monitor_flags(p: argparse.ArgumentParser, env: bool = False) -> None:
    """The flags `rankops run` and `rankops render` share; `env`: default from RANKOPS_* variables."""
    on = env and os.environ.get("RANKOPS_SERVICE_MONITORS", "").lower() in ("1", "true", "yes", "on")
    p.add_argument("--service-monitors", action="store_true", default=on,
                   help="also a Prometheus Operator ServiceMonitor per RankingModel, scraping Triton's "
                        "metrics port (8002); skipped where monitoring.coreos.com/v1 is not served"
                        + (" (env RANKOPS_SERVICE_MONITORS=true)" if env else ""))
    p.add_argument("--service-monitor-label", type=label_arg, action="append", default=[], metavar="KEY=VALUE",
                   help="label on those ServiceMonitors, e.g. release=kube-prometheus-stack (repeatable)")


def add_tenant_policy_flags(p: argparse.ArgumentParser) -> None:
    """What a RankingModel (a tenant's) may use: the flags `rankops run` and `rankops render` share."""
    from rankops.render.policy import (FLAG_FETCHER_IMAGE, FLAG_FILE_DIR, FLAG_GATES_IMAGE, FLAG_IMAGE_PREFIX,
                                       FLAG_PLATFORM_UIDS)

    p.add_argument(FLAG_FILE_DIR, action="append", default=[], metavar="DIR",
                   help="a host directory file:// modelUris may mount (hostPath), e.g. /srv/models "
                        "(repeatable; none: file:// is refused; /, /etc, /var, /usr and other system trees never)")
    p.add_argument(FLAG_IMAGE_PREFIX, action="append", default=[], metavar="PREFIX",
                   help="a registry or repository prefix the images of RankingModels must start with, e.g. "
                        "nvcr.io/nvidia/ (repeatable; none: any image)")
    p.add_argument(FLAG_PLATFORM_UIDS, action="store_true",
                   help="the platform assigns each pod's UID and fsGroup (OpenShift's restricted-v2 SCC): Triton "
                        "pods set none (default: the triton-server user 1000, which restricted-v2 refuses)")
    p.add_argument(FLAG_FETCHER_IMAGE, default=os.environ.get("RANKOPS_FETCHER_IMAGE") or None, metavar="IMAGE",
                   help="the image of every model's fetch-model and warm containers, instead of spec.fetcherImage "
                        "(pin it by digest: repo@sha256:...; env RANKOPS_FETCHER_IMAGE)")
    p.add_argument(FLAG_GATES_IMAGE, default=os.environ.get("RANKOPS_GATES_IMAGE") or None, metavar="IMAGE",
                   help="the image of every model's gate Jobs, instead of spec.rollout.gateJobs.image (pin it by "
                        "digest; env RANKOPS_GATES_IMAGE)")


def add_pull_secret_flag(p: argparse.ArgumentParser, env: bool = False) -> None:
    """The image pull secrets every operand pod gets (the chart's imagePullSecrets)."""
    default = [n for n in os.environ.get("RANKOPS_IMAGE_PULL_SECRETS", "").split(",") if n.strip()] if env else []
    p.add_argument("--image-pull-secret", action="append", default=default, metavar="NAME",
                   help="a Secret every validator, model and gate pod pulls images with (repeatable; model "
                        "namespaces need a Secret of that name)"
                        + (" (env RANKOPS_IMAGE_PULL_SECRETS=a,b)" if env else ""))


def tenant_policy(args: argparse.Namespace):
    """The TenantPolicy of the flags above; PolicyError (a ValueError) names a bad one."""
    from rankops.render.policy import TenantPolicy

    return TenantPolicy.from_settings(args.allow_file_uri_dir, args.allow_image_prefix,
                                      getattr(args, "platform_assigns_uids", False),
                                      getattr(args, "fetcher_image", None), getattr(args, "gates_image", None),
                                      getattr(args, "operator_namespace", None) or "rankops-system")


def render_documents(docs: list[tuple[str, dict[str, Any]]],
                     service_monitor_labels: dict[str, str] | None = None, policy: Any = None,
                     pull_secrets: list[str] | None = None, gate_jobs: bool = False) -> list[dict[str, Any]]:
    """Everything the operator would apply for these resources, with no cluster: each
    RankingModel's plan as new (rankops.modelplan.as_new, the operator's own plan with nothing
    observed), and each GpuNodePool's (rankops.poolplan.as_new: its validator DaemonSet).

    `service_monitor_labels`: not None adds each RankingModel's ServiceMonitor, with these labels
    (what `rankops run --service-monitors` applies where the Prometheus Operator is installed).
    `policy`: the TenantPolicy the operator would run with (default: no file://, any image).
    `pull_secrets`: the operator's --image-pull-secret names, on every pod template.
    `gate_jobs`: also each RankingModel's gate Jobs, as a rollout to its spec.version creates them
    (modelplan.rollout_gate_jobs); a model as new runs none, so they are left out by default.
    """
    from rankops import modelplan, poolplan
    from rankops.api.conditions import DEGRADED, get_condition
    from rankops.api.gpunodepool import GpuNodePool
    from rankops.api.rankingmodel import RankingModel
    from rankops.render.desired import RenderError
    from rankops.render.policy import TenantPolicy

    from rankops.api.sharedserver import SharedServer

    settings = modelplan.Settings(policy or TenantPolicy(), tuple(pull_secrets or ()), service_monitor_labels)
    pools = {}
    errors: list[str] = []
    parsed = []
    for where, doc in docs:
        kind = doc.get("kind")
        model = {"RankingModel": RankingModel, "GpuNodePool": GpuNodePool, "SharedServer": SharedServer}.get(kind)
        if model is None:
            errors.append(f"{where}: kind {kind!r} is not a rankops resource (RankingModel, GpuNodePool or "
                          "SharedServer)")
            continue
        try:
            obj = model.model_validate(doc)
        except ValidationError as exc:
            name = (doc.get("metadata") or {}).get("name", "?")
            errors += [f"{where} {kind} {name}: {line}" for line in describe(exc)]
            continue
        parsed.append((where, doc, obj))
        if kind == "GpuNodePool":
            pools[obj.metadata.get("name")] = obj
    servers = {(obj.metadata.get("namespace") or "default", obj.name) for _, _, obj in parsed if obj.kind == "SharedServer"}
    out: list[dict[str, Any]] = []
    for where, doc, obj in parsed:
        if obj.kind == "GpuNodePool":
            # The chart's names for the release `rankops` in rankops-system (poolplan.PoolSettings).
            out += poolplan.as_new(doc, poolplan.PoolSettings(pull_secrets=settings.pull_secrets)).applies
            continue
        if obj.kind == "SharedServer":
            out += _server_as_new(obj, [m for _, _, m in parsed if m.kind == "RankingModel"], pools, settings,
                                  errors, where)
            continue
        name = obj.metadata.get("name")
        if obj.spec.server and ((obj.metadata.get("namespace") or "default"), obj.spec.server) in servers:
            continue          # its server's objects say it (above)
        body = {**doc, "metadata": {"namespace": "default", **(doc.get("metadata") or {})}}
        pool = pools.get(obj.spec.node_pool)
        done = modelplan.as_new(body, settings, pool.spec.requirements if pool else None)
        degraded = get_condition(done.status.conditions, DEGRADED)
        if done.not_applied:   # as the operator refuses it
            errors.append(f"{where} RankingModel {name}: {degraded.reason}: {degraded.message}")
            continue
        if degraded is not None and degraded.status == "True":   # served as asked, but the operator will report it
            print(f"rankops render: warning: {where} RankingModel {name}: {degraded.reason}: "
                  f"{degraded.message}", file=sys.stderr)
        out += done.objects()
        if gate_jobs:
            try:
                out += modelplan.rollout_gate_jobs(body, settings)
            except RenderError as exc:
                errors.append(f"{where} RankingModel {name}: gate Jobs: {exc}")
    if errors:
        raise InputError("\n".join(errors))
    return out


def _server_as_new(server: Any, models: list[Any], pools: dict[str, Any], settings: Any, errors: list[str],
                   where: str) -> list[dict[str, Any]]:
    """A SharedServer's objects with the members given beside it (in their order) and no pod yet:
    what the operator applies first (serverplan.plan_server); a member it refuses is said."""
    from rankops import serverplan
    from rankops.render import serving

    namespace = server.metadata.get("namespace") or "default"
    members = [serverplan.MemberView(m.metadata["name"], m.spec) for m in models
               if m.spec.server == server.name and (m.metadata.get("namespace") or "default") == namespace]
    pool = pools.get(server.spec.node_pool)
    placement = serving.pool_placement(server.spec.node_pool, pool.spec.requirements if pool else None,
                                       server.spec.triton_image)
    plan = serverplan.plan_server(server.name, namespace, server.spec, members, [], {}, placement, settings.policy)
    for member in plan.members:
        if member.state in (serverplan.REFUSED, serverplan.PENDING):
            errors.append(f"{where} SharedServer {server.name}: member {member.name}: {member.reason}: {member.message}")
    return list(plan.objects)


def cmd_render(args: argparse.Namespace) -> int:
    try:
        labels = dict(args.service_monitor_label) if args.service_monitors else None
        objects = render_documents(load_documents(args.filename), labels, tenant_policy(args),
                                   args.image_pull_secret, gate_jobs=args.gate_jobs)
    except (InputError, OSError, ValueError) as exc:
        print(f"rankops render: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(format_objects(objects, args.output))
    return 0


def cmd_crds(args: argparse.Namespace) -> int:
    files = crdgen.crd_files()
    if args.write:
        if args.output != "yaml":
            print("rankops crds: --write writes YAML files; drop -o json", file=sys.stderr)
            return 2
        target = pathlib.Path(args.write)
        target.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (target / name).write_text(text)
            print(f"wrote {target / name}", file=sys.stderr)
        return 0
    if args.output == "json":
        docs = [d for text in files.values() for d in yaml.safe_load_all(text) if d]
        sys.stdout.write(format_objects(docs, "json"))
        return 0
    sys.stdout.write("---\n".join(files.values()))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="print the objects the operator would apply (no cluster needed)")
    p.add_argument("-f", "--filename", action="append", required=True,
                   help="RankingModel / GpuNodePool / SharedServer manifest (repeatable; - for stdin)")
    add_service_monitor_flags(p)
    add_tenant_policy_flags(p)
    add_pull_secret_flag(p)
    p.add_argument("--gate-jobs", action="store_true",
                   help="also print each RankingModel's gate Jobs (warmup, equivalence) as a rollout to its "
                        "spec.version creates them: for review and linting, not to apply (a model as new runs none)")
    add_output_flag(p, ("yaml", "json"), "yaml")
    p.set_defaults(func=cmd_render)
    p = sub.add_parser("crds", help="print the CustomResourceDefinitions (generated from the API models)")
    p.add_argument("--write", metavar="DIR", help="write one file per CRD into DIR instead")
    add_output_flag(p, ("yaml", "json"), "yaml")
    p.set_defaults(func=cmd_crds)
