"""The RL loop's generation engine: built from the config by its registry entry (``build_engine``,
``config.engines``) and made ready to generate from the current policy before each rollout
(``engine_ready``)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from .. import distributed
from ..config import HFOptions
from ..config.engines import engine_entry, resolve
from ..config.parts import ConfigFields, takes
from ..models.rl_models import RLModels
from .hf import HFEngine


@takes(
    "rollout_engine",
    "rollout_is",
    "rollout_workers",
    "share_prompt",
    "max_new_tokens",
    "eval_max_new_tokens",
    "seed",
    HFOptions,
)
class EngineConfig(ConfigFields):
    """The fields of ``RLConfig`` that choose and size the rollout engine, whichever it is, and the HF
    engine's options (``HFOptions``); same names, same meaning. Another engine's own fields (vLLM's
    ``vllm_*``) are its registry entry's ``options`` (``config.engines``)."""


def build_engine(args: EngineConfig, models: RLModels, longest_prompt: int, options: dict | None = None):
    """The rollout engine ``args.rollout_engine`` names (``config.engines``), built by its entry's
    ``build(args, models, longest_prompt, options)``: ``longest_prompt`` the longest prompt it may be
    given, in tokens; ``options`` the values of the entry's option fields
    (``registry.engine_options``).

    With ``rollout_workers`` a trainer rank only evaluates, always with HF generate on its policy
    (no second engine beside the training models); a generator rank builds the named engine."""
    if args.rollout_workers and not distributed.is_generator():
        tokenizer = models.tokenizer
        return HFEngine(
            models.policy, tokenizer.pad_token_id, tokenizer.eos_token_id, args.share_prompt, decode=args.hf_decode
        )
    return resolve(engine_entry(args.rollout_engine).build)(args, models, longest_prompt, options or {})


def build_hf_engine(args: EngineConfig, models: RLModels, longest_prompt: int, options: dict):
    """The ``hf`` entry's builder: HF generate on the policy, decoding as ``args.hf_decode`` says
    (``HFEngine``'s ``decode``: "loop", "generate" or "static"); on a generator rank it also returns
    its log-probs (it samples from received weights, the behaviour policy of the correction).

    With ``args.rollout_precision`` (not with ``rollout_workers``) it samples from a quantized copy of
    the policy (``quantized.QuantizedEngine``, synced after every update and reporting its log-probs,
    which ``rollout_is`` corrects; ``rollout_is="none"`` warns once that the gap goes uncorrected).
    ``longest_prompt`` and ``options``: unused (HF generate sizes itself per call)."""
    tokenizer = models.tokenizer
    if args.rollout_precision and not args.rollout_workers:
        from .quantized import QuantizedEngine

        if args.rollout_is == "none":
            from ..data.encode import warn_once  # one line on stderr (warnings.warn adds its source line)

            warn_once(
                f"rollout_precision={args.rollout_precision!r} with rollout_is='none': the quantized sampler's "
                "mismatch with the trained policy is not corrected (only logged as rollout/*)"
            )
        return QuantizedEngine(
            models.policy,
            args.rollout_precision,
            tokenizer.pad_token_id,
            tokenizer.eos_token_id,
            args.share_prompt,
            decode=args.hf_decode,
        )
    return HFEngine(
        models.policy,
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        args.share_prompt,
        logprobs=distributed.is_generator(),
        decode=args.hf_decode,
    )


@contextmanager
def engine_ready(engine, models: RLModels, version: int, timings: dict):
    """The engine ready to generate from the current policy. The HF engine generates with the
    policy itself (its parameters gathered under FSDP2); a vLLM engine first receives the weights
    when an update changed them since its last sync (``version``: optimizer steps so far). Every
    process syncs at this point of the loop, gathering the way HF generation does, so no process
    waits on a collective another never enters; the sync is timed as ``timings["weight_sync"]``."""
    if not engine.needs_sync:
        with models.autocast(), distributed.gathered(models.policy):
            yield
        return
    if engine.synced_version != version:
        from .weight_sync import hf_weights

        start = time.perf_counter()
        with torch.no_grad(), distributed.gathered(models.policy):
            engine.sync_weights(hf_weights(models.policy), version)
        timings["weight_sync"] = time.perf_counter() - start
    yield
