"""benchmarks/endpoint_learning.py (docs/results/endpoint-learning.md): its reward, a run at the
smallest size (a JSON line naming the commit it imported) and the table of runs."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "endpoint_learning.py"


def load():
    spec = importlib.util.spec_from_file_location("endpoint_learning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reward_is_the_share_of_the_reversed_words_positions():
    score = load().score
    assert score("dcba", "dcba") == 1.0
    assert score(" dcba\n", "dcba") == 1.0
    assert score("dcxx", "dcba") == 0.5
    assert score("abcd", "dcba") == 0.0  # the echo
    assert score("dcbaxxxx", "dcba") == 0.5  # over the longer of the two
    assert score("", "dcba") == 0.0


@pytest.mark.slow  # ~10 s idle (an SFT run, the endpoint, a GRPO step): make test's budget is tight
def test_a_tiny_run_prints_its_json_line_and_the_table_reads_it(tmp_path):
    """2 SFT steps, 1 GRPO step through the endpoint (about 10 s); the line names this checkout's
    commit and the table summarises it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    args = ["--sft-steps", "2", "--steps", "1", "--eval-every", "1", "--eval-words", "2", "--train-words", "8"]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--seed", "0", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    run = json.loads(line)
    assert Path(run["rlhfkit"]) == ROOT / "rlhfkit"
    assert [step for step, _ in run["held_out"]] == [0, 1] and len(run["train_reward"]) == 1
    assert run["gain"] == round(run["held_out"][-1][1] - run["held_out"][0][1], 4)
    (tmp_path / "runs.jsonl").write_text("progress line\n" + line + "\n" + line + "\n")
    table = subprocess.run(
        [sys.executable, str(SCRIPT), "--table", str(tmp_path / "runs.jsonl")], capture_output=True, text=True
    )
    assert table.returncode == 0, table.stderr
    assert f"| {run['commit']} | own | 1 |" in table.stdout  # the repeated seed counted once
    assert f"repeated runs: {run['commit']} seed 0: identical" in table.stdout
