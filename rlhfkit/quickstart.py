"""The quickstart: SFT → reward model → PPO on the embedded shift task, on a laptop CPU, with
GRPO and DPO beside PPO, and the PPO policy distilled on-policy into a smaller student.

A hidden oracle plays the human (``tasks/shift.py``): it writes noisy demonstrations for SFT and
labels pairs of SFT samples for the reward model; PPO then optimises the *learned* reward with a KL
leash to the SFT model, and the before/after table reports the *oracle's* score too, so reward
hacking of the learned reward would show. DPO, the RL-free alternative, trains the SFT model
directly on the very pairs the reward model learns from, with the SFT model as its reference. Last, a
student half the width of the policy, fine-tuned on the same demonstrations ("SFT-S"), learns from the PPO
policy as its teacher by on-policy distillation (``algorithm: distill``: no reward model, no reward), its rows
"SFT-S" and "Distill".
"""

from __future__ import annotations

import random
import time
from typing import Any

from .config import RLConfig
from .rl.evaluate import evaluate_policy
from .rollout import HFEngine, SamplingParams, decode_completions
from .tasks import shift
from .tasks.tiny import char_tokenizer, tiny_causal_lm

SAMPLING = SamplingParams(max_new_tokens=10, temperature=1.0)
# DPO on this task (tuned like the RL stages' settings; see README, "DPO").
DPO_SETTINGS: dict[str, Any] = dict(beta=0.1, learning_rate=1e-3, batch_size=32, lr_scheduler="cosine")
DPO_STEPS = 300
# On-policy distillation into the smaller student (docs/guides/distillation.md), tuned on this task.
STUDENT: dict[str, Any] = dict(hidden_size=32, layers=2, heads=2)
DISTILL_SETTINGS: dict[str, Any] = dict(algorithm="distill", learning_rate=3e-4, prompts_per_step=32)
DISTILL_STEPS = 200


def _stage(name: str, quiet: bool):
    if not quiet:
        print(f"\n== {name} ==", flush=True)
    return time.perf_counter()


def sample_pairs(model_dir: str, prompts: list[str], seed: int) -> list[dict]:
    """Two samples per prompt from the SFT model, labelled by the oracle."""
    import torch

    from .models import load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(model_dir), load_causal_lm(model_dir)
    torch.manual_seed(seed)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    a, b = [], []
    for start in range(0, len(prompts), 128):
        chunk = prompts[start : start + 128]
        rollout = engine.generate([tok(p, add_special_tokens=False)["input_ids"] for p in chunk], 2, SAMPLING)
        texts = decode_completions(rollout, tok)
        a += texts[0::2]
        b += texts[1::2]
    return shift.label_pairs(prompts, a, b)


def run_quickstart(
    output_dir: str,
    scale: float = 1.0,
    compare_grpo: bool = False,
    quiet: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    compare_dpo: bool = False,
    distill: bool = False,
) -> dict:
    """Run the three stages (and GRPO / DPO beside PPO, the distilled student) into ``output_dir``; returns the
    before/after metrics and wall time."""
    from .run.directory import prepare_run_dir
    from .trainers.dpo import DPOConfig, DPOTrainer
    from .trainers.reward_model import RewardModelConfig, RewardModelTrainer
    from .trainers.rl import RLTrainer
    from .trainers.sft import SFTConfig, SFTTrainer

    root = prepare_run_dir(output_dir, overwrite)
    if root is None:
        raise ValueError("quickstart needs an output_dir")
    steps = lambda n: max(2, int(n * scale))  # noqa: E731
    t0 = time.perf_counter()
    log: dict[str, Any] = dict(log_every=0 if quiet else 10, progress_bar=not quiet, overwrite=overwrite)

    _stage("1/3 SFT on noisy demonstrations", quiet)
    tok = char_tokenizer(alphabet=shift.LETTERS + "=")
    sft_rows = shift.make_sft_rows(2000, seed)
    SFTTrainer(
        tiny_causal_lm(tok, hidden_size=64, layers=2, seed=seed),
        SFTConfig(
            learning_rate=3e-3, max_steps=steps(600), batch_size=32, output_dir=str(root / "sft"), seed=seed, **log
        ),
        train_dataset=sft_rows,
        processing_class=tok,
    ).train()
    sft_dir = str(root / "sft" / "final")

    _stage("2/3 reward model on oracle-labelled pairs of SFT samples", quiet)
    pairs = sample_pairs(sft_dir, shift.make_prompts(steps(4000), seed + 1), seed)
    held_out = len(pairs) // 10
    train_pairs = pairs[held_out:] + shift.make_synthetic_pairs(steps(8000), seed)
    random.Random(seed).shuffle(train_pairs)
    RewardModelTrainer(
        sft_dir,
        RewardModelConfig(
            learning_rate=1e-3, max_steps=steps(1000), batch_size=64, output_dir=str(root / "rm"), seed=seed, **log
        ),
        train_dataset=train_pairs,
        eval_dataset=pairs[:held_out],
        center_dataset=sft_rows[:500],
    ).train()
    rm_dir = str(root / "rm" / "final")

    eval_prompts = [{"prompt": p} for p in shift.make_prompts(128, seed + 2)]
    results = {
        "SFT": evaluate_policy(
            sft_dir, [shift.oracle_reward, rm_dir], eval_prompts, reference=sft_dir, sampling=SAMPLING
        )
    }
    rl_prompts = [{"prompt": p} for p in shift.make_prompts(2000, seed + 3)]
    algorithms = ["ppo", "grpo"] if compare_grpo else ["ppo"]
    for algorithm in algorithms:
        _stage(f"3/3 {algorithm.upper()} against the learned reward, KL to the SFT model", quiet)
        # PPO: 32 prompts x 1 sample, lr 1e-4; GRPO: 8 prompts x 4 samples, lr 3e-4 (tuned on this task).
        args = RLConfig(
            algorithm=algorithm,
            learning_rate=1e-4 if algorithm == "ppo" else 3e-4,
            kl_coef=0.05,
            max_steps=steps(300),
            prompts_per_step=32 if algorithm == "ppo" else 8,
            max_new_tokens=SAMPLING.max_new_tokens,
            critic_init=rm_dir if algorithm == "ppo" else None,
            missing_eos_penalty=-1.0,
            output_dir=str(root / algorithm),
            seed=seed,
            **log,
        )
        RLTrainer(sft_dir, [rm_dir], args, train_dataset=rl_prompts).train()
        results[algorithm.upper()] = evaluate_policy(
            str(root / algorithm / "final"),
            [shift.oracle_reward, rm_dir],
            eval_prompts,
            reference=sft_dir,
            sampling=SAMPLING,
        )
    if compare_dpo:
        _stage("DPO on the reward model's pairs, reference = the SFT model (no reward model, no sampling)", quiet)
        DPOTrainer(
            sft_dir,
            DPOConfig(**DPO_SETTINGS, max_steps=steps(DPO_STEPS), output_dir=str(root / "dpo"), seed=seed, **log),
            train_dataset=train_pairs,
        ).train()
        results["DPO"] = evaluate_policy(
            str(root / "dpo" / "final"),
            [shift.oracle_reward, rm_dir],
            eval_prompts,
            reference=sft_dir,
            sampling=SAMPLING,
        )
    if distill:
        _stage("the PPO policy distilled on-policy into a student half its width (teacher = the PPO policy)", quiet)
        SFTTrainer(
            tiny_causal_lm(tok, **STUDENT, seed=seed),
            SFTConfig(
                learning_rate=3e-3,
                max_steps=steps(600),
                batch_size=32,
                output_dir=str(root / "student-sft"),
                seed=seed,
                **log,
            ),
            train_dataset=sft_rows,
            processing_class=tok,
        ).train()
        args = RLConfig(
            **DISTILL_SETTINGS,
            teacher_model=str(root / "ppo" / "final"),
            max_steps=steps(DISTILL_STEPS),
            max_new_tokens=SAMPLING.max_new_tokens,
            output_dir=str(root / "distill"),
            seed=seed,
            **log,
        )
        RLTrainer(str(root / "student-sft" / "final"), None, args, train_dataset=rl_prompts).train()
        for name, run in (("SFT-S", "student-sft"), ("Distill", "distill")):
            results[name] = evaluate_policy(
                str(root / run / "final"),
                [shift.oracle_reward, rm_dir],
                eval_prompts,
                reference=sft_dir,
                sampling=SAMPLING,
            )
    wall = time.perf_counter() - t0
    print_table(results, wall)
    return {"results": {k: v["metrics"] for k, v in results.items()}, "wall_s": wall}


def print_table(results: dict, wall: float) -> None:
    print(f"\n{'policy':<8} {'oracle score':>12} {'RM score':>9} {'KL to SFT':>10} {'length':>7}")
    for name, r in results.items():
        m = r["metrics"]
        print(
            f"{name:<8} {m['eval/oracle_reward_mean']:>12.3f} {m['eval/rm_mean']:>9.3f} "
            f"{m.get('eval/kl_to_reference', 0.0):>10.3f} {m['eval/response_length_mean']:>7.2f}"
        )
    print("\nsample completions (prompt -> completion | ideal):")
    for name, r in results.items():
        shown = ", ".join(f"{s['prompt']}{s['completion']}|{shift.target(s['prompt'])}" for s in r["samples"][:4])
        print(f"  {name:<6} {shown}")
    print(f"\nwall time: {wall:.0f} s")
