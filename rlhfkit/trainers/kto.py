"""Kahneman–Tversky Optimisation on unpaired preferences (Ethayarajh et al. 2024, arXiv:2402.01306):
each row one completion with a thumbs-up (desirable) or thumbs-down (undesirable) label, no pairs,
no reward model, no sampling. The losses live in ``algorithms/kto.py`` (``kto_loss``, ``kto_kl``);
this file feeds them.

Each step takes ``batch_size x grad_accumulation`` rows (``data.unpaired``: prompt, completion,
label; a paired dataset is split in two) and computes, for the policy π_θ and the frozen reference
π_ref, each completion's summed log-probability (+ EOS) given its prompt. KTO's reference point
``z0`` is the mean log-ratio of *mismatched* pairs, built as TRL builds them: within each
micro-batch the completions are rotated by one, row i's prompt followed by row i-1's completion
(row 0 takes the last row's), so the mismatched completions are the batch's own completions after
other prompts. A row's completion and its mismatched one run as one packed row after its prompt
(``models.forward_response`` with ``prompt_index``). ``z0`` is the mean over the micro-batch of every
process (``distributed.reduce_sum``), clamped at 0 and detached; ``apo_zero_unpaired`` needs no
``z0`` and scores no mismatched pair. The loss of a step is the mean over its rows of the weighted
per-row losses (``desirable_weight`` λ_D, ``undesirable_weight`` λ_U).

The data order is a seeded shuffle per epoch, or the dataset's own order with ``shuffle=False``
(TRL's KTO: its mismatched pairs are then the same every epoch). The reference
(``dpo_reference.DPOReference``, shared with DPO) is ``ref_model`` when given, the adapter-disabled
base under LoRA, else a frozen copy of the initial policy; ``precompute_ref_logprobs`` scores every
(row, mismatched completion) the run will use once before training; ``sync_ref_model`` is TR-DPO's
soft update.

Metrics (TRL's names): ``kto/loss``, ``kl`` (the mean ``z0`` of the step's micro-batches; 0 without),
``rewards/chosen`` and ``rewards/rejected`` (the mean implicit reward ``β log π/π_ref`` of the
desirable and of the undesirable rows; absent from a step without such rows), ``rewards/margins``,
``logps/chosen``, ``logps/rejected``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from .. import distributed
from ..algorithms.kto import kto_kl, kto_loss, kto_needs_kl
from ..config.supervised import KTOConfig  # re-exported: rlhfkit.trainers.kto.KTOConfig
from ..data.encode import encode_pair, note_cut, note_unknown
from ..data.padding import pad
from ..data.unpaired import load_unpaired_dataset
from ..models import forward_response
from .kto_metrics import kto_metrics, weight_advice
from .preference import PreferenceTrainer
from .supervised import Datasets


@dataclass(frozen=True)
class KTOExample:
    prompt: list[int]
    completion: list[int]  # + EOS
    label: bool


@dataclass(frozen=True)
class KTOItem:
    """A row as its loss scores it: its completion and the mismatched completion of its micro-batch
    (empty when the loss needs none), each cut to fit ``max_length`` after the prompt."""

    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    kl_completion: tuple[int, ...]
    label: bool


def item_key(item) -> tuple:
    """The reference table's key of an item: its tokens."""
    return item.prompt, item.completion, item.kl_completion


class KTOTrainer(PreferenceTrainer):
    """``KTOTrainer(model, KTOConfig(...), train_dataset=rows, eval_dataset=None, processing_class=None,
    ref_model=None, peft_config=None, callbacks=None).train()``

    ``model``: a local HF directory, a Hub id or a causal-LM object (then ``processing_class``, its
    tokenizer, is required); ``ref_model``: the reference; ``peft_config``: train a LoRA adapter,
    with the adapter-disabled base as the reference. Datasets: unpaired preference rows
    (``data.unpaired``); every row is read, checked and tokenised before any model is loaded.
    Dropout is off in the policy and the reference, as in DPO."""

    main_metric = "kto/loss"
    loop_name = "kto"
    train_rows_hold = ": rows with 'prompt', 'completion' and 'label'"
    load_rows = staticmethod(load_unpaired_dataset)
    args: KTOConfig
    args_class = KTOConfig
    _reference_key = staticmethod(item_key)

    def _check_inputs(self, model, processing_class, **sources) -> None:
        """The model and tokenizer as given; each process an equal share of a step's rows, at least two of them
        when the loss estimates its KL term from the other rows."""
        self._check_model(model, processing_class)
        args, world = self.args, distributed.planned_world()
        self.needs_reference, self.uses_kl = True, kto_needs_kl(args.loss_type)
        self._check_batch_share("rows")
        if self.uses_kl and args.batch_size // world < 2:
            raise ValueError(
                f"batch_size={args.batch_size} gives each of {world} process(es) fewer than 2 rows per micro-batch: "
                f"loss_type={args.loss_type!r} estimates its KL term from the other rows' completions (with one "
                "row it is that row's own reward)"
            )

    def _encode_inputs(self, datasets: Datasets) -> None:
        """The rows tokenised; TRL's advice when the desirable and undesirable rows' weights look unbalanced."""
        train_rows, eval_rows = self._rows(datasets)
        self.train_rows = self._encode(train_rows, "train_dataset")
        self.eval_rows = self._encode(eval_rows, "eval_dataset") if eval_rows is not None else None
        advice = weight_advice(self.train_rows, self.args.desirable_weight, self.args.undesirable_weight)
        if advice:
            warnings.warn(advice, stacklevel=4)  # the caller of KTOTrainer(...)
        self.n_items = len(self.train_rows)

    def _before_training(self, total_steps: int) -> None:
        """With ``precompute_ref_logprobs``: the reference's log-probs of every item the run's steps and its
        evaluation score."""
        if self.args.precompute_ref_logprobs:
            self._reference_table(self._planned_items(total_steps) + self._eval_items())

    # ---------------------------------------------------------------- data
    def _encode(self, rows: list[dict], name: str) -> list[KTOExample]:
        """Prompt ids and completion + EOS of each row. A row longer than ``max_length`` loses its
        prompt's start first (down to one token); a row whose completion still does not fit is
        dropped (a warning)."""
        examples, dropped, cut, limit = [], 0, 0, self.args.max_length
        for i, row in enumerate(rows):
            try:
                enc = encode_pair(row["prompt"], row["completion"], self.tokenizer)
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: row {i} (0-based): {e}") from None
            prompt, completion = enc.input_ids[: enc.prompt_len], enc.input_ids[enc.prompt_len :]
            if len(completion) + 1 > limit:
                dropped += 1
                continue
            cut += len(prompt) + len(completion) > limit
            examples.append(
                KTOExample(prompt[max(0, len(prompt) + len(completion) - limit) :], completion, row["label"])
            )
        note_cut(name, cut, len(rows), "rows", limit, "the prompt's start")
        note_unknown(name, [(e.prompt, e.completion) for e in examples], self.tokenizer, "rows")
        return self._kept(examples, dropped, len(rows), name, "whose completion does not fit in")

    @staticmethod
    def _kept(examples: list, dropped: int, total: int, name: str, why: str) -> list:
        """The rows kept after a length filter: none is an error, some dropped a warning."""
        if not examples:
            raise ValueError(f"{name}: every row was dropped, each one {why} max_length; raise max_length")
        if dropped:
            warnings.warn(f"{name}: dropped {dropped} of {total} rows {why} max_length", stacklevel=3)
        return examples

    def _items(self, rows: list[KTOExample]) -> list[KTOItem]:
        """A micro-batch's rows as the loss scores them: each with row i-1's completion after its
        prompt (row 0 with the last row's; TRL's rotation), when the loss reads the KL term; both
        completions keep the tokens that fit in ``max_length`` after the prompt (TRL's keep_start)."""
        items = []
        for i, row in enumerate(rows):
            room = self.args.max_length - len(row.prompt)
            other = rows[i - 1].completion[:room] if self.uses_kl else []
            items.append(KTOItem(tuple(row.prompt), tuple(row.completion[:room]), tuple(other), row.label))
        return items

    def _planned_items(self, total_steps: int) -> list[KTOItem]:
        """Every item the run's ``total_steps`` steps score, on every process (for the precomputed
        reference); without ``shuffle`` one epoch holds them all."""
        world, seen = distributed.role_size(), dict[tuple, KTOItem]()
        steps = total_steps if self.args.shuffle else min(total_steps, self.steps_per_epoch)
        for step in range(1, steps + 1):
            indices = self._batch(step)
            n = len(indices)
            for rank in range(world):
                for chunk in self._micro_batches(indices[n * rank // world : n * (rank + 1) // world], n):
                    chunk = chunk or indices[:1]  # a process without items scores a stand-in (``_step``)
                    seen.update((item_key(it), it) for it in self._items([self.train_rows[i] for i in chunk]))
        return list(seen.values())

    def _eval_items(self) -> list[KTOItem]:
        """The items of every process's evaluation micro-batches (``_eval_chunks``) and of the stand-in a
        process scores when its slice runs out, with the mismatched completions each micro-batch pairs: the
        reference table is filled alike on every process (``DPOReference._reference_table``), each scoring
        its slice of the same list."""
        rows = self.eval_rows or []
        chunks = [c for rank in range(distributed.role_size()) for c in self._eval_chunks(rank)]
        stand_in = [[0]] if rows else []  # what a process whose slice runs out scores (``evaluate``)
        return [it for chunk in chunks + stand_in for it in self._items([rows[i] for i in chunk])]

    def _batch(self, step: int) -> list[int]:
        """The step's row indices: the seeded shuffle of ``SupervisedTrainer``, or with
        ``shuffle=False`` the dataset's order every epoch."""
        if self.args.shuffle:
            return super()._batch(step)
        epoch, index = divmod(step - 1, self.steps_per_epoch)
        return list(range(self.n_items))[index * self._rows_per_step() : (index + 1) * self._rows_per_step()]

    # ---------------------------------------------------------------- log-probs
    def _logps(self, model, items: list[KTOItem]) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed log-probs (2n,) — the completions, then the mismatched ones (0 when the loss reads
        none) —, completion lengths (2n,)). A row's two completions run packed after its prompt."""
        n, pad_id = len(items), self.tokenizer.pad_token_id
        parts = 2 if self.uses_kl else 1
        completions = [list(it.completion) for it in items] + (
            [list(it.kl_completion) for it in items] if parts > 1 else []
        )
        prompt_ids, prompt_mask = pad([list(it.prompt) for it in items] * parts, pad_id, "left")
        completion_ids, completion_mask = pad(completions, pad_id)
        ids = torch.cat([prompt_ids, completion_ids], 1).to(self.device)
        mask = torch.cat([prompt_mask, completion_mask], 1).to(self.device)
        completion_mask = completion_mask.to(self.device)
        index = torch.arange(n, device=self.device).repeat(parts)
        with self._autocast(), self._memory_pass(*ids.shape):
            out = forward_response(
                model, ids, mask, completion_mask.shape[1], prompt_index=index, lm_head=self.args.lm_head
            )
        logps, lengths = (out.logprobs * completion_mask).sum(-1), completion_mask.sum(-1)
        if parts == 1:
            logps, lengths = (
                torch.cat([logps, torch.zeros_like(logps)]),
                torch.cat([lengths, torch.zeros_like(lengths)]),
            )
        return logps, lengths

    def _loss(self, model, items: list[KTOItem], counted: bool = True):
        """(weighted per-row losses (n,), implicit rewards (n,), summed log-probs (n,), z0) of a
        micro-batch; ``counted`` False: a stand-in whose rows join no statistic (z0 included)."""
        logps = self._logps(model, items)[0]
        ref = self._reference_of(items)
        n, a = len(items), self.args
        z0 = torch.zeros((), device=self.device)
        if self.uses_kl:
            reduce = distributed.reduce_sum if distributed.role_size() > 1 else None
            k = n if counted else 0
            z0 = kto_kl(logps[n : n + k], ref[n : n + k], reduce=reduce)
        labels = torch.tensor([it.label for it in items], device=self.device)
        losses, rewards = kto_loss(
            logps[:n],
            ref[:n],
            labels,
            z0,
            beta=a.beta,
            loss_type=a.loss_type,
            desirable_weight=a.desirable_weight,
            undesirable_weight=a.undesirable_weight,
        )
        return losses, rewards, logps[:n].detach(), z0

    # ---------------------------------------------------------------- the loop (PreferenceTrainer.train)
    def _train_set(self) -> list[KTOExample]:
        return self.train_rows

    def _eval_set(self) -> list[KTOExample] | None:
        return self.eval_rows

    def _micro_batch(self, items: list[KTOExample], counted: bool) -> tuple[torch.Tensor, tuple]:
        """The weighted losses of the rows ``items`` (each with its micro-batch's mismatched completion,
        ``_items``); the part is ``_loss``'s output and the labels of the rows that count (none for a
        stand-in)."""
        scored = self._items(items)
        out = self._loss(self.train_model, scored, counted=counted)
        return out[0], (out, [it.label for it in scored] if counted else [])

    def _step_metrics(self, parts: list, n_mine: int) -> dict[str, torch.Tensor]:
        """``kto_metrics`` of the passes (a step's loss: the mean over its rows of the weighted losses)."""
        return kto_metrics(parts)


__all__ = ["KTOConfig", "KTOTrainer"]
