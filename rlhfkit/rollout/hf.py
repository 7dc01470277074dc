"""The default rollout engine: Hugging Face ``generate`` (batched, left-padded, KV cache)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import cast

import torch

from ..config.rl import HF_DECODE_MODES as DECODE_MODES
from ..data.padding import pad
from ..models import efficiency
from ..models.loading import eos_token_ids
from ..models.policy import output_cache, position_ids_from_mask, with_cache
from .base import Rollout, SamplingParams, Seed, group_index, response_mask_from_ids, row_seeds
from .decode import decode
from .token_sampler import TokenSampler

DEFAULT_DECODE = "loop"


class HFEngine:
    """Samples from the live policy (no weight sync needed), by ``decode``: "loop" — the engine's
    own decode loop (``rollout.decode``: the model calls ``generate`` makes, a cache allocated once,
    finished rows dropped from the batch; the same tokens for the same seeds, greedy as
    ``generate``; on a CPU a bfloat16 / float16 model attends by matmuls in its decode steps,
    ``rollout.decode.decode_attention``, for the call only) —, "generate" (``model.generate``
    with the sampler as its logits processor), or "static" (``generate`` with transformers'
    ``StaticCache``: on a GPU transformers compiles the decode step, CUDA graphs included, ~3x the
    decode speed of "generate" on an H200; slower on a CPU; under autocast too, ``_static_cache``).
    On a CPU in float32 "static" samples the same tokens as "generate" and "loop" for the same
    seeds (measured); in bfloat16 / float16, weights or autocast, its attention over the whole
    preallocated buffer rounds differently (a buffer of the exact length gives "generate"'s logits
    bit for bit), so now and then a token differs (on a CPU under bfloat16 autocast, 4–9% of
    48-token rows sampled at temperature 1); on a GPU its compiled kernels round differently too.
    ``benchmarks/decode.py`` measures them.

    ``n`` completions per prompt are produced by repeating each prompt ``n`` times, so rows
    ``g*n .. g*n+n-1`` share prompt ``g``. With ``share_prompt`` each prompt is encoded once and its
    key/value cache repeated for its ``n`` rows (``generate`` then only runs the last prompt token
    and the new tokens per row).

    ``eos_id`` (the tokenizer's EOS id, or several): a completion ends at it and at every EOS id
    the model's ``generation_config`` declares (``eos_ids``, ``models.loading.eos_token_ids``:
    Gemma 2's ``<end_of_turn>``, Llama 3 Instruct's ``<|eot_id|>``), as TRL's GRPO stops.
    """

    needs_sync = False  # it samples from the trained model itself

    def __init__(
        self,
        model,
        pad_id: int,
        eos_id: int | Sequence[int],
        share_prompt: bool = True,
        logprobs: bool = False,
        decode: str = DEFAULT_DECODE,
    ):
        if decode not in DECODE_MODES:
            raise ValueError(f"HFEngine decode={decode!r}: one of {', '.join(DECODE_MODES)}")
        self.model, self.pad_id, self.share_prompt, self.decode = model, pad_id, share_prompt, decode
        self.eos_ids = eos_token_ids(eos_id, model)  # read now: generate sets the model's generation config aside
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
        (``_neutral_model_defaults``): the model can change nothing but where a completion ends
        (``eos_ids``: the tokenizer's EOS and the model's own); the pad id is the tokenizer's."""
        from transformers import GenerationConfig

        if sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
        neutral = dict(
            num_beams=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            min_new_tokens=0,
            bad_words_ids=None,
            suppress_tokens=None,
            begin_suppress_tokens=None,
            sequence_bias=None,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
            encoder_repetition_penalty=1.0,
            exponential_decay_length_penalty=None,
            guidance_scale=None,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            min_p=None,
            stop_strings=None,
            renormalize_logits=False,
        )
        eos = self.eos_ids[0] if len(self.eos_ids) == 1 else list(self.eos_ids)
        common = dict(
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=self.pad_id,
            use_cache=True,
            **neutral,
        )
        if sampling.greedy:  # no warper runs without do_sample: temperature, top_p and top_k are left unset
            # (set, transformers would warn that they are "not valid and may be ignored")
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k, **common
        )

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingParams, seed: Seed = None
    ) -> Rollout:
        """``n`` completions per prompt. ``seed`` (``rollout.base.prompt_seeds``: one per prompt, or
        an int) fixes the sampling row by row: each row draws from a ``torch.Generator`` of its own
        seeded with its ``row_seeds`` entry, so a row samples the same tokens whatever else is in the
        batch. None: torch's global random stream."""
        if sampling.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = pad(prompts, self.pad_id, "left", device=device)
        ids, mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
        sampler = TokenSampler(sampling, row_seeds(seed, len(prompts), n))
        was_training = self.model.training
        self.model.eval()
        if self.decode == "loop":
            try:
                out = decode(
                    self.model,
                    prompt_ids,
                    prompt_mask,
                    n,
                    sampler,
                    sampling.max_new_tokens,
                    self.eos_ids,
                    self.pad_id,
                    self.share_prompt,
                    self.logprobs,
                )
            finally:
                self.model.train(was_training)
            return self._rollout(prompt_ids, prompt_mask, n, out.responses, out.logprobs, False, out.computed)
        try:
            cache = self._prompt_cache(prompt_ids, prompt_mask, n)
            if self.decode == "static":
                cache = self._static_cache(cache, ids, prompt_ids.shape[1] + sampling.max_new_tokens)
            with _neutral_model_defaults(self.model):
                # Decoding picks the token the sampler drew: ``generate`` runs greedy over its output.
                config = self.generation_config(replace(sampling, greedy=True))
                # synced_gpus=False: the policy is gathered (``distributed.gathered``), so a forward pass is no
                # collective. transformers would otherwise turn it on for an FSDP model under torchrun and
                # all-reduce a "finished" flag every token: a process whose agent episodes end a turn earlier
                # than another's makes one ``generate`` call fewer, and the other waits on it forever.
                sequences = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    **with_cache(cache),
                    generation_config=config,
                    logits_processor=sampler.as_processors(),
                    synced_gpus=False,
                )
        finally:
            self.model.train(was_training)
        responses = sequences[:, ids.shape[1] :]
        logprobs = sampler.token_logprobs(responses.shape[1]) if self.logprobs else None
        return self._rollout(prompt_ids, prompt_mask, n, responses, logprobs, cache is not None, None)

    def _rollout(
        self, prompt_ids, prompt_mask, n: int, responses, logprobs, cached: bool, computed: int | None
    ) -> Rollout:
        """The ``Rollout`` of the ``n`` rows per prompt and their ``responses`` (B, W); ``logprobs``
        (B, W): the drawn tokens' (masked here past each row's EOS) or None; ``cached`` and
        ``computed``: what the model ran, for ``_count``."""
        ids, mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
        response_mask, has_eos = response_mask_from_ids(responses, self.eos_ids)
        if efficiency.active():
            self._count(prompt_mask, cached, response_mask, computed)
        rollout = Rollout(
            torch.cat([ids, responses], 1),
            torch.cat([mask, response_mask], 1),
            response_mask,
            has_eos,
            ids.shape[1],
            group_index(len(prompt_ids), n, ids.device),
        )
        if logprobs is not None:  # the log-prob of each drawn token under the distribution it was drawn from
            rollout.logprobs = logprobs * response_mask
        return rollout

    def sleep(self) -> None:
        """Nothing to release: the engine is the trained model."""

    @staticmethod
    def _count(
        prompt_mask: torch.Tensor, cached: bool, response_mask: torch.Tensor, computed: int | None = None
    ) -> None:
        """The positions the model ran (``models.efficiency``): ``computed`` (the loop's own count:
        finished rows leave its batch), or those ``generate`` runs — the prefill: each prompt's
        columns but the last once when cached (``_prompt_cache``), then every row's last prompt
        column; every row's whole prompt otherwise — and ``B`` positions per later decode step;
        needed: each prompt's real tokens once, each row's real completion tokens but the last."""
        (n, P), (B, W) = prompt_mask.shape, response_mask.shape
        if computed is None:
            computed = (n * (P - 1) + B if cached else B * P) + B * max(W - 1, 0)
        efficiency.add_computed(computed)
        efficiency.add_needed("generate", efficiency.needed(prompt_mask.sum(-1), response_mask.sum(-1)))

    def _static_cache(self, prompt_cache, ids: torch.Tensor, length: int):
        """transformers' ``StaticCache`` of ``length`` columns for the rows of ``ids`` (``generate``
        compiles its decode step for it on GPUs: ``torch.compile`` with CUDA graphs), holding
        ``prompt_cache``'s columns when there is one.

        Each layer holds its keys and its values in the dtype the model writes them in, which under
        autocast over float32 weights (``autocast: bfloat16``) differ: the values are the value
        projection's bfloat16, the keys float32 (RoPE's float32 cos / sin promote them).
        transformers >= 5.24 allocates a layer's buffers so at its first update; earlier releases
        (5.17–5.23 at least) allocate the values in the keys' dtype, and writing bfloat16 values
        into float32 buffers failed (``index_copy_(): self and source expected to have the same
        dtype``). With those (``_static_values_take_key_dtype``) the layers are allocated here
        before any update (``_allocate_static``)."""
        from transformers import StaticCache
        from transformers.cache_utils import CacheLayerMixin

        cache = StaticCache(config=self.model.config, max_cache_len=length)
        if _static_values_take_key_dtype():
            self._allocate_static(cache, ids, prompt_cache)
        if prompt_cache is not None:
            for layer, prompt in zip(cache.layers, prompt_cache.layers):
                cast(CacheLayerMixin, layer).update(prompt.keys, prompt.values)  # a static cache's layers attend fully
        return cache

    def _allocate_static(self, cache, ids: torch.Tensor, prompt_cache) -> None:
        """Allocate ``cache``'s full-attention layers for the rows of ``ids``, keys and values each
        in the dtype (and with the heads and head size) the model writes them in: those of
        ``prompt_cache`` (a ``decode_cache``, whose layers keep both dtypes), or without one, of one
        token of the first row run through a ``decode_cache`` under the caller's autocast (a model
        call the efficiency counters leave out). Layers of other kinds (sliding windows) are
        allocated by transformers at their first update, the values in the keys' dtype."""
        from .cache import GrowingLayer, decode_cache

        if prompt_cache is None:
            prompt_cache = decode_cache(self.model, capacity=1)
            self.model(input_ids=ids[:1, -1:], use_cache=True, logits_to_keep=1, **with_cache(prompt_cache))
        rows = ids.shape[0]
        for layer, seen in zip(cache.layers, prompt_cache.layers):
            if not isinstance(seen, GrowingLayer) or not seen.length or seen.keys is None or seen.values is None:
                continue
            k, v = seen.keys, seen.values
            layer.lazy_initialization(
                k.new_empty((rows, k.shape[1], 0, k.shape[-1])), v.new_empty((rows, v.shape[1], 0, v.shape[-1]))
            )
            if layer.values.dtype != v.dtype:  # the values' own buffer (transformers < 5.24 gave them the keys' dtype)
                layer.values = torch.zeros_like(layer.values, dtype=v.dtype)
                torch._dynamo.mark_static_address(layer.values)  # as transformers marks its buffers, for CUDA graphs

    def _prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """The cache of every prompt token but the last, computed once per prompt and repeated ``n``
        times; None (generate encodes the repeated prompts itself) when there is nothing to share.
        For ``decode="static"`` a ``decode_cache`` (``_static_cache`` copies it): its layers hold the
        keys and the values each in its own dtype, whatever transformers' release."""
        if not self.share_prompt or n < 2 or int(mask[:, :-1].sum(-1).min()) < 1:
            return None
        from .cache import decode_cache

        own = with_cache(decode_cache(self.model, capacity=ids.shape[1] - 1)) if self.decode == "static" else {}
        out = self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=position_ids_from_mask(mask[:, :-1]),
            use_cache=True,
            logits_to_keep=1,
            **own,
        )
        cache = output_cache(out)
        cache.batch_repeat_interleave(n)
        return cache


def _static_values_take_key_dtype() -> bool:
    """Whether transformers' ``StaticLayer`` allocates its values in its keys' dtype (releases
    before 5.24): then a model writing keys and values in different dtypes (autocast over float32
    weights) cannot fill it lazily, and ``HFEngine._static_cache`` allocates its layers itself."""
    from transformers.cache_utils import StaticLayer

    layer = StaticLayer(max_cache_len=1)
    layer.lazy_initialization(torch.zeros(1, 1, 0, 1), torch.zeros(1, 1, 0, 1, dtype=torch.bfloat16))
    return layer.values is not None and layer.values.dtype != torch.bfloat16


@contextmanager
def _neutral_model_defaults(model):
    """Every module's ``generation_config`` (the model's ``generation_config.json``, which
    transformers reads for each field a passed config leaves unset) replaced by an empty one for
    the block, then restored: nothing of it can reach the sampler."""
    from transformers import GenerationConfig

    saved = [
        (m, m.generation_config)
        for m in model.modules()
        if isinstance(getattr(m, "generation_config", None), GenerationConfig)
    ]
    try:
        for m, _ in saved:
            m.generation_config = GenerationConfig()
        yield
    finally:
        for m, config in saved:
            m.generation_config = config
