"""A TRL script's ``callbacks=[...]`` see what they would see under TRL: each is called with the TRL
config as ``args``, a ``TrainerState`` whose ``global_step`` / ``max_steps`` count optimizer steps
and whose ``log_history`` rows carry TRL's metric names beside rlhfkit's, and ``on_log(logs=...)``
/ ``on_evaluate(metrics=...)`` with TRL's names added (``metrics.py``). The events are rlhfkit's
(``run/callbacks.py``): one ``on_step_end`` per rlhfkit step (for GRPO / RLOO a generation, which
holds ``optimizer_steps_per_generation`` optimizer steps)."""

from __future__ import annotations

import copy
from functools import partial

from .metrics import with_trl_names


def trl_callbacks(callbacks, trainer) -> list | None:
    """``callbacks`` (a list, one callback, or None; classes are instantiated) each wrapped in a
    ``TRLView`` of ``trainer``; an object without an ``on_*`` method is passed as it is (rlhfkit's
    check names it)."""
    if callbacks is None:
        return None
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    items = [c() if isinstance(c, type) else c for c in items]
    return [TRLView(c, trainer) if _events(c) else c for c in items]


def _events(callback) -> list[str]:
    return [name for name in dir(callback) if name.startswith("on_") and callable(getattr(callback, name, None))]


class TRLView:
    """``callback`` called with TRL's view of the drop-in ``trainer`` (the module docstring)."""

    def __init__(self, callback, trainer):
        self.callback, self.trainer = callback, trainer
        for event in _events(callback):
            setattr(self, event, partial(self._call, event))

    def _call(self, event: str, args, state, control, **kwargs):
        trainer = self.trainer
        table, per = trainer.trl_metrics(), trainer.optimizer_steps_per_row()
        view = copy.copy(state)
        view.global_step, view.max_steps = state.global_step * per, state.max_steps * per
        view.log_history = [with_trl_names(row, table, per) for row in state.log_history]
        if kwargs.get("logs") is not None:
            kwargs["logs"] = with_trl_names(kwargs["logs"], table, per)
        if kwargs.get("metrics") is not None:
            metrics = kwargs["metrics"]
            kwargs["metrics"] = {**metrics, **{trl: metrics[ours] for trl, ours in table.items() if ours in metrics}}
        return getattr(self.callback, event)(trainer.trl_args, view, control, **kwargs)

    def __repr__(self) -> str:
        return f"TRLView({self.callback!r})"
