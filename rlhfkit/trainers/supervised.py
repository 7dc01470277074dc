"""What the trainers on fixed data (SFT, reward model, DPO) share: the run directory and its
record, the optimizer and schedule, checkpoints every ``save_steps`` (``run/checkpoint.py``: DCP
shards of the trainable weights and AdamW's state, the schedule, every process's RNG, the loop's
counters), ``resume_from``, and the metrics logger with its trackers.

A resumed run ends with the weights of the uninterrupted one: the checkpoint restores every
input of the remaining steps — weights, optimizer moments, the learning-rate schedule, the RNG
states (dropout masks) and the position in the seeded data order (``_counters``).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

from .. import distributed
from ..models.fingerprint import model_fingerprint
from ..models.loading import check_finite_weights
from ..run.metrics import MetricsLogger
from ..run.directory import check_run_dir, latest_checkpoint
from ..run.checkpoint import load_checkpoint, prune_checkpoints, save_checkpoint
from ..run.training import NonFiniteGuard, make_optimizer, make_scheduler, optimizer_step


class SupervisedTrainer:
    """Base of ``SFTTrainer``, ``RewardModelTrainer`` and ``DPOTrainer``. A subclass sets ``args``,
    calls ``_check_run`` before loading anything, ``_open_run`` and ``_start_training`` once its
    model is built and sharded, and ``_step_done`` after each optimizer step; it names what a checkpoint holds with
    ``_trained_modules`` and ``_counters`` / ``_restore``."""

    main_metric = "loss"

    def _check_run(self) -> None:
        """Before anything loads: a ``device`` this machine lacks refused, ``resume_from='latest'``
        resolved, the run directory's refusals (``check_run_dir``) — nothing is written yet."""
        args = self.args
        distributed.check_device(args.device)
        if args.resume_from == "latest":
            self.args = args = args.replace(resume_from=latest_checkpoint(args.output_dir))
        self.out_dir = args.output_dir if int(os.environ.get("RANK", "0")) == 0 else None  # rank 0 writes
        check_run_dir(self.out_dir, args.overwrite, args.resume_from)

    def _open_run(self, model, datasets: dict, peft_config=None, **sources) -> None:
        """Once the model and data have loaded: create the run directory (rank 0) and record the
        run in its ``config.yaml`` (``run.record.open_run``)."""
        from ..run.record import open_run

        open_run(self.out_dir, self.args, model, datasets, peft_config=peft_config, **sources)

    def _start_training(self, total_steps: int) -> None:
        """Optimizer (AdamW over every trainable parameter), schedule, resume, logger."""
        args = self.args
        self.total_steps, self.step = total_steps, 0
        check_finite_weights(self._trained_modules(), "model")  # a model object too: refused before training
        params = [p for m in self._trained_modules().values() for p in m.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(params, args.learning_rate, args.weight_decay)
        self.guard = NonFiniteGuard(args.max_consecutive_skips)  # non-finite steps are skipped, counted
        self.scheduler = make_scheduler(self.optimizer, args.lr_scheduler, args.warmup_steps, total_steps)
        # The base model as built, before any step: checkpoints record it, resume_from must match it.
        self.base_model = model_fingerprint(self._trained_modules())
        if args.resume_from:
            self._resume(args.resume_from)
        main = distributed.is_main()  # the other processes compute the same global metrics, silently
        self.logger = MetricsLogger(self.out_dir, args.log_every if main else 0, main_metric=self.main_metric,
                                    progress_bar=args.progress_bar and main, total_steps=total_steps,
                                    initial_step=self.step, config=args if main else None)

    # ---------------------------------------------------------------- inputs and data order
    @staticmethod
    def _check_model(model, processing_class) -> bool:
        """Whether ``model`` is a path (a directory, GGUF, ``package:`` or Hub id); an object must be
        a module and come with its tokenizer. One line otherwise."""
        is_path = isinstance(model, (str, os.PathLike))
        if not is_path and not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a model directory or a causal-LM object, got {type(model).__name__}")
        if not is_path and processing_class is None:
            raise ValueError("processing_class (the tokenizer) is required when model is an object, not a path")
        return is_path

    def _check_pairs(self, pairs: list, dropped: int, total: int, name: str) -> list:
        """Pairs whose completions fit ``max_length``: none is an error, some dropped a warning."""
        limit = self.args.max_length
        if not pairs:
            raise ValueError(f"{name}: every pair is longer than max_length={limit} tokens even with its prompt "
                             "cut; raise max_length")
        if dropped:
            warnings.warn(f"{name}: dropped {dropped} of {total} pairs whose completion does not fit in "
                          f"max_length={limit} tokens", stacklevel=3)
        return pairs

    def _batch(self, step: int) -> list[int]:
        """Item indices of optimizer step ``step`` (1-based): ``batch_size`` at a time over seeded
        per-epoch shuffles of ``self.n_items`` (the last batch of an epoch may be smaller). A
        function of the step alone, so a resumed run continues the order."""
        epoch, index = divmod(step - 1, self.steps_per_epoch)
        gen = torch.Generator().manual_seed(self.args.seed * 100003 + epoch)
        return torch.randperm(self.n_items, generator=gen).split(self.args.batch_size)[index].tolist()

    # ---------------------------------------------------------------- checkpoints
    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        """The modules whose trainable parameters the optimizer updates and checkpoints hold."""
        raise NotImplementedError

    def _counters(self) -> dict:
        """The loop's position, saved last in a checkpoint (``trainer_state.json``)."""
        return {"step": self.step, "skipped_steps": self.guard.skipped}

    def _restore(self, counters: dict) -> None:
        self.step = int(counters["step"])
        self.guard.skipped = int(counters.get("skipped_steps", 0))

    def _optimizer_step(self, loss: torch.Tensor | None = None) -> dict:
        """Clip, step (unless the loss or the gradient norm is not finite: ``NonFiniteGuard``),
        advance the schedule; the step's ``perf/*`` metrics."""
        grad_norm, lr = optimizer_step(self.optimizer, self.scheduler, self.args.max_grad_norm, self.guard, loss)
        return {"perf/lr": lr, "perf/grad_norm": grad_norm, "perf/skipped_steps": float(self.guard.skipped)}

    def _step_done(self) -> None:
        """After optimizer step ``self.step``: a checkpoint every ``save_steps`` (older ones pruned
        to ``save_total_limit``)."""
        args = self.args
        if args.output_dir and args.save_steps and self.step % args.save_steps == 0:
            self.save_checkpoint(Path(args.output_dir) / f"checkpoint-{self.step}")
            if args.save_total_limit and self.out_dir:
                prune_checkpoints(self.out_dir, args.save_total_limit)

    def save_checkpoint(self, path) -> None:
        """Every process calls this (DCP writes each process's shards); complete when it returns."""
        save_checkpoint(Path(path), self._trained_modules(), self.optimizer, self.scheduler, self._counters(),
                        settings=self._settings())

    def _settings(self) -> dict:
        """What a checkpoint records and a resumed run must share: the seed and the base model."""
        return {"seed": self.args.seed, "base_model": self.base_model}

    def _resume(self, path) -> None:
        # Any number of processes; a rank the saved run did not have gets the seed a fresh run gives it.
        counters = load_checkpoint(path, self._trained_modules(), self.optimizer, self.scheduler,
                                   fresh_seed=self.args.seed + 1_000_003 * distributed.rank(),
                                   settings=self._settings())
        if int(counters.get("step", -1)) > self.total_steps:
            raise ValueError(f"resume_from={str(path)!r} is at step {counters['step']}, past this run's "
                             f"{self.total_steps} steps")
        self._restore(counters)

    def _finish(self) -> None:
        """Close the trackers (the run's files are complete) and wait for every process."""
        self.logger.close()
        distributed.finished()
