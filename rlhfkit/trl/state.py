"""What the drop-in trainers share: TRL's constructor arguments turned into rlhfkit's, and TRL's
``trainer.state``, ``train()`` return value and ``save_model(output_dir=None)``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import distributed
from ..agents.agent import model_name
from ..data import load_prompt_dataset
from .metrics import rl_metrics, with_trl_names
from .output_dir import claim_output_dir

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from ..rl.sampler import Sampler

    class _Trainer:
        """What the mixin's ``super()`` calls reach, as the type checker reads them: the rlhfkit trainer
        it is mixed into (``RLTrainer``, a ``SupervisedTrainer``); at run time the mixin's base is object."""

        def train(self) -> list[dict]: ...
        def save_model(self, path: Path) -> None: ...

else:
    _Trainer = object


class TRLTrainerMixin(_Trainer):
    """Mixed into a drop-in trainer before the rlhfkit trainer it extends. ``config_class``: its
    TRL-shaped config; ``suffix``: TRL's default output directory is ``<model name>-<suffix>``."""

    config_class: type[TrainingArguments]  # each drop-in's
    suffix = ""
    loss_key = "policy/loss"  # the logged loss train() averages into TrainOutput.training_loss
    trl_args: Any  # the TRL-shaped config (trl_config)
    summary: dict | None = None  # transformers.Trainer's end-of-training row, once train() has run
    history: list[dict]  # the rlhfkit trainer's logged rows, once train() has run
    # the rlhfkit trainer's: its config (RLConfig, a supervised config; the drop-in GRPOTrainer shows
    # TRL's as args), and the RL trainer's sampler and optimizer steps, which the defaults below read
    args: Any
    sampler: Sampler
    weights_version: int

    def translate(
        self, model, args, train_dataset, eval_dataset, reward_processing_classes=None, optimizers=(None, None)
    ):
        """``(RLConfig, eval_dataset, reward_weights)`` from TRL's arguments: TRL's default config
        when ``args`` is None; the evaluation set only when ``eval_strategy`` asks for one."""
        if reward_processing_classes is not None:
            raise ValueError(
                f"{type(self).__name__}: reward_processing_classes is not supported by rlhfkit: a reward "
                "model directory carries its own tokenizer"
            )
        args = self.trl_config(model, args, optimizers)
        if train_dataset is None:
            raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a JSONL path)")
        n_rows = len(load_prompt_dataset(train_dataset))
        native = args.to_rlhfkit(n_rows, distributed.planned_world())
        claim_output_dir(type(self).__name__, native.output_dir, native.resume_from)
        return native, eval_dataset if args.eval_strategy != "no" else None, args.reward_weights

    def trl_config(self, model, args, optimizers=(None, None)):
        """``args`` (kept as ``trl_args``), or TRL's default config when it is None (``output_dir``
        ``<model name>-<suffix>``); another config class and TRL's ``optimizers`` are refused."""
        if optimizers != (None, None) and optimizers is not None:
            raise ValueError(
                f"{type(self).__name__}: optimizers=(...) is not supported by rlhfkit: AdamW with the "
                "config's learning_rate, weight_decay and lr_scheduler_type"
            )
        if args is None:
            args = self.config_class(output_dir=f"{Path(model_name(model)).name}-{self.suffix}")
        if not isinstance(args, self.config_class):
            raise TypeError(
                f"{type(self).__name__}: args must be a {self.config_class.__name__}, got {type(args).__name__}"
            )
        self.trl_args = args
        return args

    @property
    def state(self):
        """TRL's ``trainer.state``: a ``transformers.TrainerState`` whose ``global_step`` counts
        optimizer steps, as TRL's does, and ``log_history`` holds the logged rows with TRL's metric
        names beside rlhfkit's and TRL's ``step`` (``metrics.py``)."""
        from transformers import TrainerState

        state = TrainerState(global_step=self.optimizer_steps_done(), max_steps=self.optimizer_steps_total())
        state.log_history = self.trl_log_history()
        return state

    def trl_log_history(self) -> list[dict]:
        """``state.log_history``: each logged rlhfkit row with TRL's names (``metrics.py``), then
        the summary after the run (the supervised drop-ins lay their rows out as TRL's Trainer does:
        ``supervised.py``)."""
        table, per_row = self.trl_metrics(), self.optimizer_steps_per_row()
        rows = [with_trl_names(row, table, per_row) for row in getattr(self, "history", [])]
        if self.summary is not None:  # transformers.Trainer's last row, after the run
            rows.append(dict(self.summary))
        return rows

    def trl_metrics(self) -> dict:
        """TRL's metric name -> rlhfkit's, for ``log_history`` (``metrics.py``)."""
        return rl_metrics(self.trl_args, self.sampler.rewards.names)

    def optimizer_steps_per_row(self) -> int:
        """Optimizer steps per logged rlhfkit step (TRL's ``step`` of a ``log_history`` row)."""
        return self.trl_args.optimizer_steps_per_generation

    def optimizer_steps_done(self) -> int:
        """Optimizer steps taken so far (each trainer says how it counts them)."""
        return self.weights_version

    def optimizer_steps_total(self) -> int:
        """Optimizer steps of the whole run."""
        return self.args.max_steps * self.trl_args.optimizer_steps_per_generation

    def train(self, resume_from_checkpoint=None):
        """The run; returns TRL's (``transformers.TrainOutput``): ``global_step`` (optimizer steps),
        ``training_loss`` (the mean of the logged losses, ``loss_key``) and ``metrics`` (the last row,
        with the summary). The summary — ``transformers.Trainer``'s end-of-training row: ``train_runtime``,
        ``train_samples_per_second`` and ``train_steps_per_second`` (its total batch: per-device batch x
        gradient accumulation x processes, per optimizer step), ``train_loss``, ``epoch``, ``step`` — is
        also ``state.log_history``'s last row, as TRL's tests read it (``total_flos`` is not counted)."""
        import time

        from transformers.trainer_utils import TrainOutput

        if resume_from_checkpoint not in (None, self.trl_args.resume_from_checkpoint):  # scripts pass the config's
            raise ValueError(
                f"{type(self).__name__}.train(resume_from_checkpoint=...) is not supported by rlhfkit: "
                f"set resume_from_checkpoint in the {self.config_class.__name__} (a checkpoint directory "
                "or 'latest')"
            )
        self.summary = None
        start = time.perf_counter()
        self.history = super().train()
        runtime = max(time.perf_counter() - start, 1e-9)
        losses = [r[self.loss_key] for r in self.history if self.loss_key in r]
        loss = sum(losses) / len(losses) if losses else 0.0
        steps = self.optimizer_steps_done()
        a = self.trl_args
        batch = a.per_device_train_batch_size * a.gradient_accumulation_steps * distributed.planned_world()
        last = with_trl_names(self.history[-1], self.trl_metrics()) if self.history else {}
        self.summary = {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(steps * batch / runtime, 3),
            "train_steps_per_second": round(steps / runtime, 3),
            "train_loss": loss,
            **({"epoch": last["epoch"]} if "epoch" in last else {}),
            "step": steps,
        }
        metrics = {**(dict(self.history[-1]) if self.history else {}), **self.summary}
        return TrainOutput(steps, loss, metrics)

    def save_model(self, output_dir=None):
        """The policy as a ``from_pretrained`` directory: ``output_dir``, else the config's."""
        super().save_model(Path(output_dir or self.args.output_dir))
