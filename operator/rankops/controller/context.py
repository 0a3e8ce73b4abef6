"""The operator's settings: `rankops run` builds one from its flags and hands it to the controllers
(controller/runtime.py) and, in kopf's memo, to the handlers."""
from __future__ import annotations

from dataclasses import dataclass, field

from rankops.controller.kube import Kube
from rankops.render.policy import TenantPolicy
from rankops.validator.daemonset import DEFAULT_PRIORITY_CLASS, DEFAULT_SERVICE_ACCOUNT


@dataclass
class OperatorContext:
    kube: Kube | None = None
    client_library: bool = False                    # credentials via the kubernetes package (exec, auth-provider)
    namespace: str = "rankops-system"               # where validator DaemonSets run
    namespaces: list[str] = field(default_factory=list)   # the namespaces watched (empty: every one)
    validator_service_account: str = DEFAULT_SERVICE_ACCOUNT
    validator_image: str | None = None              # overrides the pools' validator image
    validator_priority_class: str = DEFAULT_PRIORITY_CLASS   # "" for none
    interval: float = 10.0                          # seconds between re-checks of an unsettled model
    resync: float = 600.0                           # seconds between re-checks of every model
    workers: int = 16                               # reconciles at once, per pool (kopf's, watch events')
    kopf_connections: int = 0                       # kopf's HTTP connections at most (0: no bound)
    service_monitors: bool = False                  # a ServiceMonitor per RankingModel, where served
    service_monitor_labels: dict[str, str] = field(default_factory=dict)  # what Prometheus selects by
    tenant_policy: TenantPolicy = field(default_factory=TenantPolicy)   # file:// dirs, image prefixes allowed
    image_pull_secrets: list[str] = field(default_factory=list)  # on every operand pod (validators, models, gates)
    pod_metrics_networks: list[str] = field(default_factory=list)  # pod IPs the canary analysis reads (empty: all)

