"""The default rollout engine: Hugging Face ``generate`` (batched, left-padded, KV cache)."""

from __future__ import annotations

from typing import Sequence

import torch

from ..models.policy import position_ids_from_mask
from .base import Rollout, SamplingParams, group_index, left_pad, response_mask_from_ids


class HFEngine:
    """Samples with ``model.generate`` from the live policy (no weight sync needed).

    ``n`` completions per prompt are produced by repeating each prompt ``n`` times, so rows
    ``g*n .. g*n+n-1`` share prompt ``g``. With ``share_prompt`` each prompt is encoded once and its
    key/value cache repeated for its ``n`` rows (``generate`` then only runs the last prompt token
    and the new tokens per row).
    """

    needs_sync = False  # it samples from the trained model itself

    def __init__(self, model, pad_id: int, eos_id: int, share_prompt: bool = True):
        self.model, self.pad_id, self.eos_id, self.share_prompt = model, pad_id, eos_id, share_prompt

    def generation_config(self, sampling: SamplingParams):
        from transformers import GenerationConfig

        if sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
        common = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=self.eos_id, pad_token_id=self.pad_id,
                      use_cache=True)
        if sampling.greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                top_k=sampling.top_k, **common)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 seed: int | None = None) -> Rollout:
        """``seed`` is not used: ``generate`` draws from torch's generator, seeded with the run."""
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = (t.to(device) for t in left_pad(prompts, self.pad_id))
        ids, mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
        was_training = self.model.training
        self.model.eval()
        try:
            cache = self._prompt_cache(prompt_ids, prompt_mask, n)
            out = self.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache,
                                      generation_config=self.generation_config(sampling))
        finally:
            self.model.train(was_training)
        responses = out[:, ids.shape[1] :]
        response_mask, has_eos = response_mask_from_ids(responses, self.eos_id)
        return Rollout(out, torch.cat([mask, response_mask], 1), response_mask, has_eos, ids.shape[1],
                       group_index(len(prompts), n, device))

    def sleep(self) -> None:
        """Nothing to release: the engine is the trained model."""

    def _prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """The cache of every prompt token but the last, computed once per prompt and repeated ``n``
        times; None (generate encodes the repeated prompts itself) when there is nothing to share."""
        if not self.share_prompt or n < 2 or int(mask[:, :-1].sum(-1).min()) < 1:
            return None
        out = self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1],
                         position_ids=position_ids_from_mask(mask[:, :-1]), use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)
        return cache
