"""`rankops run`: start the operator (kopf) against the current kubeconfig or in-cluster config."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from rankops.commands.render import (add_pull_secret_flag, add_service_monitor_flags, add_tenant_policy_flags,
                                     tenant_policy)


def cmd_run(args: argparse.Namespace) -> int:
    from rankops.controller import memory
    memory.start()   # before any thread: glibc's heaps bounded, a burst's memory given back
    from rankops.controller import transport

    needs_client = transport.client_library_needed()
    if needs_client is None:
        # kopf imports the whole generated kubernetes client if it can (~865 modules, ~40 MiB
        # resident) only to recognise its model objects in handler arguments, which rankops never
        # passes: the operator's own Transport and kopf's loaders do without it.
        sys.modules.setdefault("kubernetes", None)
    import kopf

    from rankops.controller.context import OperatorContext
    from rankops.controller.kube import Kube

    try:
        policy = tenant_policy(args)
    except ValueError as exc:
        print(f"rankops run: {exc}", file=sys.stderr)
        return 2
    operator = OperatorContext()
    # Reconciles on kopf's workers and on the watch events' own pool at once, each a connection.
    pool_size = 2 * operator.workers + 4
    if needs_client is None:
        try:
            operator.kube = Kube(transport.Transport(transport.login, maxsize=pool_size))
        except (kopf.LoginError, OSError, KeyError, TypeError, ValueError) as exc:
            print(f"rankops run: no Kubernetes credentials: {exc} (set KUBECONFIG or run in a pod)", file=sys.stderr)
            return 2
    else:
        from kubernetes import client, config
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            print(f"rankops run: no Kubernetes credentials: {exc} (set KUBECONFIG or run in a pod)", file=sys.stderr)
            return 2
        settings = client.Configuration.get_default_copy()
        settings.connection_pool_maxsize = pool_size
        operator.kube = Kube(client.ApiClient(settings))
        operator.client_library = True
    operator.namespace = args.operator_namespace
    operator.validator_service_account = args.validator_service_account
    operator.validator_image = args.validator_image
    operator.validator_priority_class = args.validator_priority_class
    operator.interval = args.interval
    operator.resync = args.resync
    operator.service_monitors = args.service_monitors
    operator.service_monitor_labels = dict(args.service_monitor_label)
    operator.tenant_policy = policy
    operator.image_pull_secrets = list(args.image_pull_secret)
    operator.pod_metrics_networks = list(args.pod_metrics_network)
    operator.namespaces = list(args.namespace or [])
    if args.metrics_port:
        from rankops import metrics
        metrics.start_metrics_server(args.metrics_port)
    from rankops.controller import handlers, runtime  # noqa: F401 - registers the handlers with kopf
    from rankops.controller.peering import PauseState

    pause = PauseState()   # standalone (no --peering): never paused
    # The two controllers, built once: the watch caches, queues, clock and plan pool they own start
    # with kopf (handlers.configure), which passes them to every handler in its memo.
    models, pools = runtime.build(operator, pause)

    namespaces = operator.namespaces
    from rankops.controller.session import connection_limit
    operator.kopf_connections = connection_limit(namespaces)
    peering = None
    if args.peering:
        from rankops.controller import peering as peering_mod
        priority = peering_mod.random_priority() if args.priority is None else args.priority
        peering = peering_mod.Peering(args.peering, priority, args.peering_lifetime)
        try:
            peering_mod.ensure_peering_objects(operator.kube, peering.name, namespaces)
        except RuntimeError as exc:
            print(f"rankops run: {exc}", file=sys.stderr)
            return 2
        peering_mod.register(peering, pause)
    kopf.configure(verbose=args.verbose)
    if not args.verbose:
        # kopf says "Handler '...' succeeded." at INFO for every watch event it hands on: at N=1000
        # models, tens of thousands of lines (and ~8% of its event loop) saying nothing. Its
        # warnings and errors (a handler failing) still show; -v shows all.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if needs_client:
        logging.getLogger("rankops").info(
            f"the kubeconfig's user needs an {needs_client} plugin: credentials and requests go through the "
            "kubernetes client library, which costs ~40 MiB more memory than the operator's own transport")
    kopf.run(
        # Without --peering one replica (Recreate): no peering objects, no extra RBAC.
        standalone=peering is None,
        peering_name=peering.name if peering else None,
        priority=peering.priority if peering else None,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        memo=kopf.Memo(operator=operator, models=models, pools=pools),
    )
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the operator")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append",
                       help="watch RankingModels only in this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    p.add_argument("--liveness", default=os.environ.get("RANKOPS_LIVENESS"),
                   help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("RANKOPS_METRICS_PORT", "0")),
                   help="serve Prometheus metrics on this port (0: off)")
    p.add_argument("--operator-namespace", default=os.environ.get("POD_NAMESPACE", "rankops-system"),
                   help="namespace of the operator, where validator DaemonSets run")
    from rankops.validator.daemonset import DEFAULT_PRIORITY_CLASS, DEFAULT_SERVICE_ACCOUNT

    p.add_argument("--validator-service-account",
                   default=os.environ.get("RANKOPS_VALIDATOR_SERVICE_ACCOUNT", DEFAULT_SERVICE_ACCOUNT),
                   help="ServiceAccount the validator DaemonSets run as, in --operator-namespace "
                        f"(env RANKOPS_VALIDATOR_SERVICE_ACCOUNT; default {DEFAULT_SERVICE_ACCOUNT}, the chart's "
                        "for the release `rankops`)")
    p.add_argument("--validator-image", default=os.environ.get("RANKOPS_VALIDATOR_IMAGE"),
                   help="override every pool's validator image")
    p.add_argument("--validator-priority-class",
                   default=os.environ.get("RANKOPS_VALIDATOR_PRIORITY_CLASS", DEFAULT_PRIORITY_CLASS),
                   help="priorityClassName of the validator pods (env RANKOPS_VALIDATOR_PRIORITY_CLASS; default "
                        f"{DEFAULT_PRIORITY_CLASS}; empty: none). See docs/security.md for the platforms that "
                        "admit system-node-critical only in some namespaces")
    p.add_argument("--interval", type=float, default=float(os.environ.get("RANKOPS_INTERVAL", "10")),
                   help="seconds after its last reconcile that a model is re-checked while it depends on what "
                        "only a reading of its pods shows, which no watch reports: not Ready yet (pods placed or "
                        "not), a generation not applied, a canary's analysis or autoscaling (Triton counters). "
                        "Rollout deadlines (gate timeouts, the canary hold's end) are reconciled when due, not "
                        "polled")
    p.add_argument("--resync", type=float, default=float(os.environ.get("RANKOPS_RESYNC", "600")),
                   help="seconds between level-based re-checks of every model (after its last reconcile) and "
                        "pool; changes to a model, its "
                        "children, its pool or profile ConfigMap, and to a pool's nodes, are reconciled as they "
                        "are watched")
    add_service_monitor_flags(p, env=True)
    add_tenant_policy_flags(p)
    add_pull_secret_flag(p, env=True)
    p.add_argument("--pod-metrics-network", action="append", metavar="CIDR",
                   default=[n for n in os.environ.get("RANKOPS_POD_METRICS_NETWORKS", "").split(",") if n],
                   help="during Canary, read Triton's metrics only from pods whose IP is in CIDR (repeatable; "
                        "env RANKOPS_POD_METRICS_NETWORKS, comma-separated; default: every pod)")
    p.add_argument("--peering", default=os.environ.get("RANKOPS_PEERING") or None, metavar="NAME",
                   help="run as one of several replicas: kopf peering object NAME (created if missing), only "
                        "the replica of highest priority acts, the others stand by (env RANKOPS_PEERING; "
                        "default: standalone, a single replica)")
    p.add_argument("--priority", type=int, default=None,
                   help="this replica's peering priority (default: random, so replicas differ; equal "
                        "priorities pause every replica)")
    p.add_argument("--peering-lifetime", type=int, default=int(os.environ.get("RANKOPS_PEERING_LIFETIME", "30")),
                   metavar="SECONDS",
                   help="seconds a replica's keep-alive counts: a killed active replica is replaced this long "
                        "after its last one (one that exits cleanly, at once); env RANKOPS_PEERING_LIFETIME")
    p.add_argument("-v", "--verbose", action="store_true", help="kopf's debug logging")
    p.set_defaults(func=cmd_run)
