"""Supervised fine-tuning: next-token cross-entropy on completion tokens only.

For an optimizer step over micro-batches ``k = 1..K`` (``grad_accumulation``) with completion
positions ``C`` (labels ≠ -100, after the shift: logits at ``t`` predict ``labels[t + 1]``)::

    loss = - Σ_{(b,t) ∈ C} log p_θ(x_{b,t+1} | x_{b,≤t}) / |C|

i.e. the mean over every completion token of the step, however the tokens fall into micro-batches
(each micro-batch backpropagates its token *sum* divided by the step's token count, so
accumulation gives the same gradient as one large batch — the fix of the 2024 gradient-accumulation
bug in transformers/TRL). Prompt tokens and padding never contribute. ``loss_type="dft"`` weights
each token's term by its probability, held constant (Dynamic Fine-Tuning: ``algorithms.sft_losses``).

Under torchrun (docs/architecture.md, "Scale-out") every process walks the same seeded data order and takes
the r-th slice of each step's ``batch_size * grad_accumulation`` units; ``|C|`` is all-reduced, and
each process backpropagates its token sum divided by ``|C|`` times the number of processes (FSDP2
and DDP average gradients), so N processes take the step one process takes. Metrics and the eval
loss are global; rank 0 alone writes the run directory.
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from .. import distributed
from ..algorithms.logprobs import entropy_from_logits
from ..algorithms.sft_losses import is_top1, sft_token_loss
from ..config.supervised import SFTConfig  # re-exported: rlhfkit.trainers.sft.SFTConfig
from ..data.chat_templates import resolve_chat_template, use_chat_template
from ..data.encode import Encoded
from ..data.sft import IGNORE_INDEX, collate_groups, encode_sft_rows, load_sft_dataset, training_units
from ..data.sft_tokens import check_token_ids
from ..models.activations import probe_ids
from ..models.lm_head import streamable, streamed_forward
from ..models.loading import eos_token_ids, load_pretrained
from ..models.lora import apply_lora, export_causal_lm, unsharded_template
from ..models.master_weights import back_to_float16, float32_masters
from ..models.packing import packable_model
from ..models.prompt_learning import is_prompt_learning, prefix_in_cache, virtual_positions
from ..models.sources import resolve_model_dir
from ..run.training import epoch_order
from .supervised import Datasets, SupervisedTrainer


class SFTTrainer(SupervisedTrainer):
    """``SFTTrainer(model, args=SFTConfig(...), train_dataset=..., eval_dataset=None, processing_class=None,
    peft_config=None)``

    ``model``: a local HF directory, a Hub id or a causal-LM object (then ``processing_class``, its
    tokenizer, is required; from a directory it is loaded when omitted). Datasets: a
    ``datasets.Dataset``, a list of dicts or a .jsonl / .json / .parquet path, rows
    ``{"prompt", "completion"}``, ``{"messages"}``, ``{"text"}`` or tokenised ``{"input_ids"}``
    (``data.sft``, ``data.sft_tokens``; multi-turn conversations with tool
    calls train every assistant turn, ``data.sft_turns``; ``args.chat_template`` replaces the
    tokenizer's template, ``data.chat_templates``). Data are loaded, checked and
    tokenised before the model is loaded, so a bad row fails fast. Dropout stays as the model has it.
    ``peft_config``: a ``peft`` config (e.g. ``LoraConfig``) to train an adapter instead of every
    weight; ``final/`` is then merged, or the adapter alone with ``save_adapter=True`` (a
    prompt-learning adapter always alone: ``models.prompt_learning``). A float16 model trains float32
    master weights and leaves in float16 (``models.master_weights``).
    ``callbacks``: ``transformers.TrainerCallback`` objects (``rlhfkit/run/callbacks.py``).
    """

    main_metric = "sft/loss"
    load_rows = staticmethod(load_sft_dataset)
    args: SFTConfig

    def __init__(
        self,
        model,
        args: SFTConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        peft_config=None,
        callbacks=None,
    ):
        args = _prompt_learning_args(args or SFTConfig(), model if peft_config is None else peft_config)
        super().__init__(model, args, train_dataset, eval_dataset, processing_class, peft_config, callbacks)

    def _check_inputs(self, model, processing_class, **sources) -> None:
        """The model and tokenizer as given, each process's equal share of a step's rows, the chat template."""
        self._check_model(model, processing_class)
        rows_per_step, world = self._rows_per_step(), distributed.planned_world()
        if rows_per_step % world:
            raise ValueError(
                f"batch_size x grad_accumulation = {rows_per_step} must be divisible by the number of "
                f"processes ({world}): each process trains on an equal share of every step's rows"
            )
        resolve_chat_template(self.args.chat_template)  # a bad value is one line before anything is loaded

    def _load_tokenizer(self, model, processing_class) -> None:
        """The tokenizer with ``chat_template`` (saved with the model in final/), and the ids that end the
        model's turns (where a chat row's assistant turns end)."""
        super()._load_tokenizer(model, processing_class)
        use_chat_template(self.tokenizer, self.args.chat_template)
        self.end_ids = _end_ids(model, self.tokenizer)

    def _encode_inputs(self, datasets: Datasets) -> None:
        """The examples, and the training units: a unit is one row of a batch, one example or one packed row
        of ``max_length``."""
        a = self.args
        train_rows, eval_rows = self._rows(datasets)
        train = self._encode_rows(train_rows, "train_dataset")
        self.eval_examples = self._encode_rows(eval_rows, "eval_dataset") if eval_rows is not None else None
        self.units = training_units(train, a.packing, a.packing_strategy, a.max_length)
        self._unchecked = (("train_dataset", train), ("eval_dataset", self.eval_examples or []))  # _build_model's

    def _build_model(self, model, peft_config, **sources) -> None:
        """The model (dropout as it has it), its examples' token ids checked against its vocabulary, a
        LoRA adapter with ``peft_config``, float32 masters of float16 weights (``models.master_weights``),
        then placed (the process group starts there), its LM head probed (``models.lm_head``) and sharded."""
        args = self.args
        model = _load_model(model, args.dtype) if isinstance(model, (str, os.PathLike)) else model
        vocab = model.get_input_embeddings().num_embeddings  # a tokenised row's ids must be the model's
        for name, examples in self._unchecked:
            check_token_ids(examples, vocab, name)
        del self._unchecked
        if peft_config is not None:
            model = apply_lora(model, peft_config)
        self._float16 = float32_masters(model)
        self._checkpoint_activations(model, peft_config is not None)
        # The process group starts here, after every check that could fail the same way on every rank.
        self.model = model.to(distributed.setup(args.device))
        streamable(self.model, args.lm_head)  # the head's probe runs now, at setup (models.lm_head)
        self._template = unsharded_template(self.model)  # LoRA under torchrun: merged from this copy
        self.device = next(self.model.parameters()).device
        # The module training and eval passes go through: the model itself (sharded in place by
        # FSDP2, or as it is in a single process) or its DDP wrapper. ``self.model`` stays the model.
        self.train_model = distributed.shard(self.model, args.parallelism)

    def _total_steps(self) -> int:
        """``max_steps``, else ``num_epochs`` over the training units."""
        args = self.args
        epochs = max(1, math.ceil(args.num_epochs * len(self.units) / self._rows_per_step()))
        return args.max_steps if args.max_steps is not None else epochs

    def _before_training(self, total_steps: int) -> None:
        """The data order's start (``_restore`` moves it on a resumed run)."""
        self.epoch, self.data_pos, self.units_seen = 0, 0, 0
        self.order = self._epoch_order(0)

    def _open_run(self, model, datasets: Datasets, peft_config=None, **sources) -> None:
        """The record names the loaded model (``models.sources.model_source``: its directory), not the path given."""
        super()._open_run(self.model, datasets, peft_config, **sources)

    def _encode_rows(self, rows: list[dict], name: str) -> list[Encoded]:
        """The checked rows as training examples (``encode_sft_rows``: its truncation cuts a long
        row's prompt start first; none for wrapped packing's training rows, which are cut into rows
        whole); the TRL drop-in overrides it with TRL's tokens and truncation."""
        a = self.args
        wrapped = a.packing and a.packing_strategy == "wrapped" and name == "train_dataset"
        return encode_sft_rows(
            rows,
            self.tokenizer,
            None if wrapped else a.max_length,
            name,
            completion_only=a.completion_only_loss,
            assistant_only=a.assistant_only_loss,
            end_ids=self.end_ids,
        )

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict]:
        """Run ``total_steps`` optimizer steps; returns one metrics dict per step."""
        args = self.args
        self.train_model.train()
        while self.step < self.total_steps:
            self.run.step_begin()
            metrics = self._train_step(self._next_units(args.batch_size * args.grad_accumulation))
            self.step += 1
            stop = self.run.step_end(self.step)  # a callback's should_training_stop: this step is the last
            last = stop or self.step == self.total_steps
            if self.eval_examples is not None and (last or (args.eval_every and self.step % args.eval_every == 0)):
                metrics.update(self.evaluate())
            self._log_step(self.step, metrics)
            self._step_done()
            if stop:
                break
        if self.total_steps == 0 and self.eval_examples is not None:  # max_steps=0: still report the eval loss
            self.run.log(0, self.evaluate())
        back_to_float16(self._float16)  # the model leaves the run in the dtype it came in
        return self._finish()  # final/ (every process takes part in gathering), plots, trackers

    def _train_step(self, units: list[list[Encoded]]) -> dict:
        """One optimizer step over the step's units (of every process): this process takes its
        slice, in micro-batches of ``batch_size / N`` rows (rounded up); token-mean loss of the step.

        Every process holds as many units, so each runs the same number of (FSDP2: collective)
        forward and backward passes; DDP synchronises gradients on the last micro-batch only."""
        args, world, rank = self.args, distributed.role_size(), distributed.role_rank()
        share = len(units) // world  # divisible: checked at construction
        mine, size = units[rank * share : (rank + 1) * share], -(-args.batch_size // world)
        batches = [self._collate(mine[i : i + size]) for i in range(0, len(mine), size)]
        local_tokens = sum(int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in batches)
        n_tokens = max(1, int(distributed.sum_floats([local_tokens])[0]))
        total, stats = torch.zeros((), device=self.device), dict[str, float]()
        for i, batch in enumerate(batches):
            with distributed.no_sync(self.train_model) if i < len(batches) - 1 else nullcontext():
                loss_sum, _ = self.loss_sum(batch, packed=args.packing, stats=stats)
                (loss_sum / n_tokens * world).backward()  # FSDP2 and DDP average gradients over processes
            total += loss_sum.detach()
        total = distributed.reduce_sum(total)
        entropy, top1 = distributed.sum_floats([stats.get("entropy", 0.0), stats.get("top1", 0.0)])
        perf = self.run.optimizer_step(total)
        return {
            "sft/loss": total / n_tokens,
            "sft/entropy": entropy / n_tokens,
            "sft/token_accuracy": top1 / n_tokens,
            "sft/lr": perf["perf/lr"],
            "sft/grad_norm": perf["perf/grad_norm"],
            "sft/tokens": float(n_tokens),
            "sft/epoch": self.units_seen / len(self.units),
            "perf/skipped_steps": perf["perf/skipped_steps"],
        }

    def _probe(self, n: int) -> torch.Tensor:
        """The training loss of one synthetic row of ``n`` tokens, all completion (the memory probe)."""
        ids = probe_ids(self.model, n)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(n)[None]}
        return self.loss_sum({**batch, "labels": ids})[0]

    def loss_sum(self, batch: dict, packed: bool = False, stats: dict | None = None) -> tuple[torch.Tensor, int]:
        """(Σ per-token loss over the batch's completion tokens, their count); logits in float32. The
        loss is ``args.loss_type``'s (``algorithms.sft_token_loss``: the cross-entropy for 'nll').
        ``stats``: adds to its ``entropy`` the tokens' summed entropy and to its ``top1`` how many are
        the model's most likely token (``algorithms.is_top1``), without gradient.

        ``packed``: call the model with ``attention_mask=None`` and the position ids, from which
        transformers builds a block-diagonal causal mask (one block per packed example)."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        inputs = dict(
            input_ids=batch["input_ids"],
            attention_mask=None if packed else batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        )
        if not packed and packable_model(self.model, batch["input_ids"].shape[1]):
            # One example per row, padded at its end: the causal mask alone is exact for its tokens, so
            # no mask (SDPA's fused causal kernels, no (B, 1, L, L) mask: models.aligned); positions 0, 1, ...
            inputs.update(attention_mask=None, position_ids=None)
        targets = batch["labels"][:, 1:]
        keep = targets != IGNORE_INDEX
        skip = virtual_positions(self.model)  # prompt tuning's virtual tokens come first in the output
        logprobs, measure, target = None, stats is not None, targets[keep]
        with self._autocast(), self._memory_pass(*batch["input_ids"].shape):
            # the LM head in chunks where the model allows: no (tokens, vocab) logits (models.lm_head)
            if streamable(self.train_model, self.args.lm_head):
                _, (logprobs, entropy, top) = streamed_forward(
                    self.train_model, lambda h: h[:, skip:-1][keep], target, with_entropy=measure,
                    support=(1, 1.0) if measure else None, **inputs,
                )  # fmt: skip
                top1 = is_top1(logprobs, top) if top is not None else None  # measured: support given
            else:
                logits = self.train_model(**inputs).logits
        if logprobs is None:  # only completion positions reach the (N, vocab) float32 cast: no (B, L, V) copy
            chosen = logits[:, skip:-1][keep].float()
            logprobs = -F.cross_entropy(chosen, target, reduction="none")
            if measure:
                entropy, top1 = entropy_from_logits(chosen.detach()), chosen.detach().argmax(-1) == target
        if stats is not None:
            assert entropy is not None and top1 is not None  # measured above
            stats["entropy"] = stats.get("entropy", 0.0) + float(entropy.sum())
            stats["top1"] = stats.get("top1", 0.0) + float(top1.sum())
        return sft_token_loss(logprobs, self.args.loss_type).sum(), int(keep.sum())

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Over every completion token of the eval set (one example per row, right-padded: exact for
        any model), in eval mode (training mode restored after): ``eval/loss``, the mean per-token
        loss (``loss_type``'s), ``eval/entropy`` and ``eval/token_accuracy`` (the share of tokens
        that are the model's most likely one), as the training rows' ``sft/*``.

        Under torchrun each process scores its slice of the eval set and the sums are all-reduced;
        every process must call this (a process with fewer batches scores stand-ins, discarded,
        so all run the same number of forward passes)."""
        if self.eval_examples is None:
            raise ValueError("evaluate() needs an eval_dataset")
        was_training = self.model.training
        self.train_model.eval()
        world, rank, n = distributed.role_size(), distributed.role_rank(), len(self.eval_examples)
        mine, size = self.eval_examples[n * rank // world : n * (rank + 1) // world], -(-self.args.batch_size // world)
        chunks = [mine[i : i + size] for i in range(0, len(mine), size)]
        total, count, stats = 0.0, 0, dict[str, float]()
        for i in range(distributed.reduce_max(len(chunks))):
            real = i < len(chunks)
            batch = collate_groups(
                [[e] for e in (chunks[i] if real else self.eval_examples[:1])], self.tokenizer.pad_token_id
            )
            loss_sum, k = self.loss_sum(batch, stats=stats if real else {})
            if real:
                total, count = total + float(loss_sum), count + k
        self.train_model.train(was_training)
        loss, tokens, entropy, top1 = distributed.sum_floats(
            [total, count, stats.get("entropy", 0.0), stats.get("top1", 0.0)]
        )
        tokens = max(tokens, 1)
        return {"eval/loss": loss / tokens, "eval/entropy": entropy / tokens, "eval/token_accuracy": top1 / tokens}

    # ---------------------------------------------------------------- data order and saving
    def _collate(self, units: list[list[Encoded]]) -> dict:
        length = self.args.max_length if self.args.packing else None
        return collate_groups(units, self.tokenizer.pad_token_id, length)

    def _next_units(self, n: int) -> list[list[Encoded]]:
        """The next ``n`` training units of a seeded per-epoch shuffle (epochs roll over mid-step)."""
        out: list[list[Encoded]] = []
        while len(out) < n:
            if self.data_pos >= len(self.order):
                self.epoch, self.data_pos = self.epoch + 1, 0
                self.order = self._epoch_order(self.epoch)
            out.append(self.units[self.order[self.data_pos]])
            self.data_pos += 1
        self.units_seen += n
        return out

    def _epoch_order(self, epoch: int) -> list[int]:
        return epoch_order(self.args.seed, epoch, len(self.units))

    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model}

    def _counters(self) -> dict:
        return {**super()._counters(), "epoch": self.epoch, "data_pos": self.data_pos, "units_seen": self.units_seen}

    def _restore(self, counters: dict) -> None:
        super()._restore(counters)
        self.epoch, self.data_pos, self.units_seen = counters["epoch"], counters["data_pos"], counters["units_seen"]
        self.order = self._epoch_order(self.epoch)

    def save_model(self, path) -> None:
        """Model and tokenizer as a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA:
        merged, or the adapter alone with ``save_adapter``; a prompt-learning adapter, which nothing
        merges, always alone: ``models.prompt_learning``). Under torchrun every process must call
        this: the full weights are gathered, rank 0 writes."""
        adapter = self.args.save_adapter or is_prompt_learning(self.model)
        dtype = torch.float16 if self._float16 else None  # a float16 model leaves in float16
        export_causal_lm(self.model, path, self.tokenizer, adapter, self._template, dtype)


def _prompt_learning_args(args: SFTConfig, adapter) -> SFTConfig:
    """``args`` for a prompt-learning ``adapter`` (a peft config or a peft model; anything else:
    ``args`` as they are, ``models.prompt_learning``): packing refused (the virtual tokens come once
    a row, and peft drops the position ids that separate packed examples); with prefix tuning,
    activation checkpointing refused when 'on' and off under 'auto' (a recomputed layer runs without
    the key-value cache that holds the prefix)."""
    if not is_prompt_learning(adapter):
        return args
    if args.packing:
        raise ValueError(
            "packing=True is not supported with a prompt-learning adapter (prompt tuning, P-tuning, prefix "
            "tuning): its virtual tokens come once a row, not once a packed example; set packing=False"
        )
    if prefix_in_cache(adapter) and args.gradient_checkpointing != "off":
        if args.gradient_checkpointing == "on":
            raise ValueError(
                "gradient_checkpointing is not supported with prefix tuning: a recomputed layer runs without the "
                "key-value cache that holds the prefix; turn gradient_checkpointing off"
            )
        return args.replace(gradient_checkpointing="off")
    return args


def _end_ids(model, tokenizer) -> tuple[int, ...]:
    """The ids that end the model's turns (``eos_token_ids(tokenizer, model)``); for a model path,
    read before the model is loaded from what transformers will give it: its
    ``generation_config.json``, else a generation config built from its ``config.json``."""
    if isinstance(model, torch.nn.Module):
        return eos_token_ids(tokenizer, model)
    from transformers import AutoConfig, GenerationConfig

    source = resolve_model_dir(model)
    for read in (
        GenerationConfig.from_pretrained,
        lambda s: GenerationConfig.from_model_config(AutoConfig.from_pretrained(s)),
    ):
        try:
            return eos_token_ids(tokenizer, read(source))
        except (OSError, ValueError):  # no such file (an adapter directory has neither)
            pass
    return eos_token_ids(tokenizer)


def _load_model(path, dtype: str):
    """``AutoModelForCausalLM`` from a local directory or Hub id (checked first: a typo is one clear line).
    Unlike ``load_causal_lm`` (RL), dropout is kept: SFT needs no identical log-probs across passes."""
    from transformers import AutoModelForCausalLM

    return load_pretrained(AutoModelForCausalLM, path, dtype)


__all__ = ["SFTConfig", "SFTTrainer"]
