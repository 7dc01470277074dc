"""What the trainers on fixed data (SFT, reward model, DPO, KTO) share: their one construction path
(``SupervisedTrainer.__init__``), the run directory and its record, the optimizer and schedule,
checkpoints every ``save_steps`` (``run/checkpoint.py``: DCP shards of the trainable weights and
AdamW's state, the schedule, every process's RNG, the loop's counters), ``resume_from``, and the
metrics logger with its trackers.

A resumed run ends with the weights of the uninterrupted one: the checkpoint restores every
input of the remaining steps — weights, optimizer moments, the learning-rate schedule, the RNG
states (dropout masks) and the position in the seeded data order (``_counters``).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, cast

import torch

from .. import distributed
from ..config.supervised import TrainConfig
from ..models.activations import checkpointable_layers, decoder_layer_count, measure_activation_cost
from ..models.loading import enable_activation_checkpointing, load_tokenizer
from ..models.memory import MemoryPlan
from ..run.lifecycle import Run
from ..run.training import seed_everything

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# A run's datasets by name: (the dataset as given, its rows read and checked; None when not given).
Datasets = dict[str, tuple[Any, list[dict] | None]]


class SupervisedTrainer:
    """Base of ``SFTTrainer``, ``RewardModelTrainer``, ``DPOTrainer`` and ``KTOTrainer``. Each is built
    by ``__init__`` here, the one construction path, whose steps that are a trainer's own are the
    hooks it overrides (``_check_inputs``, ``_read_inputs``, ``_encode_inputs``, ``_build_model``,
    ``_total_steps``, ``_before_training``). Then it calls ``self.run.optimizer_step`` per update,
    ``self.run.log`` and ``_step_done`` after each step and ``_finish`` at the end; it names what a
    checkpoint holds with ``_trained_modules`` and ``_counters`` / ``_restore``. The lifecycle itself
    is the ``Run`` it holds (``run/lifecycle.py``), the same object the RL trainer holds."""

    main_metric = "loss"
    # what the training rows hold, said when train_dataset is missing
    train_rows_hold = " (a datasets.Dataset, a list of dicts or a data file path)"
    # the rows of a dataset (``load(dataset, name)``: read and checked; the trainer's format)
    load_rows: Callable[[Any, str], list[dict]]
    args: TrainConfig
    run: Run
    tokenizer: Any
    model: torch.nn.Module  # the model trained (a peft model of it with LoRA)
    device: torch.device  # set by ``_build_model`` once the model is placed
    memory: MemoryPlan  # the activation policy (_plan_memory)
    n_items: int  # the training items a step draws from (``_batch``), set by ``_encode_inputs``
    steps_per_epoch: int
    total_steps: int
    step: int

    def __init__(
        self,
        model,
        args: TrainConfig,
        train_dataset,
        eval_dataset=None,
        processing_class=None,
        peft_config=None,
        callbacks=None,
        **sources,
    ):
        """The construction every trainer on fixed data goes through, in this order:

        1. what needs nothing loaded: ``train_dataset`` given, the trainer's own refusals
           (``_check_inputs``), every dataset read and checked (``_read_inputs``), the ``Run``
           (``_check_run``: its refusals, nothing written yet);
        2. the tokenizer (``_load_tokenizer``), the rows tokenised (``_encode_inputs``);
        3. the same initial weights on every process (``args.seed``), the model built
           (``_build_model``: loaded, adapted, placed, sharded), its memory plan (``_plan_memory``,
           before the per-process seeds: it draws nothing);
        4. what the first step needs besides (``_before_training``: a precomputed reference), a seed
           per process (dropout masks differ from process to process), the run directory and its
           record (``_open_run``), and the optimizer, schedule and resume (``_start_training``) over
           ``_total_steps()`` steps.

        ``sources``: the trainer's further inputs (``ref_model``, ``center_dataset``), given to the hooks;
        the record names those that are not datasets (``_read_inputs``'s) as sources."""
        self.args = args
        if train_dataset is None:
            raise ValueError(f"train_dataset is required{self.train_rows_hold}")
        self._check_inputs(model, processing_class, **sources)
        datasets = self._read_inputs(train_dataset, eval_dataset, **sources)
        self._check_run(callbacks)
        self._load_tokenizer(model, processing_class)
        self._encode_inputs(datasets)
        seed_everything(self.args.seed)  # the same initial weights on every process
        self._build_model(model, peft_config, **sources)
        self._plan_memory(self.model, self._probe, self.args.max_length)
        total = self._total_steps()
        self._before_training(total)
        if distributed.role_size() > 1:  # dropout masks differ from process to process
            seed_everything(self.args.seed + 1_000_003 * distributed.role_rank())
        self._open_run(model, datasets, peft_config, **{k: v for k, v in sources.items() if k not in datasets})
        self._start_training(total)

    # ---------------------------------------------------------------- the construction's hooks
    def _check_inputs(self, model, processing_class, **sources) -> None:
        """The trainer's refusals that need nothing loaded (the model and tokenizer as given, the
        batch's share per process, its own options). Like ``_read_inputs`` and ``_build_model`` it is
        given every further input (``sources``) and names those it reads."""
        raise NotImplementedError

    def _read_inputs(self, train_dataset, eval_dataset, **sources) -> Datasets:
        """Every dataset as given and its rows (``load_rows``): the training set, the evaluation set
        when given (a trainer with more overrides this)."""
        return {
            "train_dataset": (train_dataset, self.load_rows(train_dataset, "train_dataset")),
            "eval_dataset": (
                eval_dataset,
                self.load_rows(eval_dataset, "eval_dataset") if eval_dataset is not None else None,
            ),
        }

    @staticmethod
    def _rows(datasets: Datasets) -> tuple[list[dict], list[dict] | None]:
        """The training rows and the evaluation rows (None: no evaluation set) of ``_read_inputs``'s datasets."""
        train, evals = datasets["train_dataset"][1], datasets["eval_dataset"][1]
        assert train is not None  # train_dataset is required (__init__)
        return train, evals

    def _load_tokenizer(self, model, processing_class) -> None:
        """``processing_class``, else the tokenizer of the model's directory."""
        self.tokenizer = load_tokenizer(
            processing_class if processing_class is not None else model,
            "model" if processing_class is None else "processing_class",
        )

    def _encode_inputs(self, datasets: Datasets) -> None:
        """The rows tokenised and length-checked, as the trainer's steps read them; sets ``n_items``."""
        raise NotImplementedError

    def _build_model(self, model, peft_config, **sources) -> None:
        """The trained model loaded (``model``: a path or an object), adapted (``peft_config``), placed
        on its device (``distributed.setup``: the process group starts there) and sharded; sets
        ``model`` and ``device``."""
        raise NotImplementedError

    def _probe(self, n: int) -> torch.Tensor:
        """The training pass with gradient over one synthetic row of ``n`` tokens, a scalar out (the memory
        probe, ``_plan_memory``)."""
        raise NotImplementedError

    def _total_steps(self) -> int:
        """The run's optimizer steps: ``max_steps``, else ``num_epochs`` over the ``n_items`` training
        items, ``batch_size x grad_accumulation`` a step (sets ``steps_per_epoch``)."""
        args = self.args
        self.steps_per_epoch = math.ceil(self.n_items / self._rows_per_step())
        return (
            args.max_steps if args.max_steps is not None else max(1, math.ceil(args.num_epochs * self.steps_per_epoch))
        )

    def _before_training(self, total_steps: int) -> None:
        """What the first step needs besides the model, computed before the per-process seeds (none here)."""

    # ---------------------------------------------------------------- the run
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

    def _check_batch_share(self, items: str) -> None:
        """Every process scores an equal share of each step's ``batch_size`` ``items``: one line otherwise."""
        world, size = distributed.planned_world(), self.args.batch_size
        if size % world:
            raise ValueError(
                f"batch_size={size} must be divisible by the number of processes ({world}): "
                f"each process scores an equal share of every step's {items}"
            )

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
                cast("PreTrainedModel", model).enable_input_require_grads()  # (a peft model forwards it)

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

    def save_model(self, path) -> None:
        """The trained model as a directory its loader reads (each trainer's); every process calls this."""
        raise NotImplementedError

    def _finish(self) -> list[dict]:
        """``final/`` and the plots, the trackers closed, every process waiting (``Run.finish``)."""
        return self.run.finish(self.save_model)
