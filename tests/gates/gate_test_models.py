"""The ranking models the gate tests serve: embeddings + MLP, and variants of one model.

Imported by conftest only once torch is known to be installed.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

USER_DIM, ITEM_DIM, EMB_DIM, VOCAB = 16, 8, 8, 100


class Ranker(torch.nn.Module):
    """Embeddings + MLP: one score per candidate."""

    def __init__(self, vocab: int = VOCAB):
        super().__init__()
        self.item_embedding = torch.nn.Embedding(vocab, EMB_DIM)
        self.user_tower = torch.nn.Linear(USER_DIM, EMB_DIM)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(2 * EMB_DIM + ITEM_DIM, 32), torch.nn.ReLU(),
            torch.nn.Linear(32, 16), torch.nn.ReLU(),
            torch.nn.Linear(16, 1))

    def forward(self, user_features: torch.Tensor, item_ids: torch.Tensor,
                item_features: torch.Tensor) -> torch.Tensor:
        user = self.user_tower(user_features).unsqueeze(1).expand(-1, item_ids.shape[1], -1)
        x = torch.cat([user, self.item_embedding(item_ids), item_features], dim=-1)
        return self.mlp(x).squeeze(-1)


def reference_model() -> Ranker:
    torch.manual_seed(7)
    return Ranker().eval()


def variant(name: str) -> Ranker:
    model = reference_model()
    if name == "fp16":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.half().float())
    elif name == "perturbed":
        generator = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for layer in model.mlp:
                if isinstance(layer, torch.nn.Linear):
                    layer.weight.add_(torch.randn(layer.weight.shape, generator=generator) * layer.weight.std())
    elif name == "broken":
        small = Ranker(vocab=3).eval()
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("item_embedding")}
        small.load_state_dict(state, strict=False)
        model = small
    return model


def export_onnx(model: Ranker, path: Path, input_names: list[str]) -> None:
    example = (torch.randn(2, USER_DIM), torch.randint(0, 3, (2, 5)), torch.randn(2, 5, ITEM_DIM))
    dynamic = {input_names[0]: {0: "batch"}, input_names[1]: {0: "batch", 1: "items"},
               input_names[2]: {0: "batch", 1: "items"}, "scores": {0: "batch", 1: "items"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # the TorchScript-based exporter is deprecated, still fine here
        torch.onnx.export(model, example, str(path), input_names=input_names, output_names=["scores"],
                          dynamic_axes=dynamic, dynamo=False)


_V2_TYPES = {"tensor(float)": "FP32", "tensor(int64)": "INT64"}


def tensor_metadata(values) -> list[dict]:
    return [{"name": v.name, "datatype": _V2_TYPES[v.type],
             "shape": [d if isinstance(d, int) else -1 for d in v.shape]} for v in values]
