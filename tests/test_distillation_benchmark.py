"""benchmarks/distillation.py (docs/results/distillation.md): the runs' overrides and the table it reads from
finished run directories (written here by hand: no training)."""

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "distillation.py"


def load():
    spec = importlib.util.spec_from_file_location("distillation_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_run(path: Path, config: str, rows: list[dict], durations=(120.0,)) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(config)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "run.json").write_text(json.dumps({"sessions": [{"duration_s": d} for d in durations]}))
    return path


def rows(accuracy: dict[int, float], steps: int, seconds: float) -> list[dict]:
    """An eval row at step 0, then per step a training row (two timings) and, where evaluated, an eval
    row of the same step (merged)."""
    out = [{"step": 0, "eval/strict_math_answer_mean": accuracy[0]}]
    for step in range(1, steps + 1):
        out.append(
            {"step": step, "reward/mean": 0.1, "perf/time_generate": seconds / 2, "perf/time_update": seconds / 2}
        )
        if step in accuracy:
            out.append({"step": step, "eval/strict_math_answer_mean": accuracy[step], "eval/score_mean": 0.0})
    return out


def test_the_curve_merges_rows_of_a_step_and_sums_the_step_seconds(tmp_path):
    run = fake_run(tmp_path / "d", "algorithm: distill\nseed: 1\nprompts_per_step: 32\ngroup_size: null\n", [])
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows({0: 0.0, 2: 0.5, 4: 0.75}, 4, 3.0)) + "\n"
    )
    bench = load()
    assert bench.curve(run) == [(0, 0.0, 0.0), (2, 0.5, 6.0), (4, 0.75, 12.0)]
    s = bench.summary(run, max_step=2, teacher_accuracy=0.55)
    assert s["kind"] == "distill" and s["seed"] == 1 and s["completions"] == 32  # group_size null: the preset's 1
    assert s["curve"] == [(0, 0.0, 0.0), (2, 0.5, 6.0)] and s["goal_step"] == 2  # 0.5 >= 0.9 x 0.55
    assert bench.summary(run, teacher_accuracy=0.8)["goal_step"] == 4  # 0.5 < 0.72 <= 0.75
    assert bench.summary(run, teacher_accuracy=0.9)["goal_step"] is None  # 0.75 < 0.81
    assert s["wall_s"] == 120.0


def test_the_table_names_each_run_by_its_config_and_marks_the_goal(tmp_path, capsys):
    grpo = fake_run(
        tmp_path / "grpo",
        "algorithm: grpo\nseed: 0\nprompts_per_step: 4\ngroup_size: 8\nteacher_model: null\n",
        rows({0: 0.0, 2: 0.25, 4: 0.5}, 4, 5.0),
        durations=(100.0, 50.0),  # resumed: two sessions
    )
    mixed = fake_run(
        tmp_path / "mixed",
        "algorithm: grpo\nseed: 0\nprompts_per_step: 4\ngroup_size: 8\nteacher_model: T\n",
        rows({0: 0.0, 2: 0.625}, 2, 6.0),
        durations=(None,),  # still running
    )
    distill = fake_run(
        tmp_path / "distill", "algorithm: distill\nseed: 0\nprompts_per_step: 32\n", rows({0: 0.0, 2: 0.5}, 2, 2.0)
    )
    (tmp_path / "mixed.log").write_text(
        "loading\nstep 0/2 score_mean=0.000 (99s, eta 29756s)\nstep 2/2 mean=1 (130s, eta 0s)\n"
    )
    runs = load().table([str(grpo), str(mixed), str(distill), str(tmp_path / "missing")], teacher_accuracy=0.625)
    lines = capsys.readouterr().out.splitlines()
    assert [r["kind"] for r in runs] == ["distill", "grpo", "grpo_teacher"]
    assert lines[0] == "| run | seed | completions/step | step 0 | step 2 | step 4 | first step ≥ 56.2% | wall s |"
    assert lines[2] == "| distill | 0 | 32 | 0.0% (0 s) | 50.0% (4 s) |  | — | 120 |"
    assert lines[3] == "| grpo | 0 | 32 | 0.0% (0 s) | 25.0% (10 s) | 50.0% (20 s) | — | 150 |"
    assert lines[4] == "| grpo_teacher | 0 | 32 | 0.0% (0 s, 99 s wall) | 62.5% (12 s, 130 s wall) |  | 2 | not ended |"


def test_each_kind_runs_its_recipe_with_the_teacher_where_it_has_one(tmp_path):
    bench = load()
    args = SimpleNamespace(eval_every=25, steps=75, grpo_steps=300, teacher="T", distillation_coef=1.0)
    common = ["seed=1", f"output_dir={tmp_path}", "eval_every=25", "save_steps=0"]
    assert bench.overrides("distill", 1, tmp_path, args) == [*common, "teacher_model=T", "max_steps=75"]
    assert bench.overrides("grpo_teacher", 1, tmp_path, args) == [
        *common,
        "teacher_model=T",
        "max_steps=75",
        "distillation_coef=1.0",
    ]
    assert bench.overrides("grpo", 1, tmp_path, args) == [*common, "max_steps=300"]
    assert bench.RECIPES["distill"].exists() and bench.RECIPES["grpo"].exists()


def test_the_training_accuracy_by_window(tmp_path, capsys):
    bench = load()
    metrics = [{"step": 0, "eval/strict_math_answer_mean": 0.0}]
    metrics += [{"step": s, "reward/strict_math_answer_mean": s / 10} for s in range(1, 6)]
    run = fake_run(tmp_path / "d", "algorithm: distill\nseed: 0\nprompts_per_step: 8\n", metrics)
    assert bench.train_accuracy(run, 2) == [(1, 2, 0.15000000000000002), (3, 4, 0.35), (5, 6, 0.5)]
    assert bench.train_accuracy(run, 2, max_step=3) == [(1, 2, 0.15000000000000002), (3, 4, 0.3)]
    bench.table([str(run)], window=4)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3:] == [
        "| run | seed | steps 1–4 | steps 5–8 |",
        "| --- | --- | --- | --- |",
        "| distill | 0 | 25.0% | 50.0% |",
    ]
