"""What the DPO and KTO trainers share: a causal-LM policy trained on fixed data against a frozen
reference (``dpo_reference.DPOReference``). Built on ``SupervisedTrainer``'s construction path, they
build their two models alike (``PreferenceTrainer._build_model``), run the same loop (a step's and an
evaluation's micro-batches included), probe memory with the same pass and save the same way; each keeps
its data, its loss of a micro-batch, its metrics and its precomputed reference."""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any

import torch

from .. import distributed
from ..config.supervised import DPOConfig, KTOConfig
from ..models import forward_response, load_causal_lm
from ..models.activations import probe_ids
from ..models.lm_head import streamable
from ..models.loading import disable_dropout
from ..models.lora import apply_lora, export_causal_lm, unsharded_template
from ..models.master_weights import back_to_float16, float32_masters
from .dpo_reference import DPOReference
from .supervised import SupervisedTrainer


class PreferenceTrainer(DPOReference, SupervisedTrainer):
    """Base of ``DPOTrainer`` and ``KTOTrainer``. A subclass names its config (``args_class``) and its
    metrics' prefix (``loop_name``), and gives its items (``_train_set``, ``_eval_set``,
    ``_eval_items``), the losses of one micro-batch (``_micro_batch``) and the metrics of several
    (``_step_metrics``), besides ``SupervisedTrainer``'s hooks and ``DPOReference``'s ``_logps``: the
    training step and the evaluation run their micro-batches here."""

    args: DPOConfig | KTOConfig
    loop_name: str  # the prefix of the loop's own metrics: "dpo", "kto"
    args_class: type[DPOConfig] | type[KTOConfig]  # the config when none is given

    def __init__(
        self,
        model,
        args: DPOConfig | KTOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        ref_model=None,
        peft_config=None,
        callbacks=None,
    ):
        """The signature of both trainers (their docstrings); ``args`` None: ``args_class()``'s defaults."""
        args = args or self.args_class()
        super().__init__(
            model, args, train_dataset, eval_dataset, processing_class, peft_config, callbacks, ref_model=ref_model
        )

    def _build_model(self, model, peft_config, ref_model=None, **sources) -> None:
        """The policy (dropout off, as TRL's ``disable_dropout``: the implicit rewards must not be noise; a
        LoRA adapter with ``peft_config``) on its device — the process group starts there, after every
        check that could fail the same way on every rank —, then the reference (``_build_reference``,
        before the policy's float32 masters: a frozen reference keeps the weights' dtype), each model's
        LM-head probe (``models.lm_head``, before sharding: each process alone), activation checkpointing
        (after the reference's copy) and the sharded policy and reference."""
        args = self.args
        policy = load_causal_lm(model, args.dtype if isinstance(model, (str, os.PathLike)) else None)
        if peft_config is not None:
            policy = disable_dropout(apply_lora(policy, peft_config))
        self.model = policy.to(distributed.setup(args.device))
        self.device = next(self.model.parameters()).device
        self._build_reference(ref_model)
        self._float16 = float32_masters(self.model)  # float16 weights train as float32 masters (models.master_weights)
        for m in (self.model, self.reference):
            if m is not None:
                streamable(m, args.lm_head)
        self._checkpoint_activations(self.model, peft_config is not None)
        self._template = unsharded_template(self.model)  # LoRA under torchrun: merged from this copy
        self.train_model = distributed.shard(self.model, args.parallelism)
        if self.reference is not None and args.parallelism == "fsdp":
            distributed.shard(self.reference, "fsdp")
        self.train_model.train()

    def _probe(self, n: int) -> torch.Tensor:
        """The policy's pass with gradient over one synthetic row of ``n`` tokens (the memory probe)."""
        ids = probe_ids(self.model, n, self.device)
        with self._autocast():
            return forward_response(
                self.train_model, ids, torch.ones_like(ids), n - 1, lm_head=self.args.lm_head
            ).logprobs.sum()

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict]:
        """Train; returns one dict of metrics per step (as in metrics.jsonl)."""
        args = self.args
        self._reference_begin()
        while self.step < self.total_steps:
            self.run.step_begin()
            self.step += 1
            metrics = self._step(self._batch(self.step))
            self._reference_step()
            metrics[f"{self.loop_name}/epoch"] = self.step / self.steps_per_epoch
            stop = self.run.step_end(self.step)  # a callback's should_training_stop: this step is the last
            last = stop or self.step == self.total_steps
            if self._has_eval_set() and (last or (args.eval_every and self.step % args.eval_every == 0)):
                metrics.update(self.evaluate())
            self._log_step(self.step, metrics)
            self._step_done()
            if stop:
                break
        if self.total_steps == 0 and self._has_eval_set():
            self.run.log(0, self.evaluate())
        back_to_float16(self._float16)  # the policy leaves the run in the dtype it came in
        return self._finish()  # final/ (every process takes part in gathering), plots, trackers

    def _step(self, indices: list[int]) -> dict:
        """One optimizer step on the step's training items ``indices`` (of every process); its metrics.
        This process scores its slice in micro-batches of ``batch_size / N`` items (``grad_accumulation``
        of them, ``_micro_batch``), each backpropagating its share of the mean over the step's items,
        ``x N`` (FSDP2 and DDP average the processes' gradients: N processes take the step one process
        takes); a process left without items for one scores a stand-in (the step's first item) with
        weight 0, so that every process runs as many passes. DDP synchronises gradients on the last
        micro-batch only. ``_step_metrics`` reads every micro-batch's part, stand-ins included."""
        self.train_model.train()
        world, rank, n = distributed.role_size(), distributed.role_rank(), len(indices)
        mine = indices[n * rank // world : n * (rank + 1) // world]
        chunks, parts, items = self._micro_batches(mine, n), [], self._train_set()
        for k, chunk in enumerate(chunks):
            with distributed.no_sync(self.train_model) if k < len(chunks) - 1 else nullcontext():
                losses, part = self._micro_batch([items[i] for i in chunk or indices[:1]], counted=bool(chunk))
                (losses.sum() * (world / n if chunk else 0.0)).backward()
            parts.append(part)
        metrics = self._step_metrics(parts, len(mine))
        return {**metrics, **self.run.optimizer_step(metrics[f"{self.loop_name}/loss"])}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The step's metrics over ``eval_dataset`` as ``eval/loss``, ``eval/rewards/chosen``, ... (the
        ``<loop_name>/`` prefix dropped): this process's slice in micro-batches of ``batch_size / N`` items
        in the dataset's order (``_eval_chunks``), as many passes on every process (a stand-in, the first
        item, counted 0, where a process's slice runs out). With ``precompute_ref_logprobs`` the
        reference first scores the items it has not (a set given after the trainer was built)."""
        items = self._eval_set()
        if items is None:
            raise ValueError("evaluate() needs an eval_dataset")
        if self.needs_reference and self.args.precompute_ref_logprobs:
            self._reference_table(self._eval_items())
        self.train_model.eval()
        chunks, parts = self._eval_chunks(), []
        for k in range(distributed.reduce_max(len(chunks))):  # as many passes on every process
            chunk, counted = (chunks[k], True) if k < len(chunks) else ([0], False)
            parts.append(self._micro_batch([items[i] for i in chunk], counted)[1])
        self.train_model.train()
        metrics = self._step_metrics(parts, sum(len(chunk) for chunk in chunks))
        return {"eval/" + k.removeprefix(f"{self.loop_name}/"): float(v) for k, v in metrics.items()}

    def _eval_chunks(self, rank: int | None = None) -> list[list[int]]:
        """The evaluation micro-batches (item indices) of ``batch_size / N`` items of the process ``rank``
        (None: this one)."""
        world, n = distributed.role_size(), len(self._eval_set() or [])
        rank = distributed.role_rank() if rank is None else rank
        lo, hi, size = n * rank // world, n * (rank + 1) // world, max(1, self.args.batch_size // world)
        return [list(range(s, min(s + size, hi))) for s in range(lo, hi, size)]

    def _has_eval_set(self) -> bool:
        """Whether the trainer holds an evaluation set (``evaluate`` runs on it)."""
        return self._eval_set() is not None

    # ---------------------------------------------------------------- each trainer's own
    def _train_set(self) -> list:
        """The training items (``_batch``'s indices point into it)."""
        raise NotImplementedError

    def _eval_set(self) -> list | None:
        """The evaluation items; None without an ``eval_dataset``."""
        raise NotImplementedError

    def _eval_items(self) -> list:
        """What the reference scores for ``evaluate`` with ``precompute_ref_logprobs``
        (``DPOReference._reference_table``)."""
        raise NotImplementedError

    def _micro_batch(self, items: list, counted: bool) -> tuple[torch.Tensor, Any]:
        """The per-item losses of a micro-batch of ``items`` scored by ``train_model`` (with graph in a
        step: it backpropagates their sum) and what ``_step_metrics`` reads of them; ``counted`` False:
        a stand-in, whose items join no statistic."""
        raise NotImplementedError

    def _step_metrics(self, parts: list, n_mine: int) -> dict[str, torch.Tensor]:
        """The metrics over every process from this process's ``_micro_batch`` parts (one a pass, as
        many passes on every process) and its ``n_mine`` items; ``<loop_name>/loss`` among them."""
        raise NotImplementedError

    # ---------------------------------------------------------------- checkpoints and saving
    def _restore(self, counters: dict) -> None:
        super()._restore(counters)
        self._policy_is_initial = self.step == 0  # a resumed policy is no longer the reference

    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        return {"model": self.model, **self._reference_modules()}

    def _param_groups(self) -> list | None:
        """The optimizer trains the policy alone (a synced reference is checkpointed, not trained)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def save_model(self, path) -> None:
        """The policy as a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA: merged, or
        the adapter alone with ``save_adapter``), with its tokenizer. Every process must call this."""
        export_causal_lm(self.model, path, self.tokenizer, self.args.save_adapter, self._template)
