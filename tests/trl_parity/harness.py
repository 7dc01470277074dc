"""What the TRL comparisons share: the weights of a saved model and the difference of two updates."""

from __future__ import annotations

import torch

TOLERANCE = 1e-3  # relative difference of the update: float32 sums in another order stay below ~1e-4


def weights(model) -> dict[str, torch.Tensor]:
    """A detached float32 copy of ``model``'s state dict."""
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def start_weights(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return weights(AutoModelForCausalLM.from_pretrained(model_dir))


def update_difference(start: dict, theirs: dict, ours: dict) -> float:
    """The largest, over the tensors that moved, of ``|ours - theirs| / |theirs - start|`` (2-norms):
    how far rlhfkit's update is from TRL's, relative to TRL's update. Every tensor must be present in both."""
    assert theirs.keys() == ours.keys(), set(theirs) ^ set(ours)
    moved = [k for k in theirs if (theirs[k] - start[k]).norm() > 0]
    assert moved, "TRL's step moved no weight: the comparison would be empty"
    return max(((theirs[k] - ours[k]).norm() / (theirs[k] - start[k]).norm()).item() for k in moved)
