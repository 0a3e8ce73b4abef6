"""Serve a RankingModel the operator's way on the real-Triton fixture."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rankops.api.rankingmodel import RankingModel
from rankops_dev import triton


@contextlib.contextmanager
def serve(install: triton.TritonInstall, doc: dict[str, Any], workdir: Path, version: str | None = None,
          **export: Any) -> Iterator[tuple[RankingModel, triton.TritonServer]]:
    """The rendered Deployment's tritonserver over a freshly exported model of the spec's shape."""
    rm, server = triton.server_for_model(doc, workdir, version, install=install, **export)
    print(f"{rm.metadata['name']} v{version or rm.spec.version}: CPU edits: {', '.join(server.cpu_edits) or 'none'}")
    with server:
        yield rm, server


def expected_output_shapes(rm: RankingModel, inputs: dict[str, np.ndarray], candidates: int) -> dict[str, list[int]]:
    rows = next(iter(inputs.values())).shape[0]
    return {t.name: [rows] + [candidates if d == -1 else d for d in t.dims] for t in rm.spec.outputs}
