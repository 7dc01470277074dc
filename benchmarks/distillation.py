"""On-policy distillation against RL on a real model (issue 52, item 4; docs/results/distillation.md):
SmolLM2-135M-Instruct on the arithmetic task, the teacher the GRPO recipe's trained checkpoint, the
student the base model. Held-out greedy strict accuracy against steps and training seconds for

- ``distill``: on-policy distillation from the teacher alone (``recipes/smollm2-arithmetic-distill.yaml``:
  token mode, 8 prompts x 1 completion a step);
- ``grpo_teacher``: the GRPO recipe (4 prompts x 8, the verifiable rewards) plus the teacher
  (``teacher_model``, ``distillation_coef``: the rewards' advantages plus the teacher's per-token term);
- ``grpo``: the GRPO recipe alone (``recipes/smollm2-arithmetic-grpo.yaml``), evaluated every
  ``--eval-every`` steps.

Each run is ``rlhfkit rl --config <recipe> key=value ...`` in a child process, one after another (no two
share the CPU), into ``OUT/<kind>-s<seed>`` (a run whose ``final/`` exists is not run again); then one
table of them all:

    export OMP_NUM_THREADS=1   # on a shared CPU: two threads beside another busy process ran 5-20x slower
    python benchmarks/distillation.py --teacher runs/smollm2-arithmetic-grpo/final --kinds distill,grpo_teacher \
        --seeds 0,1 --out runs/distillation
    python benchmarks/distillation.py --table runs/smollm2-arithmetic-grpo runs/distillation/*-s*   # finished runs

``--table`` reads any run directories (``metrics.jsonl``, ``config.yaml``, ``run.json``), the GRPO recipe's
own run among them, and names each by its config: ``distill``, ``grpo_teacher`` (a preset other than
distill with a teacher) or the preset's name. Columns: the seed, the completions a step (prompts x group),
``eval/strict_math_answer_mean`` at each evaluated step up to ``--max-step`` with, in brackets, the
training seconds to that step (the sum of the run's ``perf/time_*`` over its steps: generation,
scoring, the teacher's pass, the update; evaluation and loading excluded) and, where the run's stdout is
beside it as ``<run_dir>.log``, the wall seconds its progress line printed at that step (since the
trainer's metrics logger started: evaluations included), and the run's wall seconds (``run.json``: the
process's whole run, loading included; "not ended" for a run still running or interrupted). With
``--teacher-accuracy A`` it also gives, per run, the first evaluated step at or above 90 % of A; with
``--window N`` a second table: the sampled training completions' strict accuracy
(``reward/strict_math_answer_mean``) by windows of N steps.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {
    "distill": ROOT / "recipes" / "smollm2-arithmetic-distill.yaml",
    "grpo_teacher": ROOT / "recipes" / "smollm2-arithmetic-grpo.yaml",
    "grpo": ROOT / "recipes" / "smollm2-arithmetic-grpo.yaml",
}
METRIC = "eval/strict_math_answer_mean"
TRAIN_METRIC = "reward/strict_math_answer_mean"


def overrides(kind: str, seed: int, out: Path, args) -> list[str]:
    """The ``key=value`` overrides of one run on its recipe."""
    common = [f"seed={seed}", f"output_dir={out}", f"eval_every={args.eval_every}", "save_steps=0"]
    if kind == "grpo":
        return [*common, f"max_steps={args.grpo_steps}"]
    teacher = [f"teacher_model={args.teacher}", f"max_steps={args.steps}"]
    if kind == "grpo_teacher":
        teacher.append(f"distillation_coef={args.distillation_coef}")
    return [*common, *teacher]


def run(kind: str, seed: int, args) -> Path:
    out = Path(args.out) / f"{kind}-s{seed}"
    if (out / "final").exists():
        print(f"{out}: done before, not run again", flush=True)
        return out
    command = [*shlex.split(args.command), "rl", "--config", str(RECIPES[kind]), *overrides(kind, seed, out, args)]
    out.parent.mkdir(parents=True, exist_ok=True)
    print(" ".join(command), flush=True)
    start = time.perf_counter()
    with open(f"{out}.log", "w") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    print(f"{out}: exit {code}, {time.perf_counter() - start:.0f} s", flush=True)
    if code:
        sys.exit(f"{kind} seed {seed} failed: see {out}.log")
    return out


def read_config(run_dir: Path) -> dict:
    """``config.yaml``'s top-level ``key: value`` lines (values as YAML reads them)."""
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text()) or {}


def kind_of(config: dict) -> str:
    algorithm = config.get("algorithm", "grpo")
    if algorithm != "distill" and config.get("teacher_model"):
        return f"{algorithm}_teacher"
    return algorithm


def curve(run_dir: Path) -> list[tuple[int, float, float]]:
    """``(step, held-out strict accuracy, training seconds to that step)`` at every evaluated step of the
    run's ``metrics.jsonl`` (rows of one step merged; the training seconds sum ``perf/time_*`` over the
    steps up to it)."""
    rows: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows.setdefault(int(row["step"]), {}).update(row)
    seconds, elapsed, out = 0.0, {}, []
    for step in sorted(rows):
        seconds += sum(v for k, v in rows[step].items() if k.startswith("perf/time_"))
        elapsed[step] = seconds
        if METRIC in rows[step]:
            out.append((step, rows[step][METRIC], elapsed[step]))
    return out


def progress_seconds(log: Path) -> dict[int, float]:
    """Step -> the seconds since the run's start that its progress line (``step N/M ... (Ts, eta ...)``, the
    command's stdout) printed: wall time with evaluations and all; {} without a log."""
    if not log.exists():
        return {}
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        match = re.match(r"step (\d+)/\d+ .*\((\d+)s, eta", line)
        if match:
            out[int(match.group(1))] = float(match.group(2))
    return out


def train_accuracy(run_dir: Path, window: int, max_step: int | None = None) -> list[tuple[int, int, float]]:
    """``(first step, last step, mean)`` of the sampled completions' strict accuracy
    (``reward/strict_math_answer_mean``, logged by every run: weight 0 in distill) over windows of ``window`` steps."""
    rows: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if TRAIN_METRIC in row and (max_step is None or row["step"] <= max_step):
                rows[int(row["step"])] = row[TRAIN_METRIC]
    out = []
    for first in range(1, max(rows, default=0) + 1, window):
        values = [rows[s] for s in range(first, first + window) if s in rows]
        if values:
            out.append((first, first + window - 1, sum(values) / len(values)))
    return out


def wall_seconds(run_dir: Path) -> float | None:
    """The run's wall seconds from ``run.json`` (all sessions); None while it runs."""
    path = run_dir / "run.json"
    if not path.exists():
        return None
    sessions = json.loads(path.read_text()).get("sessions", [])
    durations = [s.get("duration_s") for s in sessions]
    return None if not durations or None in durations else float(sum(durations))


def completions_per_step(config: dict) -> int:
    """prompts x group size; a group size left to the preset (``null`` in config.yaml) is the preset's."""
    group = config.get("group_size")
    if group is None:
        from rlhfkit.config import PRESETS

        group = PRESETS[config.get("algorithm", "grpo")]["group_size"]
    return int(config.get("prompts_per_step", 0)) * int(group)


def summary(run_dir: Path, max_step: int | None = None, teacher_accuracy: float | None = None) -> dict:
    config = read_config(run_dir)
    points = [p for p in curve(run_dir) if max_step is None or p[0] <= max_step]
    progress = progress_seconds(run_dir.with_name(run_dir.name + ".log"))
    result = {
        "run": str(run_dir),
        "kind": kind_of(config),
        "seed": config.get("seed"),
        "completions": completions_per_step(config),
        "curve": points,
        "progress_s": {step: progress[step] for step, _, _ in points if step in progress},
        "wall_s": wall_seconds(run_dir),
    }
    if teacher_accuracy is not None:
        goal = 0.9 * teacher_accuracy
        result["goal_step"] = next((step for step, acc, _ in points if acc >= goal - 1e-9), None)
    return result


def table(
    dirs: list[str], max_step: int | None = None, teacher_accuracy: float | None = None, window: int = 0
) -> list[dict]:
    """One Markdown table of the runs in ``dirs`` (printed), sorted by kind and seed, and with ``window`` a second:
    the sampled completions' strict accuracy by windows of that many steps; returns the summaries."""
    runs = [summary(Path(d), max_step, teacher_accuracy) for d in dirs if (Path(d) / "metrics.jsonl").exists()]
    runs.sort(key=lambda r: (r["kind"], r["seed"] if r["seed"] is not None else -1, r["run"]))
    steps = sorted({step for r in runs for step, _, _ in r["curve"]})
    goal = teacher_accuracy is not None
    head = ["run", "seed", "completions/step", *[f"step {s}" for s in steps], "wall s"]
    if goal:
        head.insert(-1, f"first step ≥ {0.9 * teacher_accuracy:.1%}")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in runs:
        at = {
            step: f"{acc:.1%} ({seconds:.0f} s"
            + (f", {r['progress_s'][step]:.0f} s wall)" if step in r["progress_s"] else ")")
            for step, acc, seconds in r["curve"]
        }
        cells = [r["kind"], str(r["seed"]), str(r["completions"]), *[at.get(s, "") for s in steps]]
        if goal:
            cells.append("—" if r["goal_step"] is None else str(r["goal_step"]))
        cells.append("not ended" if r["wall_s"] is None else f"{r['wall_s']:.0f}")
        print("| " + " | ".join(cells) + " |")
    if window:
        windows = {r["run"]: train_accuracy(Path(r["run"]), window, max_step) for r in runs}
        spans = sorted({(a, b) for w in windows.values() for a, b, _ in w})
        print("\n| run | seed | " + " | ".join(f"steps {a}–{b}" for a, b in spans) + " |")
        print("|" + " --- |" * (2 + len(spans)))
        for r in runs:
            at = {(a, b): f"{m:.1%}" for a, b, m in windows[r["run"]]}
            print(f"| {r['kind']} | {r['seed']} | " + " | ".join(at.get(span, "") for span in spans) + " |")
    return runs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", default="runs/smollm2-arithmetic-grpo/final", help="the teacher's directory")
    parser.add_argument("--kinds", default="distill,grpo_teacher", help=f"of {', '.join(RECIPES)}")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=75, help="steps of distill and grpo_teacher")
    parser.add_argument("--grpo-steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--distillation-coef", type=float, default=1.0, help="grpo_teacher's teacher weight")
    parser.add_argument("--out", default="runs/distillation")
    parser.add_argument("--command", default=f"{shlex.quote(sys.executable)} -m rlhfkit", help="runs rlhfkit")
    parser.add_argument("--table", nargs="+", metavar="RUN_DIR", help="tabulate finished runs; run nothing")
    parser.add_argument("--max-step", type=int, default=None, help="table: evaluated steps up to this one")
    parser.add_argument("--teacher-accuracy", type=float, default=None, help="table: the 90 %% goal's column")
    parser.add_argument("--window", type=int, default=0, help="table: training accuracy by windows of N steps")
    args = parser.parse_args(argv)
    if args.table:
        table(args.table, args.max_step, args.teacher_accuracy, args.window)
        return
    dirs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for kind in args.kinds.split(","):
            if kind not in RECIPES:
                parser.error(f"--kinds: {kind!r} is none of {', '.join(RECIPES)}")
            dirs.append(str(run(kind, seed, args)))
    table(dirs, args.max_step, args.teacher_accuracy, args.window)


if __name__ == "__main__":
    main()
