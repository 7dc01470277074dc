"""Decode speed of the HF engine's decode modes (``HFEngine(decode=...)``), alternated.

    .venv/bin/python benchmarks/decode.py [--variants generate,loop --new-tokens 32,256 --reps 3]
    .venv/bin/python benchmarks/decode.py --device cuda --model random-smollm2 --variants generate,static,loop

SmolLM2-135M-Instruct in float32 (as it trains) on the arithmetic prompts, ``--prompts`` x
``--group-size`` rows (16 by default), temperature 1, one seed per prompt, ``share_prompt`` on (the
engine's default). For each ``--new-tokens`` limit, ``--reps`` rounds after one warm-up round; a
round calls ``HFEngine.generate`` once per variant, in turn (the order reversed every other round),
with the same seeds (so every variant samples the same completions: the tokens are checked
equal to the first variant's, a line ``{"warning": ...}`` where they are not). Printed per
limit, one JSON line: ``tokens_per_s`` — completion tokens (up to and including each row's EOS)
per second of the call, prefill included —, the mean seconds per call, the mean completion length,
the decode steps, and each variant's speed-up over the first.

Variants: ``generate`` (transformers' ``generate``, dynamic cache), ``static`` (``generate`` with
transformers' ``StaticCache``; on CUDA it compiles the decode step with CUDA graphs), ``loop``
(``rollout.decode``: a cache allocated once, finished rows dropped).

A variant may name a rollout precision after a colon (``rollout_precision``: ``loop:bfloat16``,
``static:fp8``, ``generate:int8``): that engine is ``QuantizedEngine`` over a copy of the model at
that precision (int8 on the CPU, fp8 on CUDA with torchao), synced once from the model. Its
tokens are not compared with the baseline's (another precision samples other tokens); its line
adds ``logprob_gap``: the mean |log-prob it sampled with - the full-precision model's| per token.

``--model``: a local model directory, the default SmolLM2 GGUF (``make smollm2``), ``tiny`` (the
tests' tiny Llama, for the smoke test) or ``random-smollm2`` (SmolLM2-135M's shape with random
weights and the char tokenizer: no download, for the GPU machine; completions rarely end early).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def load(name: str, device: str):
    import torch

    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    if name == "tiny":
        tok = char_tokenizer()
        return tiny_causal_lm(tok, seed=3).to(device), tok
    if name == "random-smollm2":
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = char_tokenizer()
        config = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        torch.manual_seed(0)
        return LlamaForCausalLM(config).to(device), tok
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.models.sources import resolve_model_dir, smollm2_gguf

    model_dir = str(resolve_model_dir(smollm2_gguf() if name == "smollm2" else name))
    return load_causal_lm(model_dir, "float32").to(device), load_tokenizer(model_dir)


def precision(variant: str) -> str:
    """The rollout precision a variant names after ``:`` (``full``: none)."""
    return variant.partition(":")[2] or "full"


def engine(variant: str, model, tok, share_prompt: bool):
    """The HF engine a variant names: ``mode`` or ``mode:precision`` (a synced ``QuantizedEngine``)."""
    from rlhfkit.rollout import HFEngine

    mode, _, prec = variant.partition(":")
    if not prec:
        return HFEngine(model, tok.pad_token_id, tok.eos_token_id, share_prompt=share_prompt, decode=mode)
    from rlhfkit.rollout.quantized import QuantizedEngine
    from rlhfkit.rollout.weight_sync import hf_weights

    quantized = QuantizedEngine(model, prec, tok.pad_token_id, tok.eos_token_id, share_prompt=share_prompt, decode=mode)
    quantized.sync_weights(hf_weights(model), version=0)
    return quantized


def logprob_gap(model, result) -> float:
    """Mean |the log-prob each token was sampled with - ``model``'s (full precision, same sampler
    temperature 1)| over ``result``'s completion tokens."""
    import torch

    from rlhfkit.models.policy import forward_response

    with torch.no_grad():
        ours = forward_response(
            model,
            result.input_ids,
            result.attention_mask,
            result.response_mask.shape[1],
            temperature=1.0,
            prompt_index=result.prompt_index,
        ).logprobs
    mask = result.response_mask.bool()
    return float((ours.float() - result.logprobs.float().to(ours.device)).abs()[mask].mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new-tokens", default="32,256", help="comma-separated completion limits")
    p.add_argument("--variants", default="generate,loop", help="comma-separated decode modes, the first the baseline")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-share-prompt", action="store_true")
    a = p.parse_args()

    import torch

    from rlhfkit.data.encode import tokenize_prompts
    from rlhfkit.rollout import SamplingParams
    from rlhfkit.tasks.arithmetic import make_rows

    torch.set_num_threads(a.threads)
    model, tok = load(a.model, a.device)
    model.eval()
    prompts = tokenize_prompts(make_rows(a.prompts, 0), tok, None)
    variants = a.variants.split(",")
    engines = {v: engine(v, model, tok, share_prompt=not a.no_share_prompt) for v in variants}
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    for limit in (int(t) for t in a.new_tokens.split(",")):
        sampling = SamplingParams(max_new_tokens=limit, temperature=1.0)
        seconds = {v: [] for v in variants}
        gaps = {v: [] for v in variants if precision(v) != precision(variants[0])}
        tokens = steps = 0
        for rep in range(a.reps + 1):  # round 0 is the warm-up (and compiles, where a variant compiles)
            seeds = [1000 * rep + g for g in range(len(prompts))]
            outputs = {}
            for v in list(variants if rep % 2 == 0 else variants[::-1]):  # ABBA: neither goes first every round
                sync()
                start = time.perf_counter()
                try:
                    outputs[v] = engines[v].generate(prompts, a.group_size, sampling, seed=seeds)
                except Exception as e:  # a variant this transformers cannot run: reported, the others go on
                    if v == variants[0]:
                        raise
                    print(json.dumps({"error": f"{v}: {type(e).__name__}: {e}"[:2000]}), flush=True)
                    variants.remove(v)
                    del seconds[v]
                    continue
                sync()
                elapsed = time.perf_counter() - start
                print(f"decode: {limit} tokens, round {rep}, {v}: {elapsed:.2f} s", file=sys.stderr, flush=True)
                if rep:
                    seconds[v].append(elapsed)
            base = outputs[variants[0]]
            for v in variants[1:]:
                r = outputs[v]
                if precision(v) != precision(variants[0]):
                    if rep:
                        gaps[v].append(logprob_gap(model, r))
                    continue
                if not torch.equal(r.response_ids * r.response_mask, base.response_ids * base.response_mask):
                    print(json.dumps({"warning": f"{v} sampled other tokens than {variants[0]}", "rep": rep}))
            if rep:
                tokens += int(base.response_mask.sum())  # the baseline's (another variant may differ by rounding)
                steps += base.response_mask.shape[1]
        reps = max(a.reps, 1)
        mean = {v: sum(s) / max(len(s), 1) for v, s in seconds.items()}
        speed = {v: tokens / max(sum(s), 1e-9) for v, s in seconds.items()}
        print(
            json.dumps(
                {
                    "model": a.model,
                    "device": a.device,
                    "rows": len(prompts) * a.group_size,
                    "max_new_tokens": limit,
                    "mean_completion_tokens": tokens / reps / (len(prompts) * a.group_size),
                    "mean_decode_steps": steps / reps,
                    "tokens_per_s": speed,
                    "s_per_call": mean,
                    "speedup": {v: speed[v] / speed[variants[0]] for v in variants},
                    "runs_s": seconds,
                    "logprob_gap": {v: sum(g) / max(len(g), 1) for v, g in gaps.items() if v in variants},
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
