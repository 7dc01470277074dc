"""A run that has collapsed says so: once in one line while it runs, and again when it ends.

The signature every trainer shares (SFT, the reward model, DPO, RL): the global gradient norm is exactly 0
on ``PATIENCE`` logged steps in a row while the loss is not 0. The model's output then no longer depends on
its weights — a learning rate far too high saturated it (an SFT model predicting the uniform distribution,
loss ln V; a reward model giving every completion one score, loss ln 2 and accuracy at chance) — and every
later step trains nothing, while the run would otherwise finish with exit 0. A healthy run's gradient is
never exactly 0 (a converged one's is small, not 0), and a skipped non-finite step is the guard's business
(``training.NonFiniteGuard``), not this one's.
"""

from __future__ import annotations

import math

from ..data.encode import warn_once

PATIENCE = 3  # logged steps in a row with a zero gradient


class CollapseWatch:
    """Watches each logged step's gradient norm and loss; ``collapsed_at`` is the first step of the run of
    zero-gradient steps that tripped it (None while the run is healthy)."""

    def __init__(self, learning_rate: float, patience: int = PATIENCE):
        self.learning_rate, self.patience = learning_rate, patience
        self.streak: list[int] = []
        self.collapsed_at: int | None = None
        self.loss: float | None = None

    def observe(self, step: int, grad_norm: float | None, row: dict) -> None:
        """After the row of ``step`` was logged; ``grad_norm``: the last optimizer step's (None: none yet)."""
        loss = next((v for k, v in row.items() if k.endswith("loss") and isinstance(v, float)), None)
        flat = grad_norm is not None and grad_norm == 0.0 and loss is not None and math.isfinite(loss) and loss > 0
        self.streak = [*self.streak, step] if flat else []
        if self.collapsed_at is None and len(self.streak) >= self.patience:
            self.collapsed_at, self.loss = self.streak[0], loss
            warn_once(f"step {step}: {self.describe()}")

    def describe(self) -> str:
        return (
            f"the model collapsed at step {self.collapsed_at}: its gradient has been exactly 0 since, with the "
            f"loss stuck at {self.loss:.4g} (its output no longer depends on its weights), so the rest of the "
            f"run trains nothing; a learning rate of {self.learning_rate:g} is likely too high"
        )

    def summary(self) -> None:
        """At the run's end: the same line again when it collapsed (nothing otherwise)."""
        if self.collapsed_at is not None:
            warn_once(f"this run ended collapsed: {self.describe()}")
