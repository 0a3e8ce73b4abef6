"""A shared tritonserver's pure pieces (issue 42): its arguments, and what it loads for each member.

One server serves several RankingModels. It starts with no model (explicit model control, no
--load-model) and its members come and go through Triton's repository API, each with its own
config: the config.pbtxt the member would serve alone (render/tritonconfig.py: its batching,
instances, priority levels, queue policy, warm-up), sent as the load's config override, so adding
or removing a member never restarts the pods and never touches another member's config.

Server-wide flags are the union of the members' needs: the response cache is on when a member
asks for it (a member's own config still says whether it uses it), and Triton's exit timeout is the
longest any member asks for, so no member's in-flight requests are cut short on a drain.
"""
from __future__ import annotations

from collections.abc import Sequence

from rankops.api.rankingmodel import RankingModelSpec
from rankops.render.serving import triton_arguments
from rankops.render.tritonconfig import ServingShape, render_config_pbtxt, triton_version


def server_arguments(members: Sequence[RankingModelSpec]) -> list[str]:
    """tritonserver's arguments for a server holding `members` (none loaded at start)."""
    if not members:
        raise ValueError("a shared server needs at least one member")
    return [*triton_arguments((), max(m.disruption.exit_timeout_seconds for m in members),
                              any(m.response_cache for m in members)),
            # Strict readiness (Triton's default) answers /v2/health/ready 400 while any model it was
            # asked to load is not READY: one member whose load failed would take every member's pods
            # out of their Services (measured: tests/triton/test_shared_server_on_triton.py). The pod is
            # ready when the server is; a member's own readiness is /v2/models/<m>/ready.
            "--strict-readiness=false",
            # A gRPC request names its model inside a protobuf message: no per-member port can route it
            # (triton/route.py), so a shared server serves HTTP only.
            "--allow-grpc=false"]


def member_config(name: str, namespace: str, spec: RankingModelSpec, version_name: str,
                  shape: ServingShape) -> tuple[int, str]:
    """(Triton version, config.pbtxt) that member `name` is loaded with at `version_name`: the config it
    would serve alone; the load sends it as the override (triton.repository.config_json)."""
    version = spec.version_named(version_name)
    if version is None:
        raise ValueError(f"version {version_name!r} is not in {name}'s spec.versions")
    return triton_version(version.name), render_config_pbtxt(name, namespace, spec, version, shape)
