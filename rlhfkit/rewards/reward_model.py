"""A trained reward model as a reward function of TRL's shape: ``f(prompts, completions) -> scores``.

The text is re-tokenised with the reward model's own tokenizer (it may differ from the policy's)
exactly as in reward-model training — ``encode(prompt, completion, tokenizer)`` (the trainer passes
``data.encode.encode_pair``: prompt rendered with the chat template, completion, EOS by id) — and
scored at the last token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..data.padding import pad


def _concat(prompt, completion, tokenizer):
    """Fallback encoding for text prompts: prompt + completion + EOS id."""
    ids = tokenizer(str(prompt) + completion, add_special_tokens=False)["input_ids"]
    return ids + [tokenizer.eos_token_id]


class RewardModelFunction:
    """Wraps a model with ``score(input_ids, attention_mask) -> (B,)`` (e.g. ``ScalarModel``)."""

    def __init__(
        self,
        model,
        tokenizer,
        encode: Callable | None = None,
        batch_size: int = 16,
        name: str = "reward_model",
        max_length: int | None = None,
    ):
        self.model, self.tokenizer, self.batch_size, self.max_length = model, tokenizer, batch_size, max_length
        self.encode = encode or _concat
        self.__name__ = name

    def _ids(self, prompt, completion) -> list[int]:
        encoded = self.encode(prompt, completion, self.tokenizer)
        ids = encoded if isinstance(encoded, list) else encoded.input_ids
        return ids[-self.max_length :] if self.max_length else ids

    @torch.no_grad()
    def __call__(self, prompts, completions, **_columns) -> list[float]:
        device = next(self.model.parameters()).device
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        scores: list[float] = []
        for start in range(0, len(completions), self.batch_size):
            seqs = [
                self._ids(p, c)
                for p, c in zip(prompts[start : start + self.batch_size], completions[start : start + self.batch_size])
            ]
            ids, mask = pad(seqs, pad_id, device=device)  # right padding: the score is read at the last attended token
            scores += self.model.score(ids, mask).tolist()
        return scores
