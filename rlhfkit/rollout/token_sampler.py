"""The HF engine's sampler: the next token of every row as ``generate`` calls its logits processors, with
per-row seeds and the chosen tokens' log-probs (``TokenSampler``); split from ``hf.py``, which uses it."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .base import SamplingParams


class TokenSampler:
    """The next token of every row, as ``generate`` calls its logits processors: the raw logits
    warped as transformers warps them when it samples (the repetition penalty, then temperature,
    top-k, top-p and min-p), one draw per row from the softmax, or the argmax when
    ``sampling.greedy`` (after the repetition penalty, as ``generate``). It returns scores that
    are 0 at the chosen token and -inf elsewhere, so ``generate``'s greedy step takes it, and keeps
    the chosen token's log-prob under the warped distribution (``token_logprobs``).

    With ``seeds`` (one per row) each row draws one uniform per token from a CPU ``torch.Generator``
    of its own and takes the token where it falls in the row's cumulative distribution (inverse-CDF
    sampling, in float64; one batched search, whatever the device); without, ``torch.multinomial``
    on torch's global stream, as ``generate`` itself samples."""

    def __init__(self, sampling: SamplingParams, seeds: list[int] | None):
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.greedy = sampling.greedy
        self.warpers: list[Callable[..., torch.Tensor]] = []  # called as warp(None, scores)
        self.logprobs: list[torch.Tensor] = []  # each generate step's drawn log-probs (__call__)
        # a logits processor, before the warpers and in greedy decoding too, as generate orders them
        penalty = sampling.repetition_penalty
        self.penalty = RepetitionPenaltyLogitsProcessor(penalty) if penalty != 1.0 else None
        if not sampling.greedy:
            if sampling.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                self.warpers.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(sampling.top_p))
            if sampling.min_p > 0.0:
                self.warpers.append(MinPLogitsWarper(sampling.min_p))
        self.generators = (
            None if seeds is None or sampling.greedy else [torch.Generator().manual_seed(s) for s in seeds]
        )

    @property
    def row_independent(self) -> bool:
        """Whether a row's draws depend on nothing but its own scores (greedy, or per-row seeds):
        then rows may leave the batch without changing what the others draw."""
        return self.greedy or self.generators is not None

    @property
    def needs_history(self) -> bool:
        """Whether ``draw`` needs each row's tokens so far (the repetition penalty reads them)."""
        return self.penalty is not None

    def draw(
        self,
        scores: torch.Tensor,
        rows: torch.Tensor | None = None,
        logprobs: bool = True,
        history: torch.Tensor | None = None,
    ):
        """``(tokens (b, 1), their log-probs (b, 1) or None)`` for the ``b`` rows of ``scores``:
        the original rows ``rows`` of the batch (their generators), or all of them (None).
        ``history`` (b, L): each row's tokens so far, its prompt's (left padding included, as
        ``generate`` holds them) then its completion's, for the repetition penalty."""
        if self.penalty is not None:
            if history is None:
                raise RuntimeError("repetition_penalty needs each row's tokens so far (history=)")
            scores = self.penalty(history, scores)
        for warp in self.warpers:
            scores = warp(None, scores)
        if self.greedy:
            tokens = scores.argmax(-1, keepdim=True)
        elif self.generators is None:
            tokens = torch.multinomial(scores.softmax(-1), 1)
        else:
            generators = self.generators if rows is None else [self.generators[i] for i in rows.tolist()]
            if len(generators) != scores.shape[0]:
                raise RuntimeError(f"{len(generators)} row seeds for {scores.shape[0]} rows")
            cdf = scores.double().softmax(-1).cumsum(-1)
            u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])
            tokens = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1])[:, None], right=True)
            tokens = tokens.clamp_(max=scores.shape[-1] - 1)
        return tokens, scores.float().log_softmax(-1).gather(-1, tokens) if logprobs else None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens, logprobs = self.draw(scores, history=input_ids)
        self.logprobs.append(logprobs)
        return torch.full_like(scores, float("-inf")).scatter_(-1, tokens, 0.0)

    def as_processors(self):
        from transformers import LogitsProcessorList

        return LogitsProcessorList([self])

    def token_logprobs(self, width: int) -> torch.Tensor:
        """(B, ``width``): the drawn tokens' log-probs, 0 past the steps ``generate`` ran."""
        drawn = torch.cat(self.logprobs, 1)[:, :width]
        return torch.nn.functional.pad(drawn, (0, width - drawn.shape[1]))
