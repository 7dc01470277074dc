"""The benchmark scripts run (on a tiny model here; the numbers of docs/results/speed.md come from SmolLM2)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rl_step.py"


@pytest.mark.parametrize("extra", [["--algorithm", "grpo"],
                                   pytest.param(["--algorithm", "ppo", "--critic", "shared", "--gradient-checkpointing"],
                                                marks=pytest.mark.slow),
                                   pytest.param(["--no-share-prompt", "--group-size", "2"], marks=pytest.mark.slow)])
def test_rl_step_benchmark_runs(tiny_model_dir, extra):
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", tiny_model_dir, "--warmup", "0", "--steps", "1",
                          "--new-tokens", "4", "--json", *extra], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["step_s"] > 0 and row["floor_s"] > 0 and row["peak_rss_gb"] > 0


@pytest.mark.slow
def test_objectives_benchmark_stops_each_preset_at_the_cpu_budget_and_tabulates(tiny_model_dir, tmp_path):
    script = SCRIPT.with_name("objectives.py")
    out = subprocess.run([sys.executable, str(script), "--model", tiny_model_dir, "--steps", "60", "--cpu-budget", "2",
                          "--algorithms", "grpo,dapo", "--out", str(tmp_path / "obj")], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "obj" / "results.json").read_text())
    assert set(results) == {"grpo-seed0", "dapo-seed0"}
    for r in results.values():  # stopped by the budget, well before the 60-step cap
        assert 2 <= r["train_cpu_s"] and 1 <= r["steps"] < 60, r
        assert len(r["reward_by_quarter"]) >= 1 and r["kl_to_start"] >= -1e-6
    assert "| dapo |" in out.stdout


@pytest.mark.slow
def test_async_rollouts_benchmark_runs_both_ways_and_compares(tiny_model_dir, tmp_path):
    script = SCRIPT.with_name("async_rollouts.py")
    out = subprocess.run([sys.executable, str(script), "--model", tiny_model_dir, "--steps", "3",
                          "--out", str(tmp_path / "async")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "async" / "results.json").read_text())
    assert results["sync"]["steps_per_min"] > 0 and results["async"]["steps_per_min"] > 0
    assert results["async"]["rollout/staleness_mean"] > 0 and "rollout/staleness_mean" not in results["sync"]
    assert results["speedup_steps_per_min"] > 0
