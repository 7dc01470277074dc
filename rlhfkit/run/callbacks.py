"""``callbacks=[...]``: transformers' ``TrainerCallback`` interface, for every trainer.

A callback is an instance (or a class, instantiated with no argument) of
``transformers.TrainerCallback`` or any object with some of its ``on_*`` methods; each is called as
``on_x(args, state, control, **kwargs)``, as the HF ``Trainer`` and TRL call it:

- ``on_train_begin`` once the optimizer is built and any checkpoint resumed;
- ``on_step_begin`` / ``on_step_end`` around each trainer step (sampling, scoring and the update(s)
  for RL; the optimizer step for SFT, reward model, DPO) — evaluation, logging and checkpoints
  come after ``on_step_end``;
- ``on_evaluate(metrics=...)`` for a logged row with ``eval/*`` metrics, ``on_log(logs=...)`` for
  every row of ``metrics.jsonl``;
- ``on_train_end`` after ``final/`` is saved.

``args`` is the trainer's own config (``RLConfig``, ``SFTConfig`` ...), ``state`` a
``transformers.TrainerState`` (``global_step``, ``max_steps``, ``log_history``, ``is_world_process_zero``)
and the keyword arguments ``model`` (the trained module), ``optimizer`` and ``lr_scheduler``.
Of ``TrainerControl`` the trainers honour ``should_training_stop``: set in ``on_step_end`` on any
process, every process ends the run after that step — it is evaluated (when an eval set is
given), logged and saved to ``final/`` as a last step is. The other flags are ignored: saving and
evaluating follow ``save_steps`` and ``eval_every``.
"""

from __future__ import annotations

from .. import distributed


class Callbacks:
    """The run's callbacks and the ``TrainerState`` / ``TrainerControl`` they share."""

    def __init__(self, callbacks, args):
        from transformers import TrainerControl, TrainerState

        items = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        self.items = [c() if isinstance(c, type) else c for c in items]
        for c in self.items:
            if not any(callable(getattr(c, name, None)) for name in dir(c) if name.startswith("on_")):
                raise ValueError(
                    f"callbacks: {type(c).__name__} has no on_* method (a transformers.TrainerCallback, "
                    "e.g. with on_step_end(args, state, control, **kwargs))"
                )
        self.args = args
        main = distributed.is_main()
        self.state = TrainerState(is_local_process_zero=distributed.local_rank() == 0, is_world_process_zero=main)
        self.control = TrainerControl()
        self.extra: dict = {}

    def __bool__(self) -> bool:
        return bool(self.items)

    def begin(self, max_steps: int, step: int, **extra) -> None:
        """``on_train_begin``; ``extra``: the keyword arguments every event passes (model, optimizer ...)."""
        self.state.max_steps, self.state.global_step, self.extra = max_steps, step, extra
        self.fire("on_train_begin")

    def fire(self, event: str, **kwargs) -> None:
        for c in self.items:
            method = getattr(c, event, None)
            if method is not None:
                out = method(self.args, self.state, self.control, **self.extra, **kwargs)
                if out is not None and hasattr(out, "should_training_stop"):  # HF callbacks may return a control
                    self.control = out

    def step_end(self, step: int) -> bool:
        """``on_step_end`` after trainer step ``step``; whether the run stops here (every process
        agrees: one process asking is enough)."""
        self.state.global_step = step
        self.fire("on_step_end")
        return bool(distributed.reduce_max(int(self.control.should_training_stop)))

    def logged(self, row: dict) -> None:
        """``on_evaluate`` (for a row with ``eval/*`` metrics) and ``on_log`` for one metrics row."""
        self.state.log_history.append(row)
        evaluation = {k: v for k, v in row.items() if k.startswith("eval/")}
        if evaluation:
            self.fire("on_evaluate", metrics=evaluation)
        self.fire("on_log", logs=row)


__all__ = ["Callbacks"]
