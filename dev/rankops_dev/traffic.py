"""A bounded traffic driver for the local cluster: ranking requests spread round robin over the
Ready pods behind a model's serving Service.

The pods run on real nodes (real_cluster.py), whose pod network exists only inside the cluster's
network namespace: the driver's thread enters that namespace (`netns`) first and sends to the pod
addresses there, a namespace with no route out (the workplace allows test traffic to loopback and
to such namespaces alone). On kind (`netns` None) the driver sends from this machine, which
e2e/kind/setup.sh routes to the pod ranges through the nodes. Every run is bounded in requests and seconds and may be paced at a
rate; every request is counted, by pod: the e2e tests' production-like traffic and `rankops dev
traffic` (the demo's canary needs traffic to be judged on).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rankops_dev import netns as namespaces

MAX_RATE = 500.0           # requests per second, at most
MAX_SECONDS = 3600.0
REFRESH_S = 0.5            # how often the Ready pods are listed again


class Answer(NamedTuple):
    address: str
    sent_at: float     # time.time() when sent
    ms: float


def serving_addresses(k8s_core: Any, namespace: str, model: str) -> list[str]:
    """The pod IPs behind the model's serving Service (Ready, taking traffic, not going)."""
    from rankops.render import names

    pods = k8s_core.list_namespaced_pod(
        namespace, label_selector=f"{names.LABEL_MODEL}={model},{names.LABEL_TRAFFIC}=on").items
    return sorted(p.status.pod_ip for p in pods if p.status.pod_ip
                  and p.metadata.deletion_timestamp is None
                  and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))


class Traffic(threading.Thread):
    """Requests from `make_sample(rng)` to `model` on the addresses `addresses()` lists (port
    8000), sent from inside the network namespace `netns` (None: from here), round robin, until `stop` is set, `max_requests` were sent or `max_seconds` passed;
    `rate`: requests per second (None: one after another, as fast as they are answered)."""

    def __init__(self, addresses: Callable[[], Sequence[str]], model: str, make_sample: Callable[[Any], Any], *,
                 rate: float | None = None, max_requests: int = 1_000_000, max_seconds: float = 900.0,
                 netns: str | None, timeout_s: float = 5.0, seed: int = 5, port: int = 8000) -> None:
        super().__init__(daemon=True, name=f"traffic-{model}")
        if rate is not None and not 0 < rate <= MAX_RATE:
            raise ValueError(f"rate must be in (0, {MAX_RATE:g}] requests/s, got {rate}")
        if not 0 < max_seconds <= MAX_SECONDS:
            raise ValueError(f"max_seconds must be in (0, {MAX_SECONDS:g}], got {max_seconds}")
        self.addresses, self.model, self.make_sample = addresses, model, make_sample
        self.rate, self.max_requests, self.max_seconds, self.timeout_s, self.seed = \
            rate, max_requests, max_seconds, timeout_s, seed
        self.netns, self.port = netns, port      # port: a shared server member's own port
        self.stop = threading.Event()
        self.sent = self.failed = 0
        self.served: list[Answer] = []
        self.failures: list[tuple[str, float, str]] = []   # (address, time, error)

    def by_pod(self) -> Counter:
        return Counter(a.address for a in self.served)

    def run(self) -> None:
        import numpy as np

        from rankops.triton.client import Endpoint, GateClientError

        if self.netns:   # None: this machine routes to the pods (kind, e2e/kind/setup.sh)
            namespaces.enter_thread(self.netns)  # this thread only: its sockets are made inside
        rng = np.random.default_rng(self.seed)
        connections: dict[str, tuple[Any, Any]] = {}
        started = time.monotonic()
        listed: list[str] = []
        listed_at = -REFRESH_S
        turn = 0
        try:
            while not self.stop.is_set() and self.sent < self.max_requests \
                    and time.monotonic() - started < self.max_seconds:
                if time.monotonic() - listed_at >= REFRESH_S:
                    listed, listed_at = list(self.addresses()), time.monotonic()
                    for gone in set(connections) - set(listed):
                        connections.pop(gone)[0].close()
                if not listed:
                    self.stop.wait(0.1)
                    continue
                address = listed[turn % len(listed)]
                turn += 1
                if self.rate is not None:   # paced: the n-th request goes out at n / rate
                    self.stop.wait(max(0.0, started + self.sent / self.rate - time.monotonic()))
                self.sent += 1
                at = time.time()
                try:
                    if address not in connections:
                        connection = Endpoint(f"{address}:{self.port}", self.model, timeout_s=self.timeout_s).connect()
                        connections[address] = (connection, connection.model_info())
                    connection, info = connections[address]
                    request = connection.build_request(self.make_sample(rng), info)
                    sent_at = time.perf_counter()
                    connection.infer(request)
                    self.served.append(Answer(address, at, (time.perf_counter() - sent_at) * 1000))
                except (GateClientError, OSError) as exc:
                    self.failed += 1
                    self.failures.append((address, at, str(exc)[:200]))
                    dropped = connections.pop(address, None)
                    if dropped:
                        dropped[0].close()
        finally:
            for connection, _ in connections.values():
                connection.close()
