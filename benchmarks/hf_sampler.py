"""The HF engine's seeded per-row sampler against transformers' own sampler, per decode step.

    .venv/bin/python benchmarks/hf_sampler.py [--prompts 4 --group-size 8 --new-tokens 16 --reps 5]

SmolLM2-135M-Instruct under bf16 autocast, the arithmetic prompts, temperature 1, no top-k/top-p,
the prompt encoded once per row in both (``share_prompt=False``). Alternating, ``--reps`` times after
one warm-up call each: (a) ``model.generate(do_sample=True)`` — transformers' sampler, one
``torch.multinomial`` over the batch on torch's global stream —; (b) ``HFEngine.generate`` with one
seed per prompt — ``rollout.token_sampler.TokenSampler``: a CPU ``torch.Generator`` per row, inverse-CDF draws.
A call runs until every row has ended or the token limit, so the time is divided by the decode steps
the call ran. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()

    import torch

    from rlhfkit.data.encode import tokenize_prompts
    from rlhfkit.data.padding import pad
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.models.sources import resolve_model_dir, smollm2_gguf
    from rlhfkit.rollout import HFEngine, SamplingParams
    from rlhfkit.tasks.arithmetic import make_rows

    torch.set_num_threads(a.threads)
    model_dir = str(resolve_model_dir(smollm2_gguf()))
    tok = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, "float32").eval()
    prompts = tokenize_prompts(make_rows(a.prompts, 0), tok, None)
    n = a.group_size
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, share_prompt=False)
    sampling = SamplingParams(max_new_tokens=a.new_tokens, temperature=1.0)
    ids, mask = pad(prompts, tok.pad_token_id, "left")
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)

    def transformers_sampler(rep: int) -> int:
        torch.manual_seed(rep)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=a.new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        return out.shape[1] - ids.shape[1]

    def seeded_sampler(rep: int) -> int:
        return engine.generate(
            prompts, n, sampling, seed=[1000 * rep + g for g in range(len(prompts))]
        ).response_ids.shape[1]

    per_step = {"transformers": [], "rlhfkit_seeded": []}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for rep in range(a.reps + 1):
            for name, call in (("transformers", transformers_sampler), ("rlhfkit_seeded", seeded_sampler)):
                start = time.perf_counter()
                steps = call(rep)
                if rep:  # the first call of each is a warm-up
                    per_step[name].append((time.perf_counter() - start) / steps)
    mean = {k: sum(v) / len(v) for k, v in per_step.items()}
    print(
        json.dumps(
            {
                "batch": f"{a.prompts}x{n}x{a.new_tokens}",
                "s_per_decode_step": mean,
                "seeded_over_transformers": mean["rlhfkit_seeded"] / mean["transformers"],
                "runs": per_step,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
