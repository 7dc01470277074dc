"""Launching: `rlhfkit rl --nproc-per-node 2` (torchrun underneath, `python -m rlhfkit`), two
"machines" on one host (two torchrun invocations, --nnodes 2, loopback rendezvous), one voice for
errors, and a failing rank that ends the whole job instead of hanging it."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PROMPTS = ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "RLHFKIT_DIST_TIMEOUT": "60",
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def _rl(tmp_path, tiny_model_dir, prompts, *extra, reward="rlhfkit.tasks.toy:fraction_of_a"):
    return [
        sys.executable,
        "-m",
        "rlhfkit",
        "rl",
        f"model={tiny_model_dir}",
        f"train_dataset={prompts}",
        f"reward_funcs=[{reward}]",
        "max_new_tokens=6",
        "prompts_per_step=4",
        "learning_rate=3e-3",
        "--quiet",
        *extra,
    ]


def test_nproc_per_node_starts_torchrun_and_one_process_writes_the_run(tmp_path, tiny_model_dir, prompts):
    out = subprocess.run(
        _rl(
            tmp_path, tiny_model_dir, prompts, "--nproc-per-node", "2", "max_steps=3", f"output_dir={tmp_path / 'run'}"
        ),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert out.stdout.count("step 3/3") == 1  # progress lines from rank 0 only
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_two_machines_on_one_host_train_together(tmp_path):
    config = tmp_path / "config.json"
    # DDP: each "machine" holds its own copy of the weights, which worker.py hashes before any gathering
    config.write_text(
        json.dumps(
            dict(algorithm="grpo", prompts_per_step=4, max_steps=3, parallelism="ddp", output_dir=str(tmp_path / "run"))
        )
    )
    endpoint = f"127.0.0.1:{_port()}"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(rank),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                endpoint,
                "--rdzv-id",
                "two-machines",
                str(HERE / "worker.py"),
                "train",
                str(config),
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for rank in (0, 1)
    ]
    results = [node.communicate(timeout=300) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), [err[-2000:] for _, err in results]
    copies = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("weights-*.json"))]  # sha256 per parameter
    assert len(copies) == 2 and copies[0] and copies[0] == copies[1]
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow  # moved out of the default suite for its 5-minute budget (issue 31); CI runs it in make test-slow
def test_a_failing_rank_ends_the_job_with_its_error_printed_once(tmp_path, tiny_model_dir, prompts):
    start = time.perf_counter()
    out = subprocess.run(
        _rl(tmp_path, tiny_model_dir, prompts, "--nproc-per-node", "2", "max_steps=3", reward="failing:fail_on_rank_1"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert out.returncode != 0
    assert out.stderr.count("boom on rank 1") == 1, out.stderr[-3000:]
    assert "[rank 1]" in out.stderr
    assert time.perf_counter() - start < 120  # torchrun stops the other rank: no wait for the collective timeout


@pytest.mark.slow  # moved out of the default suite for its 5-minute budget (issue 31); CI runs it in make test-slow
def test_errors_found_before_the_processes_join_are_printed_once(tmp_path, tiny_model_dir, prompts):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"no_prompt": 1}\n')
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "rlhfkit",
            "rl",
            f"model={tiny_model_dir}",
            f"train_dataset={bad}",
            "reward_funcs=[rlhfkit.tasks.toy:fraction_of_a]",
            "prompts_per_step=2",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert out.returncode != 0
    assert out.stderr.count("rlhfkit rl: error:") == 1 and "bad.jsonl" in out.stderr, out.stderr[-3000:]
    # A rank other than 0 is silent while rank 0 could still say it (torchrun stops it once rank 0 exits);
    # as rank 1 of a job whose rank 0 never fails, it says the error itself after the grace period.
    alone = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhfkit",
            "rl",
            f"model={tiny_model_dir}",
            f"train_dataset={bad}",
            "reward_funcs=[rlhfkit.tasks.toy:fraction_of_a]",
        ],
        capture_output=True,
        text=True,
        env={**_env(), "RANK": "1", "WORLD_SIZE": "2", "RLHFKIT_ERROR_GRACE_S": "1"},
        timeout=300,
    )
    assert alone.returncode == 2 and alone.stderr.count("rlhfkit rl: error: [rank 1]") == 1, alone.stderr[-2000:]
    odd = subprocess.run(
        _rl(tmp_path, tiny_model_dir, prompts, "--nproc-per-node", "2", "prompts_per_step=3"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert odd.returncode != 0 and odd.stderr.count("must be divisible by the number of processes") == 1
