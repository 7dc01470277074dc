"""The benchmark scripts run (on a tiny model here; the numbers of docs/results/speed.md come from SmolLM2)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rl_step.py"


@pytest.mark.parametrize(
    "extra",
    [
        ["--algorithm", "grpo"],
        pytest.param(["--algorithm", "ppo", "--critic", "shared", "--gradient-checkpointing"], marks=pytest.mark.slow),
        pytest.param(["--no-share-prompt", "--group-size", "2"], marks=pytest.mark.slow),
    ],
)
def test_rl_step_benchmark_runs(tiny_model_dir, extra):
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--model",
            tiny_model_dir,
            "--warmup",
            "0",
            "--steps",
            "1",
            "--new-tokens",
            "4",
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["step_s"] > 0 and row["floor_s"] > 0 and row["peak_rss_gb"] > 0
    assert 0 < row["perf/generate_efficiency"] <= 1 and 0 < row["perf/update_efficiency"] <= 1  # the counters


@pytest.mark.slow
def test_objectives_benchmark_stops_each_preset_at_the_cpu_budget_and_tabulates(tiny_model_dir, tmp_path):
    script = SCRIPT.with_name("objectives.py")
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            "--model",
            tiny_model_dir,
            "--steps",
            "60",
            "--cpu-budget",
            "2",
            "--algorithms",
            "grpo,dapo",
            "--out",
            str(tmp_path / "obj"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    out = subprocess.run(
        [sys.executable, str(script), "--model", tiny_model_dir, "--steps", "3", "--out", str(tmp_path / "async")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "async" / "results.json").read_text())
    assert results["sync"]["steps_per_min"] > 0 and results["async"]["steps_per_min"] > 0
    assert results["async"]["rollout/staleness_mean"] > 0 and "rollout/staleness_mean" not in results["sync"]
    assert results["speedup_steps_per_min"] > 0


GPU_CHECK = SCRIPT.with_name("gpu_check.py")


@pytest.mark.slow  # ~14 s of a 2-core CI worker: make test-slow (CI runs it)
def test_gpu_check_runs_every_check_on_the_cpu():
    """``benchmarks/gpu_check.py --device cpu``: the GPU check's very code on a tiny Qwen2 (~10 s), so it
    cannot rot before a GPU runs it."""
    out = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["ok"] and report["model"]["architecture"] == "Qwen2ForCausalLM"
    assert list(report["checks"]) == ["sft", "dpo", "grpo", "ppo", "lora", "fsdp", "quantized", "compiled", "decode"]
    for name, check in report["checks"].items():
        assert check["ok"] and check["step_s"] > 0 and check["tokens_per_s"] > 0 and check["steps_timed"] == 2, name
    assert set(report["checks"]["grpo"]["phases_s"]) >= {"generate", "reward", "logprobs", "update"}
    compiled = report["checks"]["compiled"]["variants"]  # hf_decode='static': bf16 weights, fp32 under autocast, LoRA
    assert list(compiled) == ["bf16", "fp32_autocast_bf16", "lora_fp32_autocast_bf16"]
    assert all(v["ok"] and v["tokens_per_s"] > 0 for v in compiled.values())
    quantized = report["checks"]["quantized"]  # int8 on the CPU: a sampling copy that differs, measured
    assert quantized["rollout_precision"] == "int8" and quantized["mismatch"]["rollout/logprob_diff_mean"] > 0
    decode = report["checks"]["decode"]  # every CPU variant decoded; the quantized copies' gaps measured
    assert (
        set(decode["decode_tokens_per_s"]) == {"generate", "loop", "loop:int8", "loop:bfloat16"}
        and not decode["errors"]
    )
    assert 0 < decode["logprob_gap"]["loop:int8"] < 1
    assert decode["rows_differ"] == {"loop": 0.0}  # float32 on the CPU: the loop samples generate's tokens


def test_gpu_check_names_a_failed_check_and_exits_1(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("gpu_check", GPU_CHECK)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)

    def broken(ctx):
        raise RuntimeError("no kernel image is available")

    monkeypatch.setattr(gpu_check, "check_dpo", broken)
    assert gpu_check.main(["--device", "cpu", "--only", "dpo,sft", "--steps", "1"]) == 1
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert not report["ok"] and report["checks"]["sft"]["ok"]
    assert report["checks"]["dpo"] == {
        "ok": False,
        "error": "RuntimeError: no kernel image is available",
        "wall_s": report["checks"]["dpo"]["wall_s"],
    }
    assert "gpu_check: FAILED: dpo" in out.err


SCALE = SCRIPT.with_name("scale.py")
TINY_SCALE = [
    "--lengths",
    "8",
    "--sft-lengths",
    "32",
    "--dtypes",
    "float32",
    "--hidden",
    "64",
    "--vocab",
    "512",
    "--warmup",
    "0",
    "--steps",
    "1",
]


def run_scale(tmp_path, *args: str) -> tuple[list[dict], str]:
    out = subprocess.run(
        [sys.executable, str(SCALE), "--only", "rlhfkit", *TINY_SCALE, *args, "--json-out", str(tmp_path / "s.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()], out.stdout


@pytest.mark.slow  # ~14 s of a 2-core CI worker: make test-slow (CI runs it)
def test_scale_benchmark_runs_rlhfkit_at_a_tiny_size(tmp_path):
    """``benchmarks/scale.py --only rlhfkit --layers 1`` on a tiny Qwen2 (seconds): a JSON line per run, GRPO's
    completions of exactly L tokens (the EOS the model cannot sample), the memory model, the table."""
    rows, stdout = run_scale(tmp_path, "--layers", "1")
    assert [(r["part"], r["side"], r["layers"], r["length"], r["tokens"]) for r in rows] == [
        ("rl", "rlhfkit", 1, 8, 2 * 4 * 8),
        ("sft", "rlhfkit", 1, 32, 2 * 32),
    ]
    for r in rows:
        assert r["step_s"] > 0 and r["peak_gb"] > r["floor_gb"] > r["baseline_gb"] > 0, r
        assert abs(r["floor_gb"] - r["baseline_gb"] - 16 * r["params"] / 1e9) < 1e-9  # float32 weights, grads, AdamW
    assert rows[0]["exact_length"] and rows[0]["completion_len"] == [8.0]
    ckpt = "on" if rows[0]["gradient_checkpointing"] else "off"
    assert f"| 1 | rl | 8 | float32 | default ({ckpt}) | rlhfkit |" in stdout
    assert '{"per_layer"' not in stdout  # one depth: no slope


@pytest.mark.slow  # ~14 s of a 2-core CI worker: make test-slow (CI runs it)
def test_scale_benchmark_reports_the_activation_memory_per_layer_from_two_depths(tmp_path):
    """``--depths 1,2`` (seconds): each configuration at both depths, and the per-layer table's number is
    (what autograd kept for backward at 2 layers - at 1 layer) / 1 layer / (tokens / 1000), in MB (the CPU's
    count: ``activations_gb``); checkpointing 'on' reaches the model, the budget is recorded (on the CPU it caps
    nothing)."""
    rows, stdout = run_scale(
        tmp_path, "--part", "rl", "--depths", "1,2", "--checkpointing", "on", "--memory-budget-gb", "24"
    )
    assert [(r["layers"], r["checkpointing"], r["gradient_checkpointing"]) for r in rows] == [
        (1, "on", True),
        (2, "on", True),
    ]
    assert rows[1]["params"] > rows[0]["params"] and rows[1]["floor_gb"] > rows[0]["floor_gb"]
    assert all(r["memory_budget_gb"] == 24 and r["memory_fraction"] is None for r in rows)
    [layered] = json.loads(next(x for x in stdout.splitlines() if x.startswith('{"per_layer"')))["per_layer"]
    expected = (rows[1]["activations_gb"] - rows[0]["activations_gb"]) * 1000 / (2 - 1) / (64 / 1000)
    assert expected > 0 and layered["measure"] == "kept for backward"  # a layer more keeps its input
    assert layered["depths"] == [1, 2] and layered["tokens"] == 64 and layered["ckpt"] == "on"
    assert layered["mb_per_layer_per_1k_tokens"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    assert layered["step_s_per_layer"] == pytest.approx(rows[1]["step_s"] - rows[0]["step_s"])
    assert f"| rl | 8 | float32 | on, 24 GB | 1→2 | rlhfkit | — | {expected:.1f} (on) | — |" in stdout


def test_decode_benchmark_alternates_the_decode_modes_on_a_tiny_model():
    """``benchmarks/decode.py --model tiny`` (seconds): one JSON line per completion limit, every
    variant timed, none failed, and the loop sampling the tokens generate samples."""
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.with_name("decode.py")),
            "--model",
            "tiny",
            "--new-tokens",
            "4,8",
            "--reps",
            "1",
            "--threads",
            "1",
            "--variants",
            "generate,loop,static",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in out.stdout.strip().splitlines()]
    assert not [x for x in lines if "error" in x or "loop" in x.get("warning", "")], lines
    results = [x for x in lines if "max_new_tokens" in x]
    assert [r["max_new_tokens"] for r in results] == [4, 8], lines
    for r in results:
        assert r["rows"] == 16 and set(r["tokens_per_s"]) == {"generate", "loop", "static"}
        assert all(v > 0 for v in r["tokens_per_s"].values()) and r["speedup"]["generate"] == 1.0


def test_activation_cost_benchmark_gives_the_hand_computed_checkpointed_cost_per_layer(capsys):
    """With every layer checkpointed a layer keeps its float32 input, 4 x hidden bytes a token (64 here)."""
    from benchmarks import activation_cost

    activation_cost.main(["--shape", "tiny", "--vocab", "512", "--layers", "1,3", "--plan-layers", "10"])
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_per_token_per_layer"]["on"] == 4 * 64
    assert out["bytes_per_token_per_layer"]["off"] > 10 * 4 * 64
    plan = out["plan"]
    per_token_on = 10 * 4 * 64 + out["bytes_per_token_outside_layers"]["on"] + out["bytes_per_token_per_layer"]["off"]
    assert plan["activations_on_gb"] == pytest.approx(per_token_on * 8 * 8192 / 1e9)
