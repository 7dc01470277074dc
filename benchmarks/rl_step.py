"""Time one RL step phase by phase, against the compute floor of the same work, and peak memory.

    python benchmarks/rl_step.py                          # GRPO, SmolLM2-135M, 4 prompts x 4 x 32 tokens
    python benchmarks/rl_step.py --algorithm ppo --critic shared --lora-r 16
    python benchmarks/rl_step.py --compare ppo,grpo,rloo  # one subprocess each: per-algorithm peak RSS
    python benchmarks/rl_step.py --no-share-prompt        # each completion encodes its prompt itself
    python benchmarks/rl_step.py --engine vllm            # generation by a colocated vLLM engine
    python benchmarks/rl_step.py --compare-engines        # hf and vllm alternated, each in its own process

Per step (after warm-up): generate / reward / logprobs / update seconds from the trainer's own
timers, tokens/s, then — in the same process, on the same sequences — the *floor*: a bare
``model.generate`` of the same number of decode steps for the same rows, plus one bare forward /
backward / AdamW step over the same sequences. ``step / floor`` is the overhead of everything else.
With ``--engine vllm`` the generation floor is a bare ``vllm.LLM.generate`` of the same rows and
decode steps on the run's own engine, and the step includes the weight sync (``time_weight_sync``).
Peak RSS is the process's maximum resident set (``getrusage``), model loading included.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux


def build_trainer(a):
    from rlhfkit.config import RLConfig
    from rlhfkit.jobs import RLJob, lora_config
    from rlhfkit.tasks.arithmetic import make_rows
    from rlhfkit.trainers import RLTrainer

    cfg = RLConfig(
        algorithm=a.algorithm,
        dtype=a.dtype,
        prompts_per_step=a.prompts,
        group_size=a.group_size,
        max_new_tokens=a.new_tokens,
        max_steps=a.warmup + a.steps,
        learning_rate=1e-6,
        log_every=0,
        progress_bar=False,
        seed=0,
        critic=a.critic,
        gradient_checkpointing=a.gradient_checkpointing,
        autocast=a.autocast,
        share_prompt=not a.no_share_prompt,
        rollout_engine=a.engine,
        vllm_kv_cache_gb=a.kv_cache_gb,
        micro_batch_size=a.micro_batch_size,
        skip_zero_gradient_rows=not a.no_skip_zero_gradient_rows,
        hf_decode=a.hf_decode,
        rollout_precision=a.rollout_precision,
        **({"kl_coef": a.kl_coef} if a.kl_coef is not None else {}),
    )
    peft = lora_config(RLJob(lora_r=a.lora_r)) if a.lora_r else None
    return RLTrainer(a.model, ["math_answer", "answer_format"], cfg, train_dataset=make_rows(256, 0), peft_config=peft)


def floor(trainer, rows: int, prompt_ids, new_tokens: int) -> dict:
    """Bare generate of ``new_tokens`` decode steps for the same rows, and one bare training step."""
    from rlhfkit.data.padding import pad

    model = trainer.models.policy
    ids, mask = pad(prompt_ids, trainer.tokenizer.pad_token_id, "left")
    ids, mask = ids.repeat_interleave(rows // len(prompt_ids), 0), mask.repeat_interleave(rows // len(prompt_ids), 0)
    model.eval()
    start = time.perf_counter()
    with torch.no_grad(), trainer.models.autocast():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=trainer.tokenizer.pad_token_id,
        )
    gen = time.perf_counter() - start
    full_mask = torch.ones_like(out)
    full_mask[:, : ids.shape[1]] = mask
    model.train()
    start = time.perf_counter()
    chunk = trainer.args.micro_batch_size or out.shape[0]
    for part in torch.arange(out.shape[0]).split(chunk):  # as the trainer's micro-batches
        with trainer.models.autocast():
            logits = model(input_ids=out[part], attention_mask=full_mask[part]).logits
        logits.float().logsumexp(-1).mean().backward()
        del logits
    trainer.run.optimizer.step()
    trainer.run.optimizer.zero_grad(set_to_none=True)
    update = time.perf_counter() - start
    if trainer.args.rollout_engine == "vllm":  # the engine's own floor: the same rows, no loop around it
        from vllm import SamplingParams

        engine = trainer.sampler.engine
        params = SamplingParams(n=1, temperature=1.0, max_tokens=new_tokens, min_tokens=new_tokens, seed=0)
        start = time.perf_counter()
        engine.llm.generate(
            [{"prompt_token_ids": p} for p in prompt_ids for _ in range(rows // len(prompt_ids))],
            params,
            use_tqdm=False,
        )
        gen = time.perf_counter() - start
    return {"floor_generate": gen, "floor_update": update}


# The efficiency counters (rlhfkit.models.efficiency): token positions computed vs needed, per pass.
PERF_COUNTERS = (
    "perf/tokens_computed_",
    "perf/tokens_needed_",
    "perf/generate_efficiency",
    "perf/logprob_efficiency",
    "perf/update_efficiency",
)


def run_one(a) -> dict:
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    trainer = build_trainer(a)
    history = trainer.train()[a.warmup :]
    mean = lambda key: sum(r.get(key, 0.0) for r in history) / len(history)  # noqa: E731
    phases = {p: mean(f"perf/time_{p}") for p in ("weight_sync", "generate", "reward", "logprobs", "update")}
    step = sum(phases.values())
    result = {
        "engine": a.engine,
        "batch": f"{a.prompts}x{a.group_size}x{a.new_tokens}",
        "algorithm": a.algorithm,
        "dtype": a.dtype,
        "autocast": a.autocast,
        "hf_decode": a.hf_decode,
        "rollout_precision": a.rollout_precision,
        "checkpointing": a.gradient_checkpointing,
        "critic": a.critic if trainer.args.use_critic else "-",
        "lora_r": a.lora_r,
        "share_prompt": not a.no_share_prompt,
        "skip_zero_gradient_rows": not a.no_skip_zero_gradient_rows,
        **{f"time_{k}": v for k, v in phases.items()},
        "step_s": step,
        "tokens_per_s": mean("perf/tokens_per_s"),
        "response_len": mean("rollout/response_length_mean"),
        "zero_gradient_rows_frac": mean("policy/zero_gradient_rows_frac"),
        "peak_rss_gb": peak_rss_gb(),
    }
    result.update({k: mean(k) for k in history[-1] if k.startswith(PERF_COUNTERS)})
    if a.no_floor:
        return result
    T = int(max(r["rollout/response_length_max"] for r in history))
    prompt_ids = [trainer.sampler.prompt_ids[i] for i in range(a.prompts)]
    f = floor(trainer, a.prompts * trainer.args.group_size, prompt_ids, T)
    result.update(f, floor_s=f["floor_generate"] + f["floor_update"])
    result["step_over_floor"] = step / result["floor_s"]
    return result


def main() -> None:
    from rlhfkit.models.sources import smollm2_gguf

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=smollm2_gguf())
    p.add_argument("--algorithm", default="grpo")
    p.add_argument("--compare", help="comma-separated algorithms, each in its own process")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="rollout engine")
    p.add_argument(
        "--compare-engines",
        action="store_true",
        help="hf and vllm alternated (--rounds times), each run in its own process",
    )
    p.add_argument(
        "--micro-batch-size",
        type=int,
        default=None,
        help="rows per forward/backward (large batches: bounds the activations' memory)",
    )
    p.add_argument("--kv-cache-gb", type=float, default=2.0, help="vLLM's KV cache (GiB)")
    p.add_argument("--rounds", type=int, default=1, help="with --compare-engines: hf, vllm, hf, vllm, ...")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--critic", default="shared", help="PPO critic: shared or separate")
    p.add_argument("--kl-coef", type=float, default=None, help="override the preset's KL coefficient")
    p.add_argument("--lora-r", type=int, default=0)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--autocast", default=None, help="bfloat16: mixed-precision matmuls, float32 weights")
    p.add_argument("--hf-decode", default="loop", help="the HF engine's decode mode (hf_decode)")
    p.add_argument("--rollout-precision", default=None, help="sample from a bfloat16 / int8 copy (rollout_precision)")
    p.add_argument(
        "--no-skip-zero-gradient-rows",
        action="store_true",
        help="run the update over every row, also those whose loss has no gradient (a zero advantage)",
    )
    p.add_argument(
        "--no-share-prompt",
        action="store_true",
        help="encode the prompt for every completion (share_prompt=False), to measure what sharing saves",
    )
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the bare floor (its unshared forward/backward would set the peak RSS)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON line (used by --compare)")
    a = p.parse_args()
    if a.compare or a.compare_engines:
        argv = _without(sys.argv[1:], ("--compare", "--rounds"), ("--compare-engines",))
        runs = (
            [["--algorithm", x] for x in a.compare.split(",")]
            if a.compare
            else [["--engine", e] for _ in range(a.rounds) for e in ("hf", "vllm")]
        )
        rows = []
        for extra in runs:
            out = subprocess.run([sys.executable, __file__, *argv, *extra, "--json"], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"benchmark run {' '.join(extra)} failed:\n{out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print_rows(rows[-1:], header=len(rows) == 1)
        return
    result = run_one(a)
    print(json.dumps(result) if a.json else "", flush=True)
    if not a.json:
        print_rows([result])


def _without(argv: list[str], with_value: tuple, flags: tuple) -> list[str]:
    """``argv`` less the named options (``--x v``, ``--x=v``) and flags."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in with_value:
            skip = True
        elif x not in flags and not any(x.startswith(f"{o}=") for o in with_value):
            out.append(x)
    return out


def print_rows(rows: list[dict], header: bool = True) -> None:
    cols = [
        "engine",
        "batch",
        "algorithm",
        "critic",
        "lora_r",
        "time_weight_sync",
        "time_generate",
        "time_reward",
        "time_logprobs",
        "time_update",
        "step_s",
        "floor_generate",
        "floor_update",
        "step_over_floor",
        "tokens_per_s",
        "peak_rss_gb",
    ]
    if header:
        print(" ".join(f"{c:>15}" for c in cols))
    for r in rows:
        print(
            " ".join(f"{r[c]:>15.3f}" if isinstance(r.get(c), float) else f"{str(r.get(c, '-')):>15}" for c in cols),
            flush=True,
        )
        perf = {k.removeprefix("perf/"): round(v, 4) for k, v in r.items() if k.startswith(PERF_COUNTERS)}
        if perf:
            print("  efficiency:", " ".join(f"{k}={v:g}" for k, v in sorted(perf.items())), flush=True)


if __name__ == "__main__":
    main()
