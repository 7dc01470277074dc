"""TRL's GRPO step on the work ``benchmarks/rl_step.py`` times, for a ratio measured on one machine.

    pip install trl==1.16.0            # in an environment of its own (it is not an rlhfkit dependency)
    python benchmarks/trl_grpo_step.py --prompts 4 --group-size 4 --new-tokens 32 [--bf16]
    # both ratios in one command: TRL and rlhfkit alternated, float32 and bf16, each run its own process
    .venv/bin/python benchmarks/trl_grpo_step.py --compare --trl-python /tmp/trlenv/bin/python --rounds 2 [--every-row]

``--compare`` runs, ``--rounds`` times, for float32 then bf16: this script under ``--trl-python``
(TRL), then ``benchmarks/rl_step.py --kl-coef 0 --no-floor --json`` under this interpreter
(rlhfkit; bf16 = ``--autocast bfloat16``, as TRL's ``bf16=True`` autocasts float32 weights), and
prints each run, the load average before and after, and per dtype the medians and the ratios
rlhfkit / TRL of step time and peak RSS. ``--every-row`` adds a third run per round, rlhfkit with
``--no-skip-zero-gradient-rows``: its update runs every row as TRL's does, also the rows whose
zero advantage gives them no gradient (``skip_zero_gradient_rows``, on by default, leaves them out:
the same weights, less compute; how much depends on the batch, so both ratios are printed).
``--variant NAME=ARGS`` (repeatable) adds one more rlhfkit run per round: every row, plus ARGS for
``rl_step.py`` (``--variant "bf16-rollout=--rollout-precision bfloat16"``: sampling from a bfloat16
copy, ``rollout_precision``).

SmolLM2-135M-Instruct (the same GGUF-converted Hugging Face directory rlhfkit uses), float32, the
same arithmetic prompts and rewards, ``beta=0`` (no reference, as ``rl_step.py --kl-coef 0``), one
generation and one optimizer step per step, HF ``generate`` (TRL's vLLM modes need a GPU). The step
time is the mean wall time of ``--steps`` training steps after ``--warmup``, from TRL's own callback
hooks. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--model",
        default=None,
        help="a Hugging Face directory (default: SmolLM2-135M-Instruct's GGUF, "
        "converted; --compare resolves it here and passes the directory to TRL's interpreter)",
    )
    p.add_argument("--bf16", action="store_true", help="TRL's bf16=True (autocast; its default)")
    p.add_argument("--compare", action="store_true", help="TRL and rlhfkit alternated; prints both ratios")
    p.add_argument("--trl-python", default="/tmp/trlenv/bin/python", help="with --compare: an interpreter with trl")
    p.add_argument("--rounds", type=int, default=2, help="with --compare: runs of each framework per dtype")
    p.add_argument("--dtypes", default="float32,bf16", help="with --compare")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="with --compare: OMP/MKL threads of every run (1: no thread waits on a descheduled sibling "
        "when other work shares the cores)",
    )
    p.add_argument("--rlhfkit-args", default="", help="with --compare: extra rl_step.py arguments (a lever)")
    p.add_argument(
        "--every-row",
        action="store_true",
        help="with --compare: also run rlhfkit with --no-skip-zero-gradient-rows (the update over every row)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="with --compare: one more rlhfkit run per round, rl_step.py with ARGS added to every-row's "
        "(e.g. bf16-rollout='--rollout-precision bfloat16'); repeatable",
    )
    a = p.parse_args()
    if a.compare:
        return compare(a)

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhfkit.models.sources import resolve_model_dir, smollm2_gguf
    from rlhfkit.rewards import get_reward_function
    from rlhfkit.tasks.arithmetic import make_rows

    model_dir = a.model or str(resolve_model_dir(smollm2_gguf()))
    rows = make_rows(256, 0)
    data = Dataset.from_list(rows)  # prompt: chat messages, answer: the number
    rewards = [get_reward_function(name) for name in ("math_answer", "answer_format")]
    for fn, name in zip(rewards, ("math_answer", "answer_format")):
        fn.__name__ = name

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.start)

    timer = Timer()
    batch = a.prompts * a.group_size
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=batch,
        num_generations=a.group_size,
        max_completion_length=a.new_tokens,
        learning_rate=1e-6,
        beta=0.0,
        max_steps=a.warmup + a.steps,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=a.bf16,
        save_strategy="no",
        seed=0,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model_dir, reward_funcs=rewards, args=config, train_dataset=data, callbacks=[timer])
    torch.manual_seed(0)
    trainer.train()
    steps = timer.times[a.warmup :]
    print(
        json.dumps(
            {
                "framework": "trl",
                "batch": f"{a.prompts}x{a.group_size}x{a.new_tokens}",
                "bf16": a.bf16,
                "step_s": sum(steps) / len(steps),
                "steps": steps,
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            }
        ),
        flush=True,
    )


def compare(a) -> None:
    from rlhfkit.models.sources import resolve_model_dir, smollm2_gguf

    here = Path(__file__).resolve().parent
    model_dir = a.model or str(resolve_model_dir(smollm2_gguf()))
    work = [
        "--model",
        model_dir,
        "--prompts",
        str(a.prompts),
        "--group-size",
        str(a.group_size),
        "--new-tokens",
        str(a.new_tokens),
        "--warmup",
        str(a.warmup),
        "--steps",
        str(a.steps),
    ]
    print(f"load before: {os.getloadavg()}", flush=True)
    env = dict(
        os.environ, **({"OMP_NUM_THREADS": str(a.threads), "MKL_NUM_THREADS": str(a.threads)} if a.threads else {})
    )
    results: dict = {}
    for dtype in a.dtypes.split(","):
        bf16 = dtype == "bf16"
        runs = {
            "trl": [a.trl_python, str(here / "trl_grpo_step.py"), *work, *(["--bf16"] if bf16 else [])],
            "rlhfkit": [
                sys.executable,
                str(here / "rl_step.py"),
                *work,
                "--kl-coef",
                "0",
                "--no-floor",
                "--json",
                *(["--autocast", "bfloat16"] if bf16 else []),
                *a.rlhfkit_args.split(),
            ],
        }
        if a.every_row:  # rlhfkit running the update over every row, as TRL does (no zero-gradient row left out)
            runs["rlhfkit-every-row"] = [*runs["rlhfkit"], "--no-skip-zero-gradient-rows"]
        for variant in a.variant:  # every row, as TRL, plus the variant's own arguments
            name, _, args = variant.partition("=")
            runs[name] = [*runs["rlhfkit"], "--no-skip-zero-gradient-rows", *args.split()]
        for r in range(a.rounds):
            for name, cmd in runs.items():
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if out.returncode:
                    sys.exit(f"{name} {dtype} failed:\n{out.stderr[-3000:]}")
                row = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault((dtype, name), []).append(row)
                extra = {
                    k: round(v, 3) for k, v in row.items() if k.endswith(("_efficiency", "zero_gradient_rows_frac"))
                }
                print(
                    f"{dtype:8} round {r} {name:17} step {row['step_s']:.2f} s  peak RSS {row['peak_rss_gb']:.2f} GB"
                    f"  load {os.getloadavg()[0]:.2f} {extra or ''}",
                    flush=True,
                )
    print(f"load after: {os.getloadavg()}", flush=True)
    for dtype in a.dtypes.split(","):
        names = [n for (d, n) in results if d == dtype]
        med = {
            n: (
                statistics.median(r["step_s"] for r in results[(dtype, n)]),
                statistics.median(r["peak_rss_gb"] for r in results[(dtype, n)]),
            )
            for n in names
        }
        for n in names[1:]:
            print(
                f"{dtype}: {n} {med[n][0]:.2f} s / TRL {med['trl'][0]:.2f} s = "
                f"{med[n][0] / med['trl'][0]:.2f}x time (goal <= 0.25);  peak RSS {med[n][1]:.2f} / "
                f"{med['trl'][1]:.2f} GB = {med[n][1] / med['trl'][1]:.2f}x (goal <= 0.6)",
                flush=True,
            )


if __name__ == "__main__":
    main()
