"""``benchmarks/scale.py``'s TRL side (TRL 1.16's GRPOTrainer and SFTTrainer) runs, on a tiny Qwen2."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCALE = Path(__file__).resolve().parents[2] / "benchmarks" / "scale.py"


def test_scale_benchmark_runs_the_trl_side_at_a_tiny_size():
    out = subprocess.run(
        [
            sys.executable,
            str(SCALE),
            "--only",
            "trl",
            "--trl-python",
            sys.executable,
            "--lengths",
            "16",
            "--sft-lengths",
            "32",
            "--dtypes",
            "float32",
            "--hidden",
            "64",
            "--vocab",
            "512",
            "--layers",
            "1",
            "--warmup",
            "0",
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in out.stdout.splitlines() if x.startswith('{"part"')]
    assert [(r["part"], r["side"], r["gradient_checkpointing"]) for r in rows] == [
        ("rl", "trl", True),
        ("sft", "trl", True),
    ]
    assert rows[0]["exact_length"] and rows[0]["completion_len"] == [16.0]  # no completion ended before L
    assert all(r["step_s"] > 0 and r["peak_gb"] > r["floor_gb"] for r in rows)
