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
from collections.abc import Callable
from contextlib import nullcontext

import torch

from .. import distributed
from ..models.activations import checkpointable_layers, decoder_layer_count, measure_activation_cost
from ..models.loading import enable_activation_checkpointing
from ..models.memory import MemoryPlan
from ..run.lifecycle import Run


class SupervisedTrainer:
    """Base of ``SFTTrainer``, ``RewardModelTrainer`` and ``DPOTrainer``. A subclass sets ``args``,
    calls ``_check_run`` before loading anything, ``_open_run`` and ``_start_training`` once its
    model is built and sharded, ``self.run.optimizer_step`` per update, ``self.run.log`` and
    ``_step_done`` after each step and ``_finish`` at the end; it names what a checkpoint holds with
    ``_trained_modules`` and ``_counters`` / ``_restore``. The lifecycle itself is the ``Run`` it
    holds (``run/lifecycle.py``), the same object the RL trainer holds."""

    main_metric = "loss"
    device: torch.device  # set by the subclass once its model is placed
    memory: MemoryPlan  # the activation policy (_plan_memory)

    def _check_run(self, callbacks=None) -> None:
        """Before anything loads: the ``Run`` (device, ``resume_from='latest'``, the run
        directory's refusals, the ``callbacks``) — nothing is written yet."""
        self.run = Run(self.args, self.main_metric, callbacks)
        self.args, self.out_dir = self.run.args, self.run.out_dir

    def _open_run(self, model, datasets: dict, peft_config=None, **sources) -> None:
        """Once the model and data have loaded: the run directory and its record (``Run.open``)."""
        self.run.open(model, datasets, peft_config=peft_config, **sources)

    def _start_training(self, total_steps: int) -> None:
        """Optimizer, schedule, guard, resume and logger (``Run.start``) over the trained modules."""
        self.total_steps, self.step = total_steps, 0
        counters = self.run.start(self._trained_modules(), total_steps, param_groups=self._param_groups())
        if counters is not None:
            self._restore(counters)
        self.memory.optimizer = self.run.optimizer  # its moments count once they exist

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
            raise ValueError(
                f"{name}: every pair is longer than max_length={limit} tokens even with its prompt "
                "cut; raise max_length"
            )
        if dropped:
            warnings.warn(
                f"{name}: dropped {dropped} of {total} pairs whose completion does not fit in "
                f"max_length={limit} tokens",
                stacklevel=3,
            )
        return pairs

    def _batch(self, step: int) -> list[int]:
        """Item indices of optimizer step ``step`` (1-based): ``batch_size x grad_accumulation`` at a
        time over seeded per-epoch shuffles of ``self.n_items`` (the last batch of an epoch may be
        smaller). A function of the step alone, so a resumed run continues the order."""
        epoch, index = divmod(step - 1, self.steps_per_epoch)
        gen = torch.Generator().manual_seed(self.args.seed * 100003 + epoch)
        return torch.randperm(self.n_items, generator=gen).split(self._rows_per_step())[index].tolist()

    def _rows_per_step(self) -> int:
        return self.args.batch_size * self.args.grad_accumulation

    def _micro_batches(self, mine: list, n: int) -> list[list]:
        """This process's share ``mine`` of a step's ``n`` items in micro-batches of ``batch_size / N``
        (rounded up); every process gets as many (FSDP2's passes are collectives), an empty one where
        its share runs out first (the caller scores a stand-in with weight 0)."""
        world = distributed.role_size()
        size, share = -(-self.args.batch_size // world), -(-n // world)  # the largest share
        passes = max(1, -(-share // size))
        return [mine[k * size : (k + 1) * size] for k in range(passes)]

    # ---------------------------------------------------------------- precision and memory
    def _autocast(self):
        """``torch.autocast`` in ``args.autocast`` around forward passes, or nothing."""
        if self.args.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.args.autocast))

    def _checkpoint_activations(self, model: torch.nn.Module, lora: bool) -> None:
        """``gradient_checkpointing`` 'on' or 'auto': each block can recompute its activations in
        backward (a LoRA model's frozen embeddings must then pass gradients on); whether a pass does
        is the memory plan's call (``_plan_memory``)."""
        if self.args.gradient_checkpointing != "off":
            enable_activation_checkpointing(model)
            if lora:
                model.enable_input_require_grads()

    def _plan_memory(self, model: torch.nn.Module, probe: Callable[[int], torch.Tensor], longest: int) -> None:
        """The activation policy (``models.memory.MemoryPlan``) of the trained ``model``: under 'auto'
        the activation cost of ``probe(n)`` (the trainer's own pass with gradient on one row of ``n``
        tokens, a scalar out) measured first; a ``longest``-token row that cannot fit is refused now.
        Every process calls this (the probe's backward is a collective under DDP and FSDP2)."""
        mode, layers = self.args.gradient_checkpointing, checkpointable_layers(model)
        cost = None
        if mode == "auto":
            cost = measure_activation_cost(probe, [model], layers, True, decoder_layer_count(model))
        self.memory = MemoryPlan(mode, cost, self.device, self.args.memory_budget_gb, layers, [model])
        self.memory.check_row(longest, "row")

    def _log_step(self, step: int, metrics: dict) -> None:
        """A training step's row (``Run.log``), with the memory plan's (``perf/checkpointed_frac``)."""
        self.run.log(step, {**metrics, **self.memory.metrics()})

    def _memory_pass(self, rows: int, width: int):
        """The context of a forward pass over ``rows`` rows of ``width`` tokens: with gradient, its
        layers checkpointed or not as the memory plan says; without, nothing."""
        memory = getattr(self, "memory", None)  # None while the probe runs
        if memory is None or not torch.is_grad_enabled():
            return nullcontext()
        return memory.pass_context(rows, width)

    # ---------------------------------------------------------------- checkpoints
    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        """The modules whose trainable parameters the optimizer updates and checkpoints hold."""
        raise NotImplementedError

    def _param_groups(self) -> list | None:
        """AdamW's parameters (None: every trainable parameter of ``_trained_modules``)."""
        return None

    def _counters(self) -> dict:
        """The loop's position, saved last in a checkpoint (``trainer_state.json``)."""
        return {"step": self.step}

    def _restore(self, counters: dict) -> None:
        self.step = int(counters["step"])

    def _step_done(self) -> None:
        """After optimizer step ``self.step``: a checkpoint when one is due (``Run.step_done``)."""
        self.run.step_done(self.step, self._counters)

    def save_checkpoint(self, path) -> None:
        """Every process calls this (DCP writes each process's shards); complete when it returns."""
        self.run.save_checkpoint(path, self._counters())

    def _finish(self) -> list[dict]:
        """``final/`` and the plots, the trackers closed, every process waiting (``Run.finish``)."""
        return self.run.finish(self.save_model)
