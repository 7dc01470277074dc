"""``trainer.state.log_history`` of the supervised drop-ins (SFT, DPO, reward) laid out as
``transformers.Trainer`` (which TRL's trainers extend) lays it out, so TRL's ``log_history[0]``,
``[-2]``, ``[-3]`` read the rows they read under TRL:

- a training row at each logging step (every ``logging_steps`` optimizer steps, the first too with
  ``logging_first_step``; at each epoch's end with ``logging_strategy="epoch"``; never with "no"):
  TRL's names of ``metrics.py`` — the loss and the trainer's metrics averaged over the steps since
  the previous training row, as TRL averages them; ``grad_norm``, ``learning_rate`` and ``epoch`` of
  the step itself — beside rlhfkit's names with the step's own values;
- an evaluation row per evaluation set after it, at each evaluation step (every ``eval_steps``,
  with ``eval_strategy="steps"``; ``evaluation.py`` has its keys), before the first step with
  ``eval_on_start``, and one per ``evaluate()`` call;
- the end-of-training summary (``state.py``) last, with TRL's trainer metrics averaged over the steps
  since the last training row (TRL's ``log`` adds them to every row it writes, the summary too).

Every step's row of rlhfkit's names stays in ``trainer.history`` and ``metrics.jsonl``, the
evaluation's under ``eval/*`` (``eval/<name>/*`` for a named set).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .metrics import with_trl_names

if TYPE_CHECKING:
    from .evaluation import TRLEvaluation
    from .state import TRLTrainerMixin

    class _Trainer(TRLEvaluation, TRLTrainerMixin):
        """The classes the mixin comes before in ``SupervisedTRLTrainer`` (and, through ``TRLEvaluation``'s,
        the rlhfkit trainer), as the type checker reads it; at run time its base is object."""

else:
    _Trainer = object

# TRL's names a training row takes from its step rather than averaging over the logging window
STEP_VALUES = ("grad_norm", "learning_rate", "epoch")


class TRLLogRows(_Trainer):
    """Mixed into ``SupervisedTRLTrainer``; overrides ``SupervisedTrainer._log_step``, which every
    rlhfkit supervised loop calls once per optimizer step with the step's metrics."""

    trl_rows: list  # the layout above, built as the run goes
    trl_eval_sets: dict
    trl_epoch: float | None = None
    _trl_window: list[dict]  # TRL's rows of the steps since the last training row

    def _log_step(self, step: int, metrics: dict) -> None:
        """The step's evaluations when due, rlhfkit's row, then TRL's rows (the module docstring)."""
        evaluations = []
        if self.trl_eval_sets and self.args.eval_every and step % self.args.eval_every == 0:
            for name, items in self.trl_eval_sets.items():
                trl, native = self.trl_evaluate_set(items, "eval" if name is None else f"eval_{name}")
                evaluations.append(trl)
                metrics.update(native if name is None else {f"eval/{name}/{k[5:]}": v for k, v in native.items()})
        super()._log_step(step, metrics)
        row = with_trl_names(self.run.history[-1], self.trl_metrics())
        previous_epoch, self.trl_epoch = self.trl_epoch, row.get("epoch")
        self._trl_window.append(row)
        if self._trl_logs_at(step, previous_epoch):
            self.trl_rows.append(self._trl_train_row())
            self._trl_window = []
        for trl in evaluations:
            self.trl_rows.append(
                {**trl, **({"epoch": self.trl_epoch} if self.trl_epoch is not None else {}), "step": step}
            )

    def _trl_logs_at(self, step: int, previous_epoch: float | None) -> bool:
        """Whether ``step`` is a logging step of TRL's ``logging_strategy``."""
        a = self.trl_args
        strategy = getattr(a.logging_strategy, "value", a.logging_strategy)
        if strategy == "no":
            return False
        if strategy == "epoch":
            return self.trl_epoch is not None and int(self.trl_epoch + 1e-9) > int((previous_epoch or 0.0) + 1e-9)
        every = self.args.log_every
        return bool(every and step % every == 0) or (step == 1 and a.logging_first_step)

    def _trl_train_row(self) -> dict:
        """The logging window's training row: the last step's, TRL's averaged names averaged."""
        window, last = self._trl_window, self._trl_window[-1]
        row = {k: v for k, v in last.items() if not k.startswith(("eval/", "eval_"))}
        for trl in self.trl_metrics():
            if trl.startswith("eval_") or trl in STEP_VALUES or not all(trl in r for r in window):
                continue
            row[trl] = sum(r[trl] for r in window) / len(window)
        return row

    def trl_log_history(self) -> list[dict]:
        return [dict(row) for row in self.trl_rows]

    def train(self, resume_from_checkpoint=None):
        """TRL's ``train`` (``state.py``): the evaluation sets first with ``eval_on_start``, the
        summary appended to the rows."""
        self._trl_window = []
        if self.trl_args.eval_on_start and self.trl_eval_sets:
            self.evaluate()
        out = super().train(resume_from_checkpoint)
        assert self.summary is not None  # set by TRLTrainerMixin.train, which has just returned
        self.trl_rows.append({**self._trl_window_metrics(), **self.summary})
        return out

    def _trl_window_metrics(self) -> dict:
        """What TRL's trainers add to the summary row: their metrics averaged over the steps since the last
        training row (none when the last step was logged; never the loss, whose place is ``train_loss``)."""
        if not self._trl_window:
            return {}
        row = self._trl_train_row()
        return {k: row[k] for k in self.trl_metrics() if k in row and k not in (*STEP_VALUES, "loss")}
