"""Checkpoints of a run on several processes (torch.distributed.checkpoint shards + per-rank RNG):
a 2-process checkpoint resumed on 2 processes ends with the weights of the uninterrupted run, and
resumed on 1 process (or a 1-process checkpoint on 2) starts from exactly the saved weights and
optimizer state and continues from the saved step. A LoRA checkpoint saved sharded loads into one
unsharded model, as `rlhfkit eval --model <run>/checkpoint-N` loads it."""

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.run.checkpoint import load_module_weights, load_tree, read_dcp_metadata

# The whole file runs in make test-slow (issue 31: the default suite's 5-minute budget); its runs share
# three launches (module fixtures), so splitting it between the suites would pay for them twice.
pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("checkpoint_worker.py")
BASE = dict(algorithm="grpo", prompts_per_step=4, max_steps=4, kl_coef=0.05, mini_batch_size=8, num_iterations=2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, jobs: list[tuple[Path, dict]], fails: bool = False):
    """``checkpoint_worker.py`` on every (out, config) of ``jobs``, in turn, in one launch of ``nproc``
    processes (plain python for 1; a launch costs seconds of imports per process, a toy run less); a
    job's files go to ``out``, its run directory is ``out/run``. Returns the stderr."""
    for out, _ in jobs:
        out.mkdir(parents=True, exist_ok=True)
    jobs_file = jobs[0][0].with_name(jobs[0][0].name + "-jobs.json")
    jobs_file.write_text(json.dumps([[{**config, "output_dir": str(out / "run")}, str(out)] for out, config in jobs]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_DIST_TIMEOUT": "120"}
    launcher = (
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
        ]
        if nproc > 1
        else [sys.executable]
    )
    done = subprocess.run(
        launcher + [str(WORKER), str(jobs_file)], capture_output=True, text=True, env=env, timeout=600
    )
    assert (done.returncode != 0) == fails, done.stderr[-4000:]
    return done.stderr


def steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def assert_close(a: dict, b: dict) -> None:
    """Equal to 1e-5 relative, in norm per tensor (as the 1-vs-2-process tests of test_distributed.py)."""
    assert set(a) == set(b)
    for name in a:
        assert (a[name] - b[name]).norm() <= 1e-5 * a[name].norm(), name


def assert_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b) and any(k.startswith("optimizer.") for k in a)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def digest(rng: torch.Tensor) -> str:
    return hashlib.sha256(rng.numpy().tobytes()).hexdigest()  # as checkpoint_worker.rng_digest


def rng_digest(checkpoint: Path, rank: int) -> str:
    """Of the torch RNG state that process ``rank`` saved in ``checkpoint``."""
    return digest(load_tree(checkpoint, f"rng-{rank}", 2)[1]["torch"])


RUNS = {  # PPO: a sharded critic and its optimizer group in the checkpoint too
    "fsdp-grpo": dict(BASE, parallelism="fsdp"),
    "ddp-grpo": dict(BASE, parallelism="ddp"),
    "fsdp-ppo": dict(BASE, algorithm="ppo", prompts_per_step=8, mini_batch_size=4, parallelism="fsdp"),
}


LORA = {**BASE, "max_steps": 2, "lora_r": 4, "save_steps": 2, "parallelism": "fsdp"}
ONE_PROCESS = {**BASE, "max_steps": 3}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Every run of this file's tests in three launches (each launch costs seconds of imports per
    process; the toy runs are short), so every case of RUNS is in the default suite:
    2 processes: <run>/whole, an uninterrupted run of 4 steps that checkpoints every step, keeping the
    newest 3 (one per RUNS entry), and lora, a LoRA run of 2 steps that checkpoints at 2;
    1 process: <run>/on-one, <run>/whole's checkpoint-2 resumed, and one-process, a run of 3 steps
    that checkpoints at 2;
    2 processes: <run>/on-two, <run>/whole's checkpoint-2 resumed, and one-to-two, one-process's
    checkpoint-2 resumed."""
    root = tmp_path_factory.mktemp("checkpoints")
    ckpt = {name: str(root / name / "whole" / "run" / "checkpoint-2") for name in RUNS}
    ckpt["one-process"] = str(root / "one-process" / "run" / "checkpoint-2")
    launch(
        2,
        [(root / name / "whole", {**config, "save_steps": 1, "save_total_limit": 3}) for name, config in RUNS.items()]
        + [(root / "lora", LORA)],
    )
    launch(
        1,
        [(root / name / "on-one", {**config, "resume_from": ckpt[name]}) for name, config in RUNS.items()]
        + [(root / "one-process", {**ONE_PROCESS, "save_steps": 2})],
    )
    launch(
        2,
        [(root / name / "on-two", {**config, "resume_from": ckpt[name]}) for name, config in RUNS.items()]
        + [(root / "one-to-two", {**ONE_PROCESS, "resume_from": ckpt["one-process"]})],
    )
    return root


@pytest.fixture(params=RUNS)
def two_process_run(request, runs):
    """(<run>'s folder in ``runs``, its config)."""
    return runs / request.param, RUNS[request.param]


def test_two_process_checkpoints_are_sharded_and_pruned_by_rank_zero(two_process_run):
    root, config = two_process_run
    out = root / "whole"
    assert steps(out) == [1, 2, 3, 4]
    kept = sorted(p.name for p in (out / "run").glob("checkpoint-*"))
    assert kept == ["checkpoint-2", "checkpoint-3", "checkpoint-4"]  # pruned by rank 0
    ckpt = out / "run" / "checkpoint-2"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [
            "dcp",
            "rng-0.json",
            "rng-0.safetensors",
            "rng-1.json",
            "rng-1.safetensors",
            "trainer_state.json",
            "training_state.json",
        ]
    )
    assert sorted(p.name for p in (ckpt / "dcp").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 2
    assert json.loads((ckpt / "training_state.json").read_text())["world_size"] == 2
    assert rng_digest(ckpt, 0) != rng_digest(ckpt, 1)  # each process samples its own completions
    saved = read_dcp_metadata(ckpt / "dcp").state_dict_metadata
    modules = {k.split(".")[0] for k in saved if not k.startswith("optim")}
    assert modules == ({"policy", "critic"} if config["algorithm"] == "ppo" else {"policy"})


def test_resumed_on_two_processes_it_ends_with_the_uninterrupted_weights(two_process_run):
    root, config = two_process_run
    out, resumed = root / "whole", root / "on-two"
    ckpt = out / "run" / "checkpoint-2"
    assert steps(resumed) == [3, 4]
    assert_equal(load_file(resumed / "loaded.safetensors"), load_file(out / "saved-2.safetensors"))
    for rank in (0, 1):
        loaded = json.loads((resumed / f"loaded-{rank}.json").read_text())
        assert loaded == {"step": 2, "rng": rng_digest(ckpt, rank)}
    assert_close(load_file(out / "final.safetensors"), load_file(resumed / "final.safetensors"))


def test_resumed_on_one_process_it_starts_from_the_saved_state_and_continues(two_process_run):
    """One process samples other completions than two (each rank has its own RNG stream), so the end
    differs from the 2-process run; the start must be exactly the saved state."""
    root, config = two_process_run
    out, resumed = root / "whole", root / "on-one"
    ckpt = out / "run" / "checkpoint-2"
    saved = load_file(out / "saved-2.safetensors")
    assert_equal(load_file(resumed / "loaded.safetensors"), saved)
    assert json.loads((resumed / "loaded-0.json").read_text()) == {"step": 2, "rng": rng_digest(ckpt, 0)}
    assert steps(resumed) == [3, 4]
    final = load_file(resumed / "final.safetensors")
    assert any(not torch.equal(final[k], saved[k]) for k in saved if not k.startswith("optimizer."))  # it trained


def test_a_one_process_checkpoint_resumes_on_two_with_a_fresh_seed_for_the_new_rank(runs):
    one, resumed = runs / "one-process", runs / "one-to-two"
    ckpt = one / "run" / "checkpoint-2"
    assert_equal(load_file(resumed / "loaded.safetensors"), load_file(one / "saved-2.safetensors"))
    assert json.loads((resumed / "loaded-0.json").read_text()) == {"step": 2, "rng": rng_digest(ckpt, 0)}
    with torch.random.fork_rng():  # rank 1: the seed a fresh run gives it, seed + 1_000_003 * rank
        torch.manual_seed(0 + 1_000_003 * 1)
        fresh = digest(torch.get_rng_state())
    assert json.loads((resumed / "loaded-1.json").read_text()) == {"step": 2, "rng": fresh}
    assert steps(resumed) == [3]


def test_a_sharded_lora_checkpoint_loads_into_one_unsharded_model(runs):
    """What `rlhfkit eval --model <run>/checkpoint-N` does with a checkpoint of a torchrun run."""
    from peft import get_peft_model

    sys.path.insert(0, str(WORKER.parent))
    try:
        from checkpoint_worker import lora_config
    finally:
        sys.path.remove(str(WORKER.parent))
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    out = runs / "lora"
    saved = load_file(out / "saved-2.safetensors")
    model = get_peft_model(tiny_causal_lm(char_tokenizer(), seed=0), lora_config(4))
    ckpt = out / "run" / "checkpoint-2"
    assert all("lora_" in k for k in read_dcp_metadata(ckpt / "dcp").state_dict_metadata)  # the adapter alone
    load_module_weights(ckpt, "policy", model)
    weights = {f"policy.{k}": v for k, v in model.state_dict().items()}
    adapter = [k for k in saved if not k.startswith("optimizer.")]
    assert adapter and all("lora_" in k for k in adapter)
    for name in adapter:
        assert torch.equal(weights[name], saved[name]), name
    assert any(not torch.equal(saved[k], torch.zeros_like(saved[k])) for k in adapter if "lora_B" in k)  # trained


@pytest.mark.slow
def test_a_checkpoint_of_the_previous_single_process_format_is_refused_on_two_processes(tmp_path):
    old = tmp_path / "old" / "checkpoint-2"
    old.mkdir(parents=True)
    (old / "trainer_state.json").write_text("{}")
    (old / "policy.safetensors").write_bytes(b"")
    err = launch(2, [(tmp_path / "two", {**BASE, "resume_from": str(old)})], fails=True)
    assert "is in the single-process format of an earlier version: resume it on one process" in err
