"""The reward-model trainer's pieces around its model (``reward_model.RewardModelTrainer``): the
``ScalarModel`` it trains (``load_scalar_model``), its scoring as a module FSDP2 and DDP wrap
(``Scorer``), the Bradley–Terry loss and metrics over every process's pairs
(``global_pair_metrics``), and the plain CPU copy rank 0 saves (``unsharded_copy``)."""

from __future__ import annotations

import copy
import math
import os
from typing import cast

import torch

from .. import distributed
from ..models import ScalarModel


class Scorer(torch.nn.Module):
    """``model.score`` as a module's ``forward``: FSDP2 gathers the root's parameters, and DDP
    prepares its gradient all-reduce, only around calls of a module."""

    def __init__(self, model: ScalarModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.score(input_ids, attention_mask)


def global_pair_metrics(chosen, rejected, margin, n_real: int, device, center_coefficient: float | None = None):
    """``bradley_terry_loss``'s loss and metrics over the pairs of every process: each passes its
    scores, of which the first ``n_real`` count (none: a stand-in). Reduced in float64."""
    c, r = chosen.detach()[:n_real].double().cpu(), rejected.detach()[:n_real].double().cpu()
    diff = c - r - (margin.detach()[:n_real].double().cpu() if margin is not None else 0.0)
    sums = torch.stack(
        [
            torch.tensor(float(n_real), dtype=torch.float64),
            -torch.nn.functional.logsigmoid(diff).sum(),
            (c > r).double().sum(),
            (c - r).sum(),
            c.sum(),
            r.sum(),
            ((c + r) ** 2).sum(),
        ]
    )
    n, loss, wins, gap, c_sum, r_sum, centre = distributed.sum_floats(sums.tolist())
    loss += (center_coefficient or 0.0) * centre
    mean = (c_sum + r_sum) / (2 * n)
    (square,) = distributed.sum_floats([float(((torch.cat([c, r]) - mean) ** 2).sum())])
    metrics = {
        "accuracy": wins / n,
        "margin_mean": gap / n,
        "chosen_mean": c_sum / n,
        "rejected_mean": r_sum / n,
        "reward_mean": mean,
        "reward_std": math.sqrt(square / (2 * n - 1)) if n > 0.5 else float("nan"),
    }
    return torch.tensor(loss / n), {"rm/" + k: torch.tensor(v) for k, v in metrics.items()}


def unsharded_copy(model: ScalarModel, state: dict) -> ScalarModel:
    """A plain CPU ``ScalarModel`` of ``model``'s architecture holding ``state`` (the gathered full
    weights of the ``Scorer`` around it) and its offset: what rank 0 saves. Built on the meta
    device, so nothing is initialised twice."""
    with torch.device("meta"):
        backbone = type(model.backbone)(copy.deepcopy(model.config))
        trained = cast(torch.nn.Linear, model.head)  # H -> 1 (peft's wrapper of a trained head forwards these)
        head = torch.nn.Linear(trained.in_features, 1, bias=trained.bias is not None)
        out = ScalarModel(backbone, head)
    out.to_empty(device="cpu")  # buffers outside the state dict (rotary tables) are never saved
    out.load_state_dict({k.removeprefix("model."): v for k, v in state.items()}, assign=True)
    out.register_buffer("offset", torch.tensor(float(model.offset)), persistent=False)
    return out


def load_scalar_model(model, dtype: str) -> ScalarModel:
    """A ``ScalarModel`` from a directory (``ScalarModel.from_pretrained``), a causal-LM object (its
    transformer copied, fresh head) or a ``ScalarModel`` as given."""
    if isinstance(model, ScalarModel):
        return model
    if isinstance(model, (str, os.PathLike)):
        return ScalarModel.from_pretrained(model, dtype)
    if isinstance(model, torch.nn.Module) and hasattr(model, "base_model"):
        return ScalarModel.from_causal_lm(model)
    raise ValueError(f"model must be a directory, a causal-LM object or a ScalarModel, got {type(model).__name__}")
