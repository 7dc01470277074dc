"""The default rollout engine: Hugging Face ``generate`` (batched, left-padded, KV cache)."""

from __future__ import annotations

from typing import Sequence

import torch

from .base import Rollout, SamplingParams, left_pad, response_mask_from_ids


class HFEngine:
    """Samples with ``model.generate`` from the live policy (no weight sync needed).

    ``n`` completions per prompt are produced by repeating each prompt ``n`` times, so rows
    ``g*n .. g*n+n-1`` share prompt ``g``.
    """

    def __init__(self, model, pad_id: int, eos_id: int):
        self.model, self.pad_id, self.eos_id = model, pad_id, eos_id

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
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams) -> Rollout:
        device = next(self.model.parameters()).device
        ids, mask = left_pad(prompts, self.pad_id)
        ids, mask = ids.repeat_interleave(n, 0).to(device), mask.repeat_interleave(n, 0).to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(input_ids=ids, attention_mask=mask,
                                      generation_config=self.generation_config(sampling))
        finally:
            self.model.train(was_training)
        responses = out[:, ids.shape[1] :]
        response_mask, has_eos = response_mask_from_ids(responses, self.eos_id)
        return Rollout(out, torch.cat([mask, response_mask], 1), response_mask, has_eos, ids.shape[1])
