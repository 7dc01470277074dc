"""Supervised fine-tuning's per-token losses, from each trained token's log-probability
``log π_θ(y_t | x, y_<t)``; the SFT trainer sums them over the step's trained tokens and divides by
their count (``trainers/sft.py``). ``is_top1`` reads, for the token-accuracy metric, whether each
token is the model's most likely one from what the streamed LM head returns.

- ``nll``: ``−log π_θ(y_t | x, y_<t)``, the cross-entropy of the data (maximum likelihood).
- ``dft``: Dynamic Fine-Tuning (Wu et al. 2025, "On the Generalization of SFT: A Reinforcement
  Learning Perspective with Reward Rectification", arXiv:2508.05629), ``−sg(π_θ(y_t | x, y_<t)) ·
  log π_θ(y_t | x, y_<t)``: each token's cross-entropy weighted by its own probability, the weight
  held constant (``sg``: stop-gradient). The paper reads SFT's gradient as a policy gradient whose
  implicit reward is ``1/π_θ`` on the expert's tokens — unbounded where the model finds a token
  unlikely — and rescales it by ``π_θ`` to cancel it: the gradient per token is ``−∇π_θ(y_t)``
  instead of ``−∇π_θ(y_t) / π_θ(y_t)``. TRL's ``SFTConfig(loss_type="dft")`` is this formula.
"""

from __future__ import annotations

import math

import torch

SFT_LOSS_TYPES = ("nll", "dft")


def sft_token_loss(logprobs: torch.Tensor, loss_type: str = "nll") -> torch.Tensor:
    """The per-token loss of ``loss_type`` (the module docstring) for ``logprobs``, the trained
    tokens' log-probabilities under the model (any shape; the result has the same)."""
    if loss_type == "nll":
        return -logprobs
    if loss_type == "dft":
        return -logprobs * logprobs.detach().exp()
    raise ValueError(f"loss_type must be one of {', '.join(SFT_LOSS_TYPES)}, got {loss_type!r}")


def is_top1(logprobs: torch.Tensor, log_kept_top1: torch.Tensor) -> torch.Tensor:
    """Whether each target token is its distribution's most likely one (bool, ``logprobs``' shape),
    from its log-probability ``log p_y`` and ``log_kept_top1 = log S``, ``algorithms.log_kept_mass``
    with ``top_k=1``: the mass of the argmax and the target together. ``S = p_y`` when the target is
    the argmax; otherwise ``S = p_max + p_y >= 2 p_y``, so ``log S - log p_y >= ln 2``: the midpoint
    ``ln 2 / 2`` separates the two at any rounding (a target tied with the argmax counts as not top-1)."""
    return (log_kept_top1 - logprobs.detach()) < 0.5 * math.log(2.0)
