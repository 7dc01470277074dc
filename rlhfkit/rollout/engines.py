"""The RL loop's generation engine: built from the config (``build_engine``) and made ready to
generate from the current policy before each rollout (``engine_ready``)."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from .. import distributed
from ..config import HFOptions, VLLMOptions, takes
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
    VLLMOptions,
)
class EngineConfig:
    """The fields of ``RLConfig`` that choose and size the rollout engine, each engine's options among them
    (``HFOptions``, ``VLLMOptions``); same names, same meaning."""


def build_engine(args: EngineConfig, models: RLModels, prompt_ids: list[list[int]]):
    """The rollout engine ``args.rollout_engine`` names: HF generate on the policy, or a vLLM engine
    in this process sized for the longest prompt plus the longest completion the run asks for.

    With ``rollout_workers``: a generator rank's HF engine also returns its log-probs (it samples
    from received weights, the behaviour policy of the correction); a trainer rank only evaluates,
    always with HF generate on its policy (no second engine beside the training models).

    The HF engine decodes as ``args.hf_decode`` says (``HFEngine``'s ``decode``: "loop", "generate"
    or "static"). With ``args.rollout_precision`` it samples from a quantized copy of the policy
    (``quantized.QuantizedEngine``, synced after every update and reporting its log-probs, which
    ``rollout_is`` corrects; ``rollout_is="none"`` warns once that the gap goes uncorrected)."""
    tokenizer = models.tokenizer
    generator = distributed.is_generator()
    if args.rollout_precision and args.rollout_engine == "hf" and not args.rollout_workers:
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
    if args.rollout_engine == "hf" or (args.rollout_workers and not generator):
        return HFEngine(
            models.policy,
            tokenizer.pad_token_id,
            tokenizer.eos_token_id,
            args.share_prompt,
            logprobs=generator,
            decode=args.hf_decode,
        )
    from .vllm import VLLMEngine
    from .weight_sync import check_engine_weights

    check_engine_weights(models.policy)  # an adapter the engine cannot receive merged: one line, before training
    longest = max((len(p) for p in prompt_ids), default=1)
    new_tokens = max(args.max_new_tokens, args.eval_max_new_tokens or 0)
    length = longest + new_tokens + 1
    positions = getattr(getattr(models.policy, "config", None), "max_position_embeddings", None)
    if isinstance(positions, int):  # an agent's engine is sized for the longest allowed prompt: never past the model
        length = min(length, positions)
    return VLLMEngine(
        models.policy,
        tokenizer,
        max_model_len=length,
        seed=args.seed + 1_000_003 * distributed.role_rank(),
        kv_cache_gb=args.vllm_kv_cache_gb,
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        enforce_eager=args.vllm_enforce_eager,
        sleep=args.vllm_sleep,
        tensor_parallel_size=args.vllm_tensor_parallel_size,
        multiprocess=distributed.role_size() > 1,
        isolated=generator,
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
