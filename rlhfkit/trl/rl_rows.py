"""``trainer.state.log_history`` of the GRPO / RLOO drop-ins laid out as TRL 1.16's trainers lay it out
(``transformers.Trainer``'s logging, with ``GRPOTrainer.log`` merging its averaged ``_metrics``):

- a training row at each logging step (an RL step holding an optimizer step that is a multiple of
  ``logging_steps``; the first too with ``logging_first_step``; none with ``logging_strategy="no"``):
  TRL's names (``metrics.py``) averaged over the RL steps since the previous training row, as TRL
  averages its metrics over the logging window, beside rlhfkit's names with the step's own values;
  ``step`` is the optimizer steps done, ``epoch`` the passes over the train prompts;
- an evaluation row per evaluation set after it when an evaluation is due (``rl_eval.py``), and
  one per ``evaluate()`` call;
- the end-of-training summary last (``state.py``), with the averages of the RL steps logged after
  the last training row, as TRL's last ``log`` merges what its window still holds.

An optimizer step that is a logging step in the middle of a generation logs with the generation's
last optimizer step here (TRL logs inside the generation); the window's values are the same
generation's. Every step's row of rlhfkit's names stays in ``trainer.history`` and ``metrics.jsonl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .metrics import with_trl_names
from .rl_eval import crosses

if TYPE_CHECKING:
    from ..trainers.rl import RLTrainer
    from .rl_eval import TRLRLEvaluation
    from .state import TRLTrainerMixin

    class _Trainer(TRLRLEvaluation, TRLTrainerMixin, RLTrainer):
        """The classes the mixin comes before in the drop-in trainers (``rl_trainers.py``), as the
        type checker reads it; at run time its base is object."""

else:
    _Trainer = object

# TRL's names a training row takes from its step rather than averaging over the window; TRL's
# summary row has none of them (nor the loss: transformers logs it at logging steps only)
STEP_VALUES = ("grad_norm", "learning_rate", "epoch")
NOT_IN_SUMMARY = ("loss", "grad_norm", "learning_rate")


class TRLRLRows(_Trainer):
    """Mixed into the GRPO / RLOO drop-ins; overrides ``RLTrainer._log``, which the RL loop calls once
    per step with the step's metrics, and ``train`` (the start's evaluation, the summary)."""

    trl_rows: list
    trl_window: list
    trl_eval_data: dict
    trl_steps_per_epoch: int | None = None  # optimizer steps per pass over the train prompts (None: a stream)

    def _log(self, metrics: dict, exp, timings: dict) -> None:
        """The step's evaluations when due, rlhfkit's row, then TRL's rows (the module docstring)."""
        evaluations: list[dict] = []
        if self.trl_eval_due(self.step):
            evaluations, native = self.trl_evaluate_sets()
            metrics.update(native)
        super()._log(metrics, exp, timings)
        row = with_trl_names(self.run.history[-1], self.trl_metrics(), self.optimizer_steps_per_row())
        row.update(self.trl_extra_metrics(), **self.trl_epoch_entry())
        self.trl_window.append(row)
        if self.trl_logs_at(self.step):
            self.trl_rows.append(self.trl_train_row())
            self.trl_window = []
        epoch = self.trl_epoch_entry()
        self.trl_rows += [{**e, **epoch, "step": self.optimizer_steps_done()} for e in evaluations]

    def trl_extra_metrics(self) -> dict:
        """TRL's metrics a step logs that are the trainer's state rather than a computed value."""
        return {}

    def trl_epoch_entry(self) -> dict:
        """``{"epoch": passes over the train prompts}`` (TRL's, optimizer steps over the steps per
        epoch); ``{}`` for a stream, whose length is unknown."""
        if not self.trl_steps_per_epoch:
            return {}
        return {"epoch": self.optimizer_steps_done() / self.trl_steps_per_epoch}

    def trl_logs_at(self, step: int) -> bool:
        """Whether TRL writes a training row after RL step ``step``."""
        a = self.trl_args
        strategy = getattr(a.logging_strategy, "value", a.logging_strategy)
        if strategy == "no":
            return False
        per = self.optimizer_steps_per_row()
        if strategy == "epoch":
            return self.trl_steps_per_epoch is not None and crosses(step, per, self.trl_steps_per_epoch, 0)
        first = step == 1 and a.logging_first_step
        return first or crosses(step, per, a.logging_steps, self.optimizer_steps_total())

    def trl_train_row(self) -> dict:
        """The window's training row: the last step's row, TRL's averaged names averaged."""
        window, last = self.trl_window, self.trl_window[-1]
        row = dict(last)
        row.update(self.trl_window_means(window))
        return row

    def trl_window_means(self, window: list[dict]) -> dict:
        """TRL's names averaged over ``window`` (those every row of it has)."""
        if not window:
            return {}
        names = [t for t in self.trl_metrics() if t not in STEP_VALUES and all(t in r for r in window)]
        names += [k for k in window[-1] if k in self.trl_extra_metrics() and all(k in r for r in window)]
        return {t: sum(r[t] for r in window) / len(window) for t in names}

    def trl_log_history(self) -> list[dict]:
        """TRL's rows, then the summary after a run (with the averages the window still holds)."""
        rows = [dict(r) for r in self.trl_rows]
        if self.summary is not None:
            rows.append(dict(self.summary))
        return rows

    @property
    def state(self):
        """TRL's ``trainer.state``: a ``transformers.TrainerState`` whose ``global_step`` counts
        optimizer steps and ``log_history`` holds TRL's rows (the module docstring)."""
        from transformers import TrainerState

        state = TrainerState(global_step=self.optimizer_steps_done(), max_steps=self.optimizer_steps_total())
        state.log_history = self.trl_log_history()
        if self.trl_steps_per_epoch:
            state.epoch = self.optimizer_steps_done() / self.trl_steps_per_epoch
        return state

    def train(self, resume_from_checkpoint=None):
        """TRL's ``train`` (``state.py``): with ``eval_on_start`` an evaluation first; the summary
        row gains the window's averages and the epoch."""
        self.trl_rows, self.trl_window = [], []
        if self.trl_args.eval_on_start and self.trl_eval_data and self.step == 0:
            self.trl_rows += [{**e, "step": 0} for e in self.trl_evaluate_sets()[0]]
        output = super().train(resume_from_checkpoint)
        assert self.summary is not None  # set by TRLTrainerMixin.train, which has just returned
        extra = {k: v for k, v in self.trl_window_means(self.trl_window).items() if k not in NOT_IN_SUMMARY}
        self.summary = {**{k: v for k, v in self.summary.items() if k != "step"}, **extra, **self.trl_epoch_entry()}
        self.summary["step"] = self.optimizer_steps_done()
        output.metrics.update(self.summary)
        return output
