"""Direct Preference Optimization (Rafailov et al. 2023, arXiv:2305.18290) and its variants: the
RL-free alternative the reference compares against. (Trainer under construction.)"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import TrainConfig, check_fields

DPO_LOSSES = ("sigmoid", "ipo", "hinge", "simpo")


@dataclass(frozen=True)
class DPOConfig(TrainConfig):
    """Everything a DPO run reads. ``DPOConfig(beta=0.1, loss_type="sigmoid", learning_rate=1e-6)``."""

    learning_rate: float = 1e-6
    """AdamW peak learning rate; 1e-6 is TRL's DPO default for real models (tiny random models want ~1e-3)."""
    lr_scheduler: str = "linear"
    """After warmup: constant, linear (decay to 0 at the last step) or cosine."""
    beta: float = 0.1
    """β: the strength of the implicit KL leash to the reference (DPO, hinge), IPO's τ (the target margin is 1/(2β)), or SimPO's reward scale."""
    loss_type: str = "sigmoid"
    """sigmoid (DPO; with label_smoothing > 0 conservative DPO), ipo, hinge (SLiC) or simpo (reference-free, length-normalised); see algorithms/dpo.py."""
    label_smoothing: float = 0.0
    """sigmoid only: the assumed probability ε that a label is flipped (conservative DPO, Mitchell 2023); 0 is plain DPO."""
    simpo_gamma: float = 0.5
    """simpo only: the target reward margin γ of SimPO (Meng et al. 2024)."""
    precompute_ref_logprobs: bool = False
    """Score every training pair under the reference once, before training, and free the reference: no second model in memory during training (the same loss: the reference is frozen)."""

    def __post_init__(self):
        super().__post_init__()
        check_fields(self, [(self.loss_type in DPO_LOSSES, "loss_type", f"one of {', '.join(DPO_LOSSES)}"),
                            (self.label_smoothing == 0 or self.loss_type == "sigmoid", "label_smoothing",
                             "0 unless loss_type is 'sigmoid' (it is conservative DPO's flip rate)")])


__all__ = ["DPOConfig", "DPO_LOSSES"]
