"""Serve a RankingModel the operator's way on the real-Triton fixture, and send it a request."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rankops.api.rankingmodel import RankingModel
from rankops.devcluster import spec_models, triton
from rankops.devcluster.triton import rendered_serving as rendered  # noqa: F401  (tests import it from here)


@contextlib.contextmanager
def serve(install: triton.TritonInstall, doc: dict[str, Any], workdir: Path, version: str | None = None,
          **export: Any) -> Iterator[tuple[RankingModel, triton.TritonServer]]:
    """The rendered Deployment's tritonserver over a freshly exported model of the spec's shape."""
    rm, server = triton.server_for_model(doc, workdir, version, install=install, **export)
    print(f"{rm.metadata['name']} v{version or rm.spec.version}: CPU edits: {', '.join(server.cpu_edits) or 'none'}")
    with server:
        yield rm, server


def request_inputs(rm: RankingModel, candidates: int = 7, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    return spec_models.request_arrays(rm.spec, candidates, batch, seed)


def infer(server: triton.TritonServer, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import tritonclient.http as httpclient
    from tritonclient.utils import np_to_triton_dtype

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        infer_inputs = []
        for name, array in inputs.items():
            item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array)
            infer_inputs.append(item)
        result = client.infer(model, infer_inputs)
        return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}
    finally:
        client.close()


def expected_output_shapes(rm: RankingModel, inputs: dict[str, np.ndarray], candidates: int) -> dict[str, list[int]]:
    rows = next(iter(inputs.values())).shape[0]
    return {t.name: [rows] + [candidates if d == -1 else d for d in t.dims] for t in rm.spec.outputs}
