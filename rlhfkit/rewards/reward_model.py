"""A trained reward model as a reward function of TRL's shape: ``f(prompts, completions) -> scores``.

The text is re-tokenised with the reward model's own tokenizer (it may differ from the policy's),
with EOS appended to every completion as in reward-model training, and scored at the last token.
"""

from __future__ import annotations

from typing import Callable

import torch


class RewardModelFunction:
    """Wraps a model with ``score(input_ids, attention_mask) -> (B,)`` (e.g. ``ScalarModel``).

    ``render`` turns a dataset prompt (text or chat messages) into text; the trainer passes the
    chat-template renderer.
    """

    def __init__(self, model, tokenizer, render: Callable | None = None, batch_size: int = 16,
                 name: str = "reward_model"):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.render = render or (lambda prompt, tok: prompt)
        self.__name__ = name

    @torch.no_grad()
    def __call__(self, prompts, completions, **_columns) -> list[float]:
        eos = self.tokenizer.eos_token or ""
        texts = [self.render(p, self.tokenizer) + c + eos for p, c in zip(prompts, completions)]
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[start : start + self.batch_size], return_tensors="pt", padding=True,
                                 add_special_tokens=False)
            scores += self.model.score(enc["input_ids"].to(device), enc["attention_mask"].to(device)).tolist()
        return scores
