"""The default rollout engine: Hugging Face ``generate`` (batched, left-padded, KV cache)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch

from ..models.policy import position_ids_from_mask
from ..data.padding import pad
from .base import Rollout, SamplingParams, group_index, response_mask_from_ids


class HFEngine:
    """Samples with ``model.generate`` from the live policy (no weight sync needed).

    ``n`` completions per prompt are produced by repeating each prompt ``n`` times, so rows
    ``g*n .. g*n+n-1`` share prompt ``g``. With ``share_prompt`` each prompt is encoded once and its
    key/value cache repeated for its ``n`` rows (``generate`` then only runs the last prompt token
    and the new tokens per row).
    """

    needs_sync = False  # it samples from the trained model itself

    def __init__(self, model, pad_id: int, eos_id: int, share_prompt: bool = True, logprobs: bool = False):
        self.model, self.pad_id, self.eos_id, self.share_prompt = model, pad_id, eos_id, share_prompt
        # Also report the sampler's log-prob of each token: needed where the engine's weights are not the
        # trained ones (a generator rank, rollout_workers: the behaviour policy of the correction).
        self.logprobs = logprobs

    def generation_config(self, sampling: SamplingParams):
        """Every field that shapes the sampled distribution, set explicitly from ``sampling``.

        transformers fills each field a ``GenerationConfig`` leaves unset from the model's own
        ``generation_config.json`` (Qwen2.5-Instruct ships ``repetition_penalty: 1.05``) and then
        from its global defaults (``top_k: 50``): a penalty or an n-gram ban the trainer's
        log-probs know nothing of. So the neutral value of every processor is written out here,
        and ``generate`` also runs with the model's own generation config set aside
        (``_neutral_model_defaults``): the model can change nothing but the EOS and pad ids, which
        come from the tokenizer."""
        from transformers import GenerationConfig

        if sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
        neutral = dict(num_beams=1, repetition_penalty=1.0, no_repeat_ngram_size=0, min_new_tokens=0,
                       bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None, sequence_bias=None,
                       forced_bos_token_id=None, forced_eos_token_id=None, encoder_repetition_penalty=1.0,
                       exponential_decay_length_penalty=None, guidance_scale=None, typical_p=1.0,
                       epsilon_cutoff=0.0, eta_cutoff=0.0, min_p=None, stop_strings=None, renormalize_logits=False)
        common = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=self.eos_id, pad_token_id=self.pad_id,
                      use_cache=True, **neutral)
        if sampling.greedy:
            return GenerationConfig(do_sample=False, temperature=1.0, top_p=1.0, top_k=0, **common)
        return GenerationConfig(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p,
                                top_k=sampling.top_k, **common)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 seed: int | None = None) -> Rollout:
        """``seed`` fixes the sampling: ``generate`` draws from torch's generator seeded with it (the
        global one, forked for the call, so nothing else's random stream moves); a call with the same
        prompts, weights and seed samples the same tokens on any process. None: the global stream."""
        device = next(self.model.parameters()).device
        if seed is None:
            return self._generate(prompts, n, sampling, device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            return self._generate(prompts, n, sampling, device)

    def _generate(self, prompts, n: int, sampling: SamplingParams, device) -> Rollout:
        prompt_ids, prompt_mask = pad(prompts, self.pad_id, "left", device=device)
        ids, mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
        was_training = self.model.training
        self.model.eval()
        try:
            cache = self._prompt_cache(prompt_ids, prompt_mask, n)
            with _neutral_model_defaults(self.model):
                config = self.generation_config(sampling)
                config.output_scores = config.return_dict_in_generate = self.logprobs
                # synced_gpus=False: the policy is gathered (``distributed.gathered``), so a forward pass is no
                # collective. transformers would otherwise turn it on for an FSDP model under torchrun and
                # all-reduce a "finished" flag every token: a process whose agent episodes end a turn earlier
                # than another's makes one ``generate`` call fewer, and the other waits on it forever.
                out = self.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache,
                                          generation_config=config, synced_gpus=False)
        finally:
            self.model.train(was_training)
        sequences = out.sequences if self.logprobs else out
        responses = sequences[:, ids.shape[1] :]
        response_mask, has_eos = response_mask_from_ids(responses, self.eos_id)
        rollout = Rollout(sequences, torch.cat([mask, response_mask], 1), response_mask, has_eos, ids.shape[1],
                          group_index(len(prompts), n, device))
        if self.logprobs:  # the processed scores (after temperature, top-k, top-p) the sampler drew from
            scores = torch.stack(out.scores, 1).float().log_softmax(-1)
            rollout.logprobs = scores.gather(-1, responses[:, : scores.shape[1], None]).squeeze(-1) * response_mask
        return rollout

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


@contextmanager
def _neutral_model_defaults(model):
    """Every module's ``generation_config`` (the model's ``generation_config.json``, which
    transformers reads for each field a passed config leaves unset) replaced by an empty one for
    the block, then restored: nothing of it can reach the sampler."""
    from transformers import GenerationConfig

    saved = [(m, m.generation_config) for m in model.modules()
             if isinstance(getattr(m, "generation_config", None), GenerationConfig)]
    try:
        for m, _ in saved:
            m.generation_config = GenerationConfig()
        yield
    finally:
        for m, config in saved:
            m.generation_config = config
