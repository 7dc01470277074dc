"""``Run``: the lifecycle of one training run, held by every trainer (SFT, reward model, DPO, RL).

A trainer builds its models and data; the ``Run`` it holds owns everything around them, once for
all four trainers:

1. ``Run(args)`` — before anything loads: a ``device`` this machine lacks is refused,
   ``resume_from='latest'`` is resolved, and the run directory's refusals are checked (nothing is
   written yet, so a run that fails to load leaves nothing behind);
2. ``open(model, datasets, **sources)`` — once the inputs have loaded: the run directory is
   created (rank 0) and the run recorded in its ``config.yaml``;
3. ``start(modules, total_steps, ...)`` — AdamW over the trainable parameters, the learning-rate
   schedule, the non-finite guard, the base model's fingerprint, ``resume_from`` (weights, moments,
   schedule, every process's RNG, the trainer's counters; a checkpoint past ``total_steps``, of
   another seed or another base model is refused in one line) and the metrics logger with its
   trackers;
4. ``step_begin()`` / ``step_end(step)`` around each step (the callbacks' events; ``step_end`` says
   whether a callback stopped the run), ``optimizer_step(loss)`` per update (clip, the guard, the
   schedule: ``training.optimizer_step``), ``log(step, metrics)`` per step, ``step_done(step,
   counters)`` per step (a checkpoint every ``save_steps``, pruned to ``save_total_limit``);
5. ``finish(save_final)`` — ``final/``, the plots, the trackers closed, ``on_train_end``, every
   process waiting for the others, then rank 0 merges the processes' step timelines into
   ``trace.json`` (``run/trace.py``; each process records its own from ``open`` on: the steps, the
   optimizer steps, the checkpoints and every ``training.timer`` phase).

The callbacks (``callbacks=[...]``: transformers' ``TrainerCallback`` interface) are
``run/callbacks.py``'s.

A checkpoint's counters are the trainer's own (its position in the data, an RL controller's β …)
plus ``skipped_steps``, which the run keeps: a resumed run reports the skips of the whole run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from .. import distributed
from ..models.fingerprint import model_fingerprint
from ..models.loading import check_finite_weights
from . import trace
from .callbacks import Callbacks
from .checkpoint import NEWEST, load_checkpoint, prune_checkpoints, save_checkpoint
from .collapse import CollapseWatch
from .directory import check_run_dir, finish_run, latest_checkpoint
from .metrics import MetricsLogger
from .record import open_run, record_end
from .training import NonFiniteGuard, make_optimizer, make_scheduler, optimizer_step


class Run:
    """The run lifecycle of one trainer (see the module docstring). ``args``: the trainer's config
    (``RunBase`` fields: output_dir, overwrite, resume_from, save_steps, save_total_limit, log_every,
    progress_bar, report_to, seed, device, learning_rate, weight_decay, lr_scheduler,
    warmup_steps, max_grad_norm, max_consecutive_skips); after construction ``run.args`` is the
    config with ``resume_from='latest'`` resolved. ``main_metric``: the metric the progress line
    shows; ``callbacks``: ``TrainerCallback`` objects (``run/callbacks.py``)."""

    def __init__(self, args, main_metric: str = "reward/mean", callbacks=None):
        distributed.check_device(args.device)
        if args.resume_from == "latest":
            args = args.replace(resume_from=latest_checkpoint(args.output_dir))
        self.args, self.main_metric = args, main_metric
        self.out_dir = args.output_dir if distributed.launch_rank() == 0 else None  # rank 0 writes
        check_run_dir(self.out_dir, args.overwrite, args.resume_from)
        self.callbacks = Callbacks(callbacks, args)
        # start() sets these; nothing reads them before it.
        self.optimizer: torch.optim.AdamW
        self.scheduler: torch.optim.lr_scheduler.LambdaLR
        self.guard: NonFiniteGuard
        self.logger: MetricsLogger
        self.total_steps = 0
        self.modules: dict[str, torch.nn.Module] = {}
        self.base_model: dict | None = None  # model_fingerprint(modules) at start
        self.step_start: float | None = None  # perf_counter() at step_begin: the step's event in the timeline
        self.collapse = CollapseWatch(args.learning_rate)  # a zero gradient for good says so (collapse.py)
        self.last_grad_norm: torch.Tensor | None = None

    # ---------------------------------------------------------------- start
    def open(self, model, datasets: dict, **sources) -> None:
        """Once the model, data and rewards have loaded: create the run directory (rank 0) and
        record the run (``open_run``: ``config.yaml``, in-memory data under ``data/``)."""
        open_run(self.out_dir, self.args, model, datasets, **sources)
        # Every process records its timeline (a generator rank too: it opens the run, never starts it).
        trace.start(
            self.args.output_dir, distributed.global_rank(), "generator" if distributed.is_generator() else "trainer"
        )

    def start(
        self,
        modules: dict[str, torch.nn.Module],
        total_steps: int,
        param_groups: list[dict] | None = None,
        schedule_steps: int | None = None,
    ) -> dict | None:
        """Optimizer, schedule, guard and logger for ``total_steps`` trainer steps, then
        ``resume_from``. ``modules``: what the optimizer trains and checkpoints hold (by name);
        ``param_groups``: AdamW's groups (default: one over every trainable parameter of
        ``modules``); ``schedule_steps``: optimizer steps the schedule spans (default
        ``total_steps``: one update per step). Returns the resumed checkpoint's counters (the
        trainer restores its own from them), or None for a fresh run."""
        args = self.args
        self.modules, self.total_steps = modules, total_steps
        check_finite_weights(modules, "model")  # a model object too: refused before training
        params = (
            param_groups
            if param_groups is not None
            else [p for m in modules.values() for p in m.parameters() if p.requires_grad]
        )
        self.optimizer = make_optimizer(params, args.learning_rate, args.weight_decay)
        self.guard = NonFiniteGuard(args.max_consecutive_skips)  # non-finite steps are skipped, counted
        self.scheduler = make_scheduler(
            self.optimizer,
            args.lr_scheduler,
            args.warmup_steps,
            schedule_steps if schedule_steps is not None else total_steps,
        )
        # The base model as built, before any step: checkpoints record it, resume_from must match it.
        self.base_model = model_fingerprint(modules)
        counters = self._resume(args.resume_from) if args.resume_from else None
        main = distributed.is_main()  # the other processes compute the same global metrics, silently
        self.logger = MetricsLogger(
            self.out_dir,
            args.log_every if main else 0,
            main_metric=self.main_metric,
            progress_bar=args.progress_bar and main,
            total_steps=total_steps,
            initial_step=int(counters["step"]) if counters else 0,
            config=args if main else None,
        )
        model = modules.get("policy", next(iter(modules.values()), None))
        self.callbacks.begin(
            total_steps,
            int(counters["step"]) if counters else 0,
            model=model,
            optimizer=self.optimizer,
            lr_scheduler=self.scheduler,
        )
        return counters

    # ---------------------------------------------------------------- each step
    def step_begin(self) -> None:
        """Before a trainer step: the callbacks' ``on_step_begin``."""
        self.step_start = time.perf_counter()
        self.callbacks.fire("on_step_begin")

    def step_end(self, step: int) -> bool:
        """After trainer step ``step`` (before its evaluation, log and checkpoint): ``on_step_end``;
        True when a callback set ``control.should_training_stop`` (on any process): the trainer
        ends the run after this step as after its last."""
        return self.callbacks.step_end(step) if self.callbacks else False

    def optimizer_step(self, loss: torch.Tensor | None = None) -> dict:
        """Clip, step (unless the loss or the gradient norm is not finite: ``NonFiniteGuard``; the
        schedule then does not advance either), check the new weights; the update's ``perf/*``
        metrics (``perf/lr``: the rate this update used)."""
        with trace.span("optimizer_step"):
            grad_norm, lr = optimizer_step(self.optimizer, self.scheduler, self.args.max_grad_norm, self.guard, loss)
        self.last_grad_norm = grad_norm
        return {"perf/lr": lr, "perf/grad_norm": grad_norm, "perf/skipped_steps": float(self.guard.skipped)}

    def log(self, step: int, metrics: dict) -> dict:
        """One row of ``metrics.jsonl`` (rank 0 writes it, every process gets it back as floats);
        the callbacks' ``on_evaluate`` and ``on_log``; a collapse said once (``collapse.py``)."""
        row = self.logger.log(step, metrics, self.total_steps)
        grad_norm = None if self.last_grad_norm is None else float(self.last_grad_norm)
        self.collapse.observe(step, grad_norm, row)
        if self.callbacks:
            self.callbacks.logged(row)
        return row

    @property
    def history(self) -> list[dict]:
        return self.logger.history

    def step_done(self, step: int, counters: Callable[[], dict]) -> None:
        """After trainer step ``step``: a checkpoint every ``save_steps`` (older ones pruned to
        ``save_total_limit``). ``counters``: the trainer's position, called only when saving."""
        args = self.args
        if args.output_dir and args.save_steps and step % args.save_steps == 0:
            with trace.span("checkpoint", step=step):
                self.save_checkpoint(Path(args.output_dir) / f"checkpoint-{step}", counters())
                if args.save_total_limit and self.out_dir:
                    prune_checkpoints(self.out_dir, args.save_total_limit, newest_step=step)
        if self.step_start is not None:  # the step, from step_begin: its phases nest inside
            trace.record("step", self.step_start, time.perf_counter(), {"step": step})
            self.step_start = None
        trace.flush()  # a crash keeps the timeline up to here

    # ---------------------------------------------------------------- checkpoints
    def settings(self) -> dict:
        """What a checkpoint records and a resumed run must share: the seed and the base model."""
        return {"seed": self.args.seed, "base_model": self.base_model}

    def save_checkpoint(self, path, counters: dict) -> None:
        """Every process calls this (DCP writes each process's shards); complete when it returns.
        ``counters`` must hold ``step``; the run adds ``skipped_steps``."""
        save_checkpoint(
            Path(path),
            self.modules,
            self.optimizer,
            self.scheduler,
            {**counters, "skipped_steps": self.guard.skipped},
            settings=self.settings(),
        )

    def _resume(self, path) -> dict:
        # Any number of processes; a rank the saved run did not have gets the seed a fresh run gives it.
        counters = load_checkpoint(
            path,
            self.modules,
            self.optimizer,
            self.scheduler,
            fresh_seed=self.args.seed + 1_000_003 * distributed.role_rank(),
            settings=self.settings(),
        )
        if int(counters.get("step", -1)) > self.total_steps:
            raise ValueError(
                f"resume_from={str(path)!r} is at step {counters['step']}, past this run's {self.total_steps} steps"
            )
        self.guard.skipped = int(counters.get("skipped_steps", 0))
        NEWEST[:] = [Path(path)]  # what an interrupt's line names (interrupts.py) until this run saves one
        return counters

    # ---------------------------------------------------------------- end
    def finish(self, save_final: Callable[[Path], None] | None = None) -> list[dict]:
        """``save_final(<output_dir>/final)`` (every process calls it: gathering is collective) and
        the plots when the run has a directory; the trackers closed; every process waits for the
        others (``distributed.finished``). Returns the logged rows."""
        if self.args.output_dir and save_final is not None:
            with trace.span("save_final"):
                save_final(Path(self.args.output_dir) / "final")
            finish_run(self.out_dir)
        self.collapse.summary()
        record_end(self.out_dir)  # run.json: the end time and duration of this session
        self.logger.close()
        self.callbacks.fire("on_train_end")
        trace.stop()  # every process's timeline is written before the barrier ...
        distributed.finished()
        if self.out_dir:  # ... so rank 0 can merge them
            trace.merge(self.out_dir)
        return self.logger.history


__all__ = ["Run"]
