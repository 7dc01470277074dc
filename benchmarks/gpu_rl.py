"""The RL side of the GPU check (``benchmarks/gpu_check.py``): the RL trainer every RL check builds,
its prompts and reward, and the rollout checks — GRPO sampling from a quantized copy, GRPO with the
compiled (static-cache) decode, and the HF engine's decode variants side by side."""

from __future__ import annotations

import gc
import math
import string
import sys
import time
import traceback
from pathlib import Path

import torch

# the decode check's engines (benchmarks/decode.py's variants: hf_decode[:rollout_precision]), the first the baseline
DECODE_VARIANTS = {
    "cuda": ("generate", "loop", "static", "loop:bfloat16", "loop:fp8", "static:fp8"),
    "cpu": ("generate", "loop", "loop:int8", "loop:bfloat16"),
}


# The model of each device: Qwen2.5-0.5B's shape on CUDA; the same architecture, tiny, on the CPU.
def text(i: int, length: int) -> str:
    """Row ``i``'s text of exactly ``length`` characters (= tokens)."""
    return (f"row {i}: " + "the quick brown fox jumps over the lazy dog. " * (length // 40 + 2))[:length]


def distinct_letters(prompts, completions, **columns):
    """The reward of the RL checks: the share of distinct letters a completion uses."""
    return [len(set(c) & set(string.ascii_lowercase)) / 26 for c in completions]


def rl_trainer(ctx, algorithm: str, dtype: torch.dtype = torch.bfloat16, peft_config=None, **overrides):
    from rlhfkit.config import RLConfig
    from rlhfkit.trainers import RLTrainer

    w = ctx.work
    prompts = w["prompts"] if algorithm != "ppo" else w["ppo_prompts"]
    rows = [{"prompt": text(i, w["prompt"])} for i in range(prompts * ctx.steps)]
    args = RLConfig(
        algorithm=algorithm,
        prompts_per_step=prompts,
        max_new_tokens=w["new_tokens"],
        max_steps=ctx.steps,
        rollout_engine="hf",
        dtype=str(dtype).removeprefix("torch."),
        **({"group_size": w["group"]} if algorithm != "ppo" else {}),
        **ctx.common(),
        **overrides,
    )
    return RLTrainer(
        ctx.model(dtype),
        [distinct_letters],
        args,
        train_dataset=rows,
        processing_class=ctx.tokenizer,
        peft_config=peft_config,
    )


def check_quantized(ctx):
    """GRPO sampling from a quantized copy (``rollout_precision``: fp8 via torchao on CUDA, int8 on
    the CPU), corrected by ``rollout_is``; the mismatch metrics of the last step are reported."""
    precision = "fp8" if ctx.device.type == "cuda" else "int8"
    trainer = rl_trainer(
        ctx, "grpo", torch.float32 if precision == "int8" else torch.bfloat16, rollout_precision=precision
    )
    result = ctx.measure(trainer, "rollout/logprob_diff_mean")
    result["rollout_precision"] = precision
    result["mismatch"] = {k: v for k, v in ctx.last.items() if k.startswith("rollout/")}
    return result


def lora_config():
    """The LoRA adapter of the LoRA checks: r 16 on the attention projections."""
    from peft import LoraConfig

    return LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
    )


# The compiled check's runs: name -> (weights' dtype, RLConfig.autocast, LoRA adapter); the first gives its numbers.
COMPILED_VARIANTS = {
    "bf16": (torch.bfloat16, None, False),
    "fp32_autocast_bf16": (torch.float32, "bfloat16", False),
    "lora_fp32_autocast_bf16": (torch.float32, "bfloat16", True),
}


def check_compiled(ctx):
    """GRPO with the static-cache decode (``hf_decode='static'``: compiled with CUDA graphs on CUDA)
    for each of ``COMPILED_VARIANTS``: bfloat16 weights (the check's numbers), float32 weights
    under bfloat16 autocast (``autocast: bfloat16``, TRL's ``bf16=True``: float32 keys, bfloat16
    values; transformers < 5.24 allocate a static layer's values in its keys' dtype, which failed
    before ``HFEngine._static_cache`` allocated the cache itself), and that with a LoRA adapter.
    Each run's ``ok``, ``step_s`` and ``tokens_per_s`` (or its error) under ``variants``, in a run
    directory and a torch.compile state of its own; any failed run fails the check, after all ran."""
    base, variants, first = ctx.out_dir, {}, None
    for name, (dtype, autocast, lora) in COMPILED_VARIANTS.items():
        torch._dynamo.reset()  # each run compiles afresh (its warm-up step, left out of the times)
        ctx.out_dir = f"{base}-{name}" if base else None
        options = {"autocast": autocast} if autocast else {}
        try:
            trainer = rl_trainer(ctx, "grpo", dtype, lora_config() if lora else None, hf_decode="static", **options)
            result = ctx.measure(trainer, "reward/mean")
        except Exception as e:  # noqa: BLE001 — named in the report, the other runs go on
            traceback.print_exc()
            variants[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1000]}
            continue
        finally:
            trainer = None
            gc.collect()
        first = first or result
        variants[name] = {"ok": True, "step_s": result["step_s"], "tokens_per_s": result.get("tokens_per_s")}
    ctx.out_dir = base
    failed = [name for name, v in variants.items() if not v["ok"]]
    if failed:
        raise RuntimeError(f"hf_decode='static' failed for {', '.join(failed)}: {variants}")
    return {**first, "variants": variants}


def check_decode(ctx):
    """Decode tokens/s of the HF engine's variants (``DECODE_VARIANTS``: ``hf_decode`` and
    ``rollout_precision``) on the check's model in float32, the GRPO check's rows (prompts x group,
    ``new_tokens`` each), one warm-up call (it compiles ``static``), then ``ctx.steps - 1`` timed calls
    per variant, alternated, with the same seeds. Per variant: ``tokens_per_s``, ``speedup`` over
    ``generate``, for a quantized copy ``logprob_gap`` (mean |its log-prob - the float32 model's|
    per sampled token), and for another decode of the float32 model ``rows_differ``: the share of
    rows whose completion differs from ``generate``'s (0: token-exact on this device). A variant
    that fails is reported with its error; the others go on."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from decode import engine, logprob_gap  # benchmarks/decode.py

    from rlhfkit.data.encode import tokenize_prompts
    from rlhfkit.rollout import SamplingParams

    w = ctx.work
    model = ctx.model(torch.float32).eval()
    prompts = tokenize_prompts([{"prompt": text(i, w["prompt"])} for i in range(w["prompts"])], ctx.tokenizer, None)
    sampling = SamplingParams(max_new_tokens=w["new_tokens"], temperature=1.0)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    engines, errors, seconds, gaps, tokens, last = {}, {}, {}, {}, {}, {}
    for variant in DECODE_VARIANTS[ctx.device.type]:
        try:
            engines[variant] = engine(variant, model, ctx.tokenizer, share_prompt=True)
        except Exception as e:  # noqa: BLE001 — e.g. fp8 without torchao: named, the others go on
            errors[variant] = f"{type(e).__name__}: {e}"[:500]
    for rep in range(max(ctx.steps, 2)):
        order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
        for variant in order:
            sync()
            start = time.perf_counter()
            try:
                out = engines[variant].generate(prompts, w["group"], sampling, seed=list(range(len(prompts))))
            except Exception as e:  # noqa: BLE001
                errors[variant] = f"{type(e).__name__}: {e}"[:500]
                del engines[variant]
                continue
            sync()
            last[variant] = out  # every round samples with the same seeds
            if rep:  # round 0 warms up (and compiles)
                seconds[variant] = seconds.get(variant, 0.0) + time.perf_counter() - start
                tokens[variant] = tokens.get(variant, 0) + int(out.response_mask.sum())
                if ":" in variant:
                    gaps[variant] = logprob_gap(model, out)
    speed = {v: round(tokens[v] / seconds[v], 1) for v in seconds}
    baseline = DECODE_VARIANTS[ctx.device.type][0]
    base = speed.get(baseline)
    if not base:
        raise RuntimeError(f"the baseline decode failed: {errors}")
    if any(not math.isfinite(g) for g in gaps.values()):
        raise RuntimeError(f"a quantized copy sampled with non-finite log-probs: {gaps}")
    return {
        "step_s": round(sum(seconds.values()) / max(len(seconds), 1) / (max(ctx.steps, 2) - 1), 4),  # s per call
        "steps_timed": max(ctx.steps, 2) - 1,
        "tokens_per_s": base,
        "decode_tokens_per_s": speed,
        "speedup": {v: round(x / base, 3) for v, x in speed.items()},
        "logprob_gap": {v: round(g, 5) for v, g in gaps.items()},
        "rows_differ": {v: rows_differ(r, last[baseline]) for v, r in last.items() if ":" not in v and v != baseline},
        "errors": errors,
        "rows": len(prompts) * w["group"],
        "new_tokens": w["new_tokens"],
    }


def rows_differ(a, b) -> float:
    """The share of rows whose completion (its tokens up to its EOS) differs between rollouts ``a``
    and ``b`` of the same prompts and seeds."""
    width = max(a.response_ids.shape[1], b.response_ids.shape[1])

    def completions(r):
        ids = r.response_ids.masked_fill(r.response_mask == 0, -1)
        return torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=-1)

    return round(float((completions(a) != completions(b)).any(-1).float().mean()), 4)
