"""kill -9 at a random moment of a training run (during a step or during a save), then
``resume_from=latest`` (or a fresh start when no checkpoint was complete yet): the final weights are
bit-identical to an uninterrupted run's. Every trainer, many trials: ``make test-slow`` (each trial
is two or three processes of several seconds, too slow for the default suite)."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from rlhfkit.cli import main

ARGS = {
    "sft": ["train_dataset={d}/sft.jsonl", "max_steps=8", "batch_size=8"],
    "rm": ["train_dataset={d}/pairs.jsonl", "max_steps=8", "batch_size=8"],
    "dpo": ["train_dataset={d}/pairs.jsonl", "max_steps=8", "batch_size=8"],
    "rl": ["train_dataset={d}/prompts.jsonl", "max_steps=6", "reward_funcs=[shift_oracle]", "max_new_tokens=4",
           "prompts_per_step=4"],
}


@pytest.fixture(scope="module")
def shift_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("shift")
    assert main(["data", str(root / "data")]) == 0
    return root / "data"


def command(trainer, shift_dir, out, *extra):
    args = [a.format(d=shift_dir) for a in ARGS[trainer]]
    return [sys.executable, "-m", "rlhfkit", trainer, f"model={shift_dir / 'model'}", *args, "save_steps=1",
            f"output_dir={out}", "--quiet", "log_every=0", *extra]


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def final_weights(out):
    return load_file(str(out / "final" / "model.safetensors"))


def kill_and_resume(trainer, shift_dir, out, delay):
    """Start the run, kill -9 it after ``delay`` seconds (if still running), then resume until done."""
    proc = subprocess.Popen(command(trainer, shift_dir, out), env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if not killed:
        return False
    complete = [p for p in out.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit()
                and (p / "trainer_state.json").exists()] if out.exists() else []
    extra = ["resume_from=latest"] if complete else ["--overwrite"]
    done = subprocess.run(command(trainer, shift_dir, out, *extra), env=env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return True


def reference(trainer, shift_dir, out):
    done = subprocess.run(command(trainer, shift_dir, out), env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return final_weights(out)


def check_trials(trainer, shift_dir, tmp_path, delays):
    expected = reference(trainer, shift_dir, tmp_path / "reference")
    identical = killed = 0
    for i, delay in enumerate(delays):
        out = tmp_path / f"trial-{i}"
        if kill_and_resume(trainer, shift_dir, out, delay):
            killed += 1
            got = final_weights(out)
            assert set(got) == set(expected)
            identical += all(bool((got[k] == expected[k]).all()) for k in expected)
    assert killed >= 1 and identical == killed, (killed, identical)
    return killed, identical


@pytest.mark.slow
def test_an_sft_run_killed_mid_training_resumes_to_the_same_weights(tmp_path, shift_dir):
    check_trials("sft", shift_dir, tmp_path, [7.5])


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["sft", "rm", "dpo", "rl"])
def test_kill9_trials_resume_bit_identically(tmp_path, shift_dir, trainer):
    rng = random.Random(trainer)
    killed, identical = check_trials(trainer, shift_dir, tmp_path, [rng.uniform(5.0, 12.0) for _ in range(5)])
    print(f"{trainer}: {killed} killed, {identical} identical")
