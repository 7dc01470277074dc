"""Reward-model training on preference pairs (Bradley–Terry), then centring.

Each step scores the chosen and the rejected completions of a batch of pairs in one forward pass
(both halves concatenated, right-padded: ``ScalarModel.score`` reads each row's last attended
token, the EOS appended by ``encode_pair``) and minimises ``-log σ(r_c - r_r - m)``
(``algorithms.bradley_terry_loss``; Ouyang et al. 2022, arXiv:2203.02155, eq. 1; margin of Llama 2,
arXiv:2307.09288, eq. 2). After training the mean score of a reference set is stored as the model's
``offset``, so loaded scores have mean 0 on it (Ouyang et al. 2022 §3.5 normalise the RM so the
labeller demonstrations score 0 on average; "The N Implementation Details of RLHF with PPO" §
reward normalisation): the RL loop then sees rewards on a known scale. The Bradley–Terry loss
depends on score differences only, so the shift costs nothing.

``final/`` loads with ``ScalarModel.from_pretrained``, serves as a reward function
(``RLTrainer(reward_funcs=[dir])``) and initialises the PPO critic (``RLConfig(critic_init=dir)``).

Under torchrun (docs/architecture.md, "Scale-out") every process walks the same seeded order and scores the
r-th slice of each step's ``batch_size x grad_accumulation`` pairs (in micro-batches of
``batch_size / N``); it backpropagates its sum of pair losses divided by
the step's pair count times the number of processes (FSDP2 and DDP average gradients), so the
gradient is that of the Bradley–Terry mean over the global batch. Metrics, eval and the centring
mean are all-reduced; rank 0 alone writes the run directory and ``final/``.
"""

from __future__ import annotations

import copy
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import distributed
from ..algorithms import bradley_terry_loss
from ..config.supervised import RewardModelConfig  # re-exported: rlhfkit.trainers.reward_model.RewardModelConfig
from ..data.encode import encode_pair, note_cut, note_unknown
from ..data.padding import pad
from ..data.preferences import is_tokenized, load_completions, load_preference_dataset
from ..files import writing
from ..models import ScalarModel
from ..models.activations import probe_ids
from ..models.lora import apply_lora, is_peft, merged_backbone
from ..models.sources import resolve_model_dir
from ..run.metrics import to_floats
from .reward_scoring import Scorer, global_pair_metrics, load_scalar_model, unsharded_copy
from .supervised import Datasets, SupervisedTrainer


@dataclass(frozen=True)
class Pair:
    chosen: list[int]
    rejected: list[int]
    margin: float | None  # None: the row had no margin column


def tokenized_pair(row: dict) -> Pair:
    """A tokenised preference row (``chosen_ids``, ``rejected_ids``, optional ``margin``) as it is."""
    margin = float(row["margin"]) if row.get("margin") is not None else None
    return Pair(list(row["chosen_ids"]), list(row["rejected_ids"]), margin)


class RewardModelTrainer(SupervisedTrainer):
    """``RewardModelTrainer(model, RewardModelConfig(...), train_dataset=pairs).train()``

    ``model``: a local directory — a causal LM (a fresh scalar head on its transformer) or a saved
    ``ScalarModel`` (training continues) — or a causal-LM object (``ScalarModel.from_causal_lm``
    copies its transformer) or a ``ScalarModel``; ``processing_class``: the tokenizer (required
    for objects); ``train_dataset`` / ``eval_dataset``: preference pairs (``load_preference_dataset``);
    ``center_dataset``: completions to centre on (``load_completions``; e.g. the SFT data).
    Every dataset is read, checked and tokenised before any model is loaded. ``peft_config``: a
    ``peft`` LoRA config for the backbone (the scalar head is trained in full); ``final/`` is
    saved with the adapter merged, or with ``save_adapter`` as the adapter plus the head
    (``scalar_head.safetensors``, ``rlhfkit_scalar.json``: ``ScalarModel.from_pretrained`` loads it
    on the base model its ``adapter_config.json`` names).
    ``callbacks``: ``transformers.TrainerCallback`` objects (``rlhfkit/run/callbacks.py``).
    """

    main_metric = "rm/accuracy"
    train_rows_hold = ": preference pairs with 'prompt', 'chosen' and 'rejected'"
    load_rows = staticmethod(load_preference_dataset)
    args: RewardModelConfig

    def __init__(
        self,
        model,
        args: RewardModelConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        center_dataset=None,
        peft_config=None,
        callbacks=None,
    ):
        args = args or RewardModelConfig()
        super().__init__(
            model,
            args,
            train_dataset,
            eval_dataset,
            processing_class,
            peft_config,
            callbacks,
            center_dataset=center_dataset,
        )

    def _check_inputs(self, model, processing_class, center_dataset=None, **sources) -> None:
        """A centre set only with ``center``; each process an equal share of a step's pairs."""
        if center_dataset is not None and not self.args.center:
            raise ValueError("center_dataset is given but args.center is False; set center=True or drop it")
        self._check_batch_share("pairs")

    def _read_inputs(self, train_dataset, eval_dataset, center_dataset=None, **sources) -> Datasets:
        """The training and evaluation pairs, and the completions to centre on (``load_completions``)."""
        datasets = super()._read_inputs(train_dataset, eval_dataset)
        center_rows = load_completions(center_dataset) if center_dataset is not None else None
        return {**datasets, "center_dataset": (center_dataset, center_rows)}

    def _load_tokenizer(self, model, processing_class) -> None:
        """A model directory that exists (an object comes with its tokenizer), then the tokenizer."""
        if isinstance(model, (str, os.PathLike)):
            resolve_model_dir(model, "model")
        elif processing_class is None:
            raise ValueError("processing_class (the tokenizer) is required when model is an object, not a path")
        super()._load_tokenizer(model, processing_class)

    def _encode_inputs(self, datasets: Datasets) -> None:
        """The pairs tokenised, and the centre set: every training completion, chosen and rejected, unless
        ``center_dataset`` gives its own (prompt + completion, cut as the pairs are)."""
        train_rows, eval_rows = self._rows(datasets)
        center_rows, limit = datasets["center_dataset"][1], self.args.max_length
        self.train_pairs = self._encode_pairs(train_rows, "train_dataset")
        self.eval_pairs = self._encode_pairs(eval_rows, "eval_dataset") if eval_rows is not None else None
        if center_rows is None:  # default: every training completion, chosen and rejected
            self.center_ids = [ids for p in self.train_pairs for ids in (p.chosen, p.rejected)]
        else:
            encoded = [encode_pair(r["prompt"], r["completion"], self.tokenizer, limit) for r in center_rows]
            self.center_ids = [e.input_ids for e in encoded]
            cut = sum(e.cut for e in encoded)  # as the training pairs' cut rows are said
            note_cut("center_dataset", cut, len(encoded), "rows", limit, "their prompt's start first")
        self.n_items = len(self.train_pairs)

    def _build_model(self, model, peft_config, **sources) -> None:
        """The ``ScalarModel`` (``_load_model``; its head's bias frozen), LoRA on its backbone, placed on its
        device (the process group starts there) and sharded through its ``Scorer``."""
        args = self.args
        model = self._load_model(model)
        if model.head.bias is not None:
            # Its Bradley–Terry gradient is exactly 0 (it shifts both scores of a pair), but summed
            # in float it is rounding noise of ~1e-9, which AdamW scales up to steps of ~lr: frozen,
            # the bias keeps its value (and a run gives the same weights on any number of processes).
            model.head.bias.requires_grad_(False)
        if peft_config is not None:  # adapters on the backbone; the head stays fully trainable
            model.backbone = apply_lora(model.backbone, peft_config, task_type=None)
        self._checkpoint_activations(model.backbone, peft_config is not None)
        # The process group starts here, after every check that could fail the same way on every rank.
        # ``scalar_model`` is what this trainer reads; ``model`` is the same object for users (the TRL
        # drop-in shows its Hugging Face model there, whose modules the scalar model shares).
        self.scalar_model = self.model = model.to(distributed.setup(args.device))
        self.device = next(self.scalar_model.parameters()).device
        # Every forward pass goes through ``scorer`` (``model.score`` as a module's forward): FSDP2
        # shards it in place (its parameters become DTensors) and DDP wraps it.
        scorer = Scorer(self.scalar_model)
        # LoRA under torchrun with FSDP2: the main process merges from an unsharded copy at save time.
        self._template = (
            copy.deepcopy(scorer).cpu()
            if is_peft(self.scalar_model.backbone) and distributed.role_active() and distributed.is_main()
            else None
        )
        self.scorer = distributed.shard(scorer, args.parallelism)

    def _load_model(self, model) -> ScalarModel:
        """The ``ScalarModel`` to train (``load_scalar_model``: a causal LM gets rlhfkit's fresh
        head); the TRL drop-in overrides it with TRL's head."""
        return load_scalar_model(model, self.args.dtype)

    # ---------------------------------------------------------------- data
    def _encode_pairs(self, rows: list[dict], name: str) -> list[Pair]:
        """Tokenise (prompt + completion + EOS) for both sides; drop pairs whose completion is cut (a
        warning), say how many kept pairs lost their prompt's start and how many hold unknown tokens.
        A tokenised row (``chosen_ids``, ``rejected_ids``) is taken as it is, dropped when a side is
        longer than ``max_length``."""
        pairs, dropped, cut = [], 0, 0
        for i, row in enumerate(rows):
            if is_tokenized(row):
                fits = max(len(row["chosen_ids"]), len(row["rejected_ids"])) <= self.args.max_length
                if fits:
                    pairs.append(tokenized_pair(row))
                dropped += not fits
                continue
            try:
                chosen, rejected = (
                    encode_pair(row["prompt"], row[k], self.tokenizer, self.args.max_length)
                    for k in ("chosen", "rejected")
                )
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: pair {i} (0-based): {e}") from None
            if chosen.truncated or rejected.truncated:
                dropped += 1
                continue
            margin = float(row["margin"]) if row.get("margin") is not None else None
            pairs.append(Pair(chosen.input_ids, rejected.input_ids, margin))
            cut += chosen.cut or rejected.cut
        note_cut(name, cut, len(rows), "pairs", self.args.max_length, "the prompt's start")
        note_unknown(name, [(p.chosen, p.rejected) for p in pairs], self.tokenizer, "pairs")
        return self._check_pairs(pairs, dropped, len(rows), name)

    def _probe(self, n: int) -> torch.Tensor:
        """The score of one synthetic row of ``n`` tokens, with gradient (the memory probe)."""
        ids = probe_ids(self.scalar_model, n, self.device)
        with self._autocast():
            return self.scorer(ids, torch.ones_like(ids)).sum()

    def _score_pairs(self, pairs: list[Pair]):
        """(chosen, rejected, margin) for a batch: both sides in one forward pass."""
        ids, mask = pad(
            [p.chosen for p in pairs] + [p.rejected for p in pairs], self.tokenizer.pad_token_id, device=self.device
        )  # right padding: the score is read at the last attended token
        with self._autocast(), self._memory_pass(*ids.shape):
            scores = self.scorer(ids, mask)
        scores = scores.float() if self.args.autocast else scores  # the loss in float32, not the autocast dtype
        margin = None
        if any(p.margin is not None for p in pairs):  # a row without a margin in a margin dataset: 0
            margin = torch.tensor([p.margin or 0.0 for p in pairs], dtype=scores.dtype, device=scores.device)
        return scores[: len(pairs)], scores[len(pairs) :], margin

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict]:
        """Train, evaluate and centre; returns one dict of metrics per step (as in metrics.jsonl)."""
        while self.step < self.total_steps:
            self.run.step_begin()
            self.step += 1
            step = self.step
            metrics = self._step([self.train_pairs[i] for i in self._batch(step)])
            metrics["rm/epoch"] = step / self.steps_per_epoch
            stop = self.run.step_end(step)  # a callback's should_training_stop: this step is the last
            last = stop or step == self.total_steps
            if self.eval_pairs is not None and (last or (self.args.eval_every and step % self.args.eval_every == 0)):
                metrics.update(self.evaluate())
            if last and self.args.center:
                metrics["rm/offset"] = self.center()
            self._log_step(step, metrics)
            self._step_done()
            if stop:
                break
        if self.total_steps == 0 and self.args.center:
            self.run.log(0, {"rm/offset": self.center()})
        return self._finish()  # final/ (every process takes part in gathering), plots, trackers

    def _step(self, pairs: list[Pair]) -> dict:
        """One optimizer step on the step's ``pairs`` (of every process): this process scores its
        slice in micro-batches of ``batch_size / N`` pairs (``grad_accumulation`` of them), each in
        one forward pass. A process left without pairs for one (the short last batch of an epoch)
        scores a stand-in with weight 0, so every process runs as many (FSDP2: collective) passes;
        DDP synchronises gradients on the last."""
        self.scorer.train()
        world, rank, n = distributed.role_size(), distributed.role_rank(), len(pairs)
        mine, coef = pairs[n * rank // world : n * (rank + 1) // world], self.args.center_rewards_coefficient
        chunks = self._micro_batches(mine, n)
        scored: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        for k, chunk in enumerate(chunks):
            with distributed.no_sync(self.scorer) if k < len(chunks) - 1 else nullcontext():
                chosen, rejected, margin = self._score_pairs(chunk or pairs[:1])
                loss, _ = bradley_terry_loss(chosen, rejected, margin, coef)
                # This micro-batch's share of the global mean, times N: FSDP2 and DDP average gradients.
                (loss * (len(chunk) * world / n)).backward()
            if chunk or not scored and k == len(chunks) - 1:  # a process without pairs: the stand-in, counted 0
                scored.append((chosen.detach(), rejected.detach(), margin))
        chosen, rejected = torch.cat([s[0] for s in scored]), torch.cat([s[1] for s in scored])
        margin = None
        if any(s[2] is not None for s in scored):
            margin = torch.cat([s[2] if s[2] is not None else torch.zeros_like(s[0]) for s in scored])
        if world > 1:
            loss, metrics = global_pair_metrics(chosen, rejected, margin, len(mine), self.device, coef)
        else:
            loss, metrics = bradley_terry_loss(chosen, rejected, margin, coef)
        return {"rm/loss": loss.detach(), **metrics, **self.run.optimizer_step(loss)}

    @torch.no_grad()
    def evaluate(self, dataset=None) -> dict[str, float]:
        """Bradley–Terry loss and metrics over ``dataset`` (default: ``eval_dataset``) as
        ``eval/loss``, ``eval/accuracy``, ``eval/margin_mean``, ``eval/chosen_mean``, ... (floats)."""
        pairs = (
            self.eval_pairs
            if dataset is None
            else self._encode_pairs(load_preference_dataset(dataset, "eval_dataset"), "eval_dataset")
        )
        if pairs is None:
            raise ValueError("evaluate() needs a dataset: pass one, or eval_dataset to the trainer")
        self.scorer.eval()
        world, rank, n = distributed.role_size(), distributed.role_rank(), len(pairs)
        mine, size = pairs[n * rank // world : n * (rank + 1) // world], -(-self.args.batch_size // world)
        chunks = [mine[i : i + size] for i in range(0, len(mine), size)]
        # Every process runs as many forward passes (FSDP2's are collectives): stand-ins, discarded.
        passes = [
            self._score_pairs(chunks[i] if i < len(chunks) else pairs[:1])
            for i in range(distributed.reduce_max(len(chunks)))
        ]
        parts = passes[: len(chunks)] or [tuple(p[:0] if p is not None else None for p in passes[0])]
        chosen, rejected = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        margin = None
        if any(p[2] is not None for p in parts):
            margin = torch.cat([p[2] if p[2] is not None else torch.zeros_like(p[0]) for p in parts])
        coef = self.args.center_rewards_coefficient
        if world > 1:
            loss, metrics = global_pair_metrics(chosen, rejected, margin, len(chosen), self.device, coef)
        else:
            loss, metrics = bradley_terry_loss(chosen, rejected, margin, coef)
        return to_floats({"eval/loss": loss, **{"eval/" + k.split("/", 1)[1]: v for k, v in metrics.items()}})

    @torch.no_grad()
    def center(self) -> float:
        """Shift the scores so their mean over the centre set is 0; returns the new offset.

        ``offset ← offset + mean(score)``: scores already subtract the current offset (a
        continued reward model may have one).
        """
        self.scorer.eval()
        world, rank, n = distributed.role_size(), distributed.role_rank(), len(self.center_ids)
        mine, size = self.center_ids[n * rank // world : n * (rank + 1) // world], 2 * -(-self.args.batch_size // world)
        chunks = [mine[i : i + size] for i in range(0, len(mine), size)]
        total = 0.0
        # Every process runs as many forward passes (FSDP2's are collectives): stand-ins, discarded.
        for i in range(distributed.reduce_max(len(chunks))):
            rows = chunks[i] if i < len(chunks) else self.center_ids[:1]
            with self._autocast():
                scores = self.scorer(*pad(rows, self.tokenizer.pad_token_id, device=self.device))
            if i < len(chunks):
                total += scores.double().sum().item()
        total, count = distributed.sum_floats([total, len(mine)])
        offset = float(self.scalar_model.offset) + total / count
        self.scalar_model.set_offset(offset)  # the same number on every process
        return offset

    def save_model(self, path) -> None:
        """The reward model as an HF ``<Arch>ForSequenceClassification`` directory with one label
        (``ScalarModel.save_pretrained``; the centring offset in its config) and its tokenizer.
        Under torchrun every process must call this: FSDP2 shards are gathered, rank 0 writes."""
        model = self.scalar_model
        if distributed.role_size() > 1 and self.args.parallelism == "fsdp":
            state = distributed.full_state_dict(self.scorer)  # a collective; keys "model.<name>"
            if self._template is not None:
                self._template.load_state_dict(state)
                model = self._template.model
            else:
                model = unsharded_copy(self.scalar_model, state) if distributed.is_main() else None
        if distributed.is_main():
            with writing(path):  # a full disk: one line naming the directory
                if is_peft(model.backbone) and self.args.save_adapter:  # the adapter, head and offset beside it
                    model.save_scalar_layout(Path(path))
                else:
                    if is_peft(model.backbone):  # the adapter merged into a copy of the backbone
                        model = ScalarModel(
                            merged_backbone(model.backbone), copy.deepcopy(model.head), float(model.offset)
                        )
                    model.save_pretrained(Path(path), tokenizer=self.tokenizer)  # the pad id HF pools with
                self.tokenizer.save_pretrained(path)
        distributed.role_barrier()

    def _trained_modules(self) -> dict[str, torch.nn.Module]:
        return {"model": distributed.unwrap(self.scorer)}

    def _counters(self) -> dict:  # the offset is no weight: a run resumed after its centring keeps it
        return {**super()._counters(), "offset": float(self.scalar_model.offset)}

    def _restore(self, counters: dict) -> None:
        super()._restore(counters)
        self.scalar_model.set_offset(float(counters.get("offset", 0.0)))


__all__ = ["RewardModelConfig", "RewardModelTrainer"]
