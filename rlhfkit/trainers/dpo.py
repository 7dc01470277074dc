"""Direct Preference Optimization on preference pairs: the RL-free alternative to RLHF the
reference compares against (Rafailov et al. 2023, arXiv:2305.18290), with its variants IPO, SLiC's
hinge, conservative DPO and the reference-free SimPO. The losses live in ``algorithms/dpo.py``
(``dpo_loss``); this file feeds them.

Each step takes ``batch_size x grad_accumulation`` pairs ``(x, y_w, y_l)`` of the data the reward-model trainer reads
(``data.preferences``: prompt, chosen, rejected; text or chat messages) and computes, for the
policy π_θ and the frozen reference π_ref, the summed log-probability of each completion
(+ EOS) given its prompt: ``log π(y|x) = Σ_t log π(y_t | x, y_<t)``. Chosen and rejected rows run
as one packed row (``models.forward_response`` with ``prompt_index``, ``models.packing``: the prompt
once, both completions after it without padding, as in the RL loop), on any number of processes.

The reference (``dpo_reference.py``) is, in this order: ``ref_model`` when given; the
adapter-disabled base when the policy is a LoRA model (no second copy); else a frozen copy of the
initial policy. With ``precompute_ref_logprobs`` its log-probs of every pair are computed once
before training; with ``sync_ref_model`` it follows the policy (TR-DPO). SimPO and SFT need no
reference at all. ``ld_alpha`` (LD-DPO) weighs each sequence's tokens past its pair's shorter
completion in both models' log-probs (``algorithms.ld_logps``); ``use_weighting`` weighs each pair's
loss by WPO's weight (``algorithms.wpo_weights``).

Metrics (TRL's names): ``rewards/chosen`` and ``rewards/rejected`` (the implicit rewards
``β (log π(y|x) - log π_ref(y|x))``, means over the step's pairs), ``rewards/accuracies`` (the
fraction of pairs whose chosen reward is the larger), ``rewards/margins``, ``logps/chosen``,
``logps/rejected`` (summed log-probs), ``dpo/loss``. Under torchrun every process takes the r-th
slice of each step's pairs and backpropagates its share of the global mean (FSDP2 and DDP average
gradients), so N processes take the step one process takes; metrics are global.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import distributed
from ..algorithms import DPO_LOSS_TYPES as DPO_LOSSES
from ..algorithms import dpo_loss, ld_logps, log_sum_sq_probs, wpo_weights
from ..algorithms.dpo import needs_reference
from ..config.supervised import DPOConfig  # re-exported: rlhfkit.trainers.dpo.DPOConfig
from ..data.encode import encode_pair, note_cut, note_unknown
from ..data.padding import pad
from ..data.preferences import load_preference_dataset
from ..models import forward_response
from .preference import PreferenceTrainer
from .supervised import Datasets


@dataclass(frozen=True)
class PreferencePair:
    prompt: list[int]
    chosen: list[int]  # completion + EOS
    rejected: list[int]


class DPOTrainer(PreferenceTrainer):
    """``DPOTrainer(model, DPOConfig(...), train_dataset=pairs, eval_dataset=None, processing_class=None,
    ref_model=None, peft_config=None).train()``

    ``model``: a local HF directory, a Hub id or a causal-LM object (then ``processing_class``, its
    tokenizer, is required); ``ref_model``: the reference (a directory, Hub id or model object);
    ``peft_config``: train a LoRA adapter, with the adapter-disabled base as the reference.
    Datasets: preference pairs (``data.preferences``); every pair is read, checked and tokenised
    before any model is loaded. Dropout is off in the policy and the reference (as TRL's
    ``disable_dropout``): the implicit rewards must not be noise.
    ``callbacks``: ``transformers.TrainerCallback`` objects (``rlhfkit/run/callbacks.py``).
    """

    main_metric = "rewards/accuracies"
    loop_name = "dpo"
    train_rows_hold = ": preference pairs with 'prompt', 'chosen' and 'rejected'"
    load_rows = staticmethod(load_preference_dataset)
    args: DPOConfig
    args_class = DPOConfig

    def _check_inputs(self, model, processing_class, ref_model=None, **sources) -> None:
        """The model and tokenizer as given; a reference-free loss (SimPO) refuses a reference's options;
        each process an equal share of a step's pairs."""
        self._check_model(model, processing_class)
        args = self.args
        self.needs_reference = needs_reference(args.loss_type)
        if not self.needs_reference and (ref_model is not None or args.precompute_ref_logprobs or args.sync_ref_model):
            raise ValueError(
                f"loss_type={args.loss_type!r} is reference-free: drop ref_model, precompute_ref_logprobs and "
                "sync_ref_model"
            )
        self._check_batch_share("pairs")

    def _encode_inputs(self, datasets: Datasets) -> None:
        train_rows, eval_rows = self._rows(datasets)
        self.train_pairs = self._encode(train_rows, "train_dataset")
        self.eval_pairs = self._encode(eval_rows, "eval_dataset") if eval_rows is not None else None
        self.n_items = len(self.train_pairs)

    def _before_training(self, total_steps: int) -> None:
        """With ``precompute_ref_logprobs``: the reference's log-probs of every pair the trainer holds."""
        if self.needs_reference and self.args.precompute_ref_logprobs:
            self._reference_table(self.train_pairs + (self.eval_pairs or []) + self._pairs_to_precompute())

    def _pairs_to_precompute(self) -> list[PreferencePair]:
        """Pairs besides the training and evaluation sets that ``precompute_ref_logprobs`` scores
        before training (a subclass's further evaluation sets)."""
        return []

    # ---------------------------------------------------------------- data
    def _encode(self, rows: list[dict], name: str) -> list[PreferencePair]:
        """Prompt ids (rendered once: chosen and rejected continue the same prompt) and each
        completion + EOS. A pair longer than ``max_length`` loses its prompt's start first (down to
        one token); a pair whose longer completion still does not fit is dropped (a warning). One
        warning line each says how many kept pairs lost their prompt's start and how many hold
        unknown tokens."""
        pairs, dropped, cut, limit = [], 0, 0, self.args.max_length
        for i, row in enumerate(rows):
            try:
                chosen, rejected = (encode_pair(row["prompt"], row[k], self.tokenizer) for k in ("chosen", "rejected"))
            except ValueError as e:  # e.g. chat messages and a tokenizer without a chat template
                raise ValueError(f"{name}: pair {i} (0-based): {e}") from None
            prompt = chosen.input_ids[: chosen.prompt_len]
            completions = chosen.input_ids[chosen.prompt_len :], rejected.input_ids[rejected.prompt_len :]
            longest = max(len(c) for c in completions)
            if longest + 1 > limit:
                dropped += 1
                continue
            cut += len(prompt) + longest > limit
            prompt = prompt[max(0, len(prompt) + longest - limit) :]
            pairs.append(PreferencePair(prompt, *completions))
        note_cut(name, cut, len(rows), "pairs", limit, "the prompt's start")
        note_unknown(name, [(p.prompt, p.chosen, p.rejected) for p in pairs], self.tokenizer, "pairs")
        return self._check_pairs(pairs, dropped, len(rows), name)

    def _collate(self, pairs: list[PreferencePair]):
        """``[left padding | prompt | completion | right padding]`` rows: the chosen completions,
        then the rejected ones; returns (ids, attention mask, completion mask, prompt index)."""
        n, pad_id = len(pairs), self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = pad([p.prompt for p in pairs] * 2, pad_id, "left")
        completion_ids, completion_mask = pad([p.chosen for p in pairs] + [p.rejected for p in pairs], pad_id)
        ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
        index = torch.arange(n).repeat(2)
        return ids.to(self.device), mask.to(self.device), completion_mask.to(self.device), index.to(self.device)

    def _token_logps(self, model, pairs: list[PreferencePair], temperature: float = 1.0):
        """(per-token log-probs (2n, T) at ``temperature`` — chosen rows, then rejected —, completion mask (2n, T))."""
        ids, mask, completion_mask, index = self._collate(pairs)
        # a pair's two completions packed after its prompt: one pass (models.packing)
        with self._autocast(), self._memory_pass(*ids.shape):
            out = forward_response(
                model, ids, mask, completion_mask.shape[1], temperature, prompt_index=index, lm_head=self.args.lm_head
            )
        return out.logprobs, completion_mask

    def _sequence_logps(self, token_logps: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """Each completion's log-prob (2n,): the sum over its tokens, or LD-DPO's with ``ld_alpha``."""
        alpha = self.args.ld_alpha
        return (
            (token_logps * completion_mask).sum(-1) if alpha is None else ld_logps(token_logps, completion_mask, alpha)
        )

    def _logps(self, model, pairs: list[PreferencePair]) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed completion log-probs (2n,) — chosen rows, then rejected —, completion lengths (2n,))."""
        token_logps, completion_mask = self._token_logps(model, pairs)
        return self._sequence_logps(token_logps, completion_mask), completion_mask.sum(-1)

    @torch.no_grad()
    def _wpo_weights(self, model, pairs: list[PreferencePair], token_logps, completion_mask) -> torch.Tensor:
        """WPO's pair weights (n,) (``algorithms.wpo_weights``); each token's ``log Σ_v p(v)²`` from a
        second pass of the policy at temperature ½ (``algorithms.log_sum_sq_probs``)."""
        half, _ = self._token_logps(model, pairs, temperature=0.5)
        return wpo_weights(token_logps, log_sum_sq_probs(token_logps, half), completion_mask)

    # ---------------------------------------------------------------- the loop (PreferenceTrainer.train)
    def _loss(self, model, pairs: list[PreferencePair]):
        """``dpo_loss`` of ``pairs`` (WPO-weighted with ``use_weighting``); the reference log-probs
        from its table (precomputed) or now."""
        token_logps, completion_mask = self._token_logps(model, pairs)
        logps, lengths = self._sequence_logps(token_logps, completion_mask), completion_mask.sum(-1)
        n = len(pairs)
        ref = self._reference_of(pairs) if self.needs_reference else None
        a = self.args
        losses, chosen_r, rejected_r = dpo_loss(
            logps[:n],
            logps[n:],
            None if ref is None else ref[:n],
            None if ref is None else ref[n:],
            beta=a.beta,
            loss_type=a.loss_type,
            loss_weights=a.loss_weights,
            label_smoothing=a.label_smoothing,
            simpo_gamma=a.simpo_gamma,
            discopop_tau=a.discopop_tau,
            f_divergence_type=a.f_divergence_type,
            f_alpha_divergence_coef=a.f_alpha_divergence_coef,
            chosen_lengths=lengths[:n],
            rejected_lengths=lengths[n:],
        )
        if a.use_weighting:
            losses = losses * self._wpo_weights(model, pairs, token_logps, completion_mask)
        return losses, chosen_r, rejected_r, logps.detach()

    def _train_set(self) -> list[PreferencePair]:
        return self.train_pairs

    def _eval_set(self) -> list[PreferencePair] | None:
        return self.eval_pairs

    def _eval_items(self) -> list[PreferencePair]:
        return self.eval_pairs or []

    def _micro_batch(self, items: list[PreferencePair], counted: bool) -> tuple[torch.Tensor, tuple]:
        """The (WPO-weighted) losses of the pairs ``items``; the part is ``_loss``'s output and ``counted``."""
        out = self._loss(self.train_model, items)
        return out[0], (out, counted)

    def _step_metrics(self, parts: list, n_mine: int) -> dict[str, torch.Tensor]:
        """``_pair_metrics`` of the counted micro-batches (a process without pairs: its last stand-in, counted 0)."""
        outs = [out for out, counted in parts if counted] or [parts[-1][0]]
        losses, chosen_r, rejected_r = (torch.cat([out[i] for out in outs]) for i in range(3))
        logps = torch.cat([out[3].view(2, -1) for out in outs], 1).flatten()  # every chosen, then every rejected
        return _pair_metrics(losses, chosen_r, rejected_r, logps, n_mine)


def _pair_metrics(losses, chosen_r, rejected_r, logps, n_real: int) -> dict[str, torch.Tensor]:
    """TRL's DPO metrics over the pairs of every process; each passes its per-pair values (the first
    ``n_real`` count, none for a stand-in) and its (2n,) summed log-probs (chosen, then rejected)."""
    c_logps, r_logps = logps.view(2, -1)[0].double()[:n_real], logps.view(2, -1)[1].double()[:n_real]
    cr, rr = chosen_r.detach().double()[:n_real], rejected_r.detach().double()[:n_real]
    sums = torch.stack(
        [
            losses.detach().double()[:n_real].sum(),
            cr.sum(),
            rr.sum(),
            (cr > rr).double().sum(),
            c_logps.sum(),
            r_logps.sum(),
        ]
    ).tolist()  # one device synchronisation
    count, loss, c, r, wins, lc, lr = distributed.sum_floats([float(n_real), *sums])
    count = max(count, 1.0)
    return {
        "dpo/loss": torch.tensor(loss / count),
        "rewards/chosen": torch.tensor(c / count),
        "rewards/rejected": torch.tensor(r / count),
        "rewards/accuracies": torch.tensor(wins / count),
        "rewards/margins": torch.tensor((c - r) / count),
        "logps/chosen": torch.tensor(lc / count),
        "logps/rejected": torch.tensor(lr / count),
    }


__all__ = ["DPOConfig", "DPOTrainer", "DPO_LOSSES"]
