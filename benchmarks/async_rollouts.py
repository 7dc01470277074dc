"""Synchronous vs asynchronous rollouts on the same cores: SmolLM2-135M-Instruct GRPO on the
arithmetic recipe, one process with T threads (generate, then update) against one generator rank +
one trainer rank with T/2 threads each at ``max_staleness`` S (generation of the next batch
overlaps the update). Run one after another, A then B, so they never share the CPU.

    python benchmarks/async_rollouts.py --steps 100          # ~15 min on 2 cores
    python benchmarks/async_rollouts.py --steps 20 --model DIR --threads 2 --staleness 1

Reported per run: wall seconds of the training process, steps per minute over the steps after the
first (the start — loading, the first weights broadcast — is excluded: ``metrics.jsonl`` rows carry
no time, so the rate is taken from the per-step ``perf/time_*`` sums of the trainer, which cover
everything the trainer's step waits on), the training reward by fifth of the run (the curve against
steps; against wall time, divide by the steps per minute), the held-out greedy strict accuracy at
the end, and for the asynchronous run the mean staleness and the mean seconds each side waited
(``perf/trainer_wait_s``: the trainer for a batch; ``perf/generator_wait_s``: the generator for
weights). The JSON lands in ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-arithmetic-grpo.yaml"


def run(command: list[str], log: Path, env: dict) -> float:
    start = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT, env=env)
    if code:
        sys.exit(f"{' '.join(command)} failed ({code}); see {log}")
    return time.perf_counter() - start


def summary(run_dir: Path, fifths: int = 5) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/mean" in r]
    step_s = [sum(v for k, v in r.items() if k.startswith("perf/time_")) for r in train[1:]]
    size = max(1, len(train) // fifths)
    curve = [
        sum(r["reward/mean"] for r in train[i : i + size]) / len(train[i : i + size])
        for i in range(0, len(train), size)
    ]
    evals = [r["eval/strict_math_answer_mean"] for r in rows if "eval/strict_math_answer_mean" in r]
    out = {
        "steps_per_min": round(60 * len(step_s) / max(sum(step_s), 1e-9), 2),
        "reward_by_fifth": [round(c, 3) for c in curve[:fifths]],
        "accuracy_end": evals[-1] if evals else None,
    }
    if "rollout/staleness_mean" in train[0]:
        for key in ("rollout/staleness_mean", "perf/trainer_wait_s", "perf/generator_wait_s"):
            out[key] = round(sum(r[key] for r in train) / len(train), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--threads", type=int, default=2, help="cores in all: the synchronous run's threads")
    p.add_argument("--staleness", type=int, default=1)
    p.add_argument("--model", help="instead of the recipe's SmolLM2 GGUF")
    p.add_argument("--out", default="runs/async-rollouts")
    p.add_argument("--order", default="sync,async", help="which runs, in this order")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    if not (data / "train.jsonl").exists():
        run(
            [
                sys.executable,
                "-m",
                "rlhfkit",
                "data",
                str(data),
                "--task",
                "arithmetic",
                "--train-digits",
                "1,2",
                "--n-train",
                "400",
            ],
            out / "data.log",
            dict(os.environ),
        )
    results = {}
    for kind in a.order.split(","):
        run_dir = out / kind
        overrides = [
            f"max_steps={a.steps}",
            f"eval_every={a.steps}",
            "save_steps=0",
            f"output_dir={run_dir}",
            f"train_dataset={data / 'train.jsonl'}",
            f"eval_dataset={data / 'eval.jsonl'}",
            *([f"model={a.model}"] if a.model else []),
        ]
        threads = a.threads
        if kind == "async":
            overrides += ["rollout_workers=1", f"max_staleness={a.staleness}", "--nproc-per-node", "2"]
            threads = max(1, a.threads // 2)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        wall = run(
            [sys.executable, "-m", "rlhfkit", "rl", "--config", str(RECIPE), *overrides, "--quiet", "--overwrite"],
            out / f"{kind}.log",
            env,
        )
        results[kind] = {"threads_per_process": threads, "wall_s": round(wall, 1), **summary(run_dir)}
        print(json.dumps({kind: results[kind]}), flush=True)
    if "sync" in results and "async" in results:
        results["speedup_steps_per_min"] = round(
            results["async"]["steps_per_min"] / results["sync"]["steps_per_min"], 2
        )
        print(json.dumps({"speedup_steps_per_min": results["speedup_steps_per_min"]}))
    (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
