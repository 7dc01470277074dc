"""kill -9 at a random moment of a training run after its first checkpoint (during a step or during
a save), then ``resume_from=latest``: the resumed run starts from the newest checkpoint complete at
the kill and ends with the weights of an uninterrupted run, bit for bit. Every trainer, many trials:
``make test-slow`` (each trial is two or three processes of several seconds, too slow for the
default suite)."""

import json
import os
import random
import shutil
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
    "rl": [
        "train_dataset={d}/prompts.jsonl",
        "max_steps=6",
        "reward_funcs=[shift_oracle]",
        "max_new_tokens=4",
        "prompts_per_step=4",
    ],
}
MAX_STEPS = {
    name: int(next(a for a in args if a.startswith("max_steps=")).split("=")[1]) for name, args in ARGS.items()
}


@pytest.fixture(scope="module")
def shift_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("shift")
    assert main(["data", str(root / "data")]) == 0
    return root / "data"


def command(trainer, shift_dir, out, *extra):
    args = [a.format(d=shift_dir) for a in ARGS[trainer]]
    return [
        sys.executable,
        "-m",
        "rlhfkit",
        trainer,
        f"model={shift_dir / 'model'}",
        *args,
        "save_steps=1",
        f"output_dir={out}",
        "--quiet",
        "log_every=0",
        *extra,
    ]


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def final_weights(out):
    return load_file(str(out / "final" / "model.safetensors"))


def complete_checkpoints(out) -> list[int]:
    """The steps of ``out``'s complete checkpoints (``trainer_state.json`` is written last)."""
    return sorted(
        int(p.name.split("-", 1)[1])
        for p in out.glob("checkpoint-*")
        if p.name.split("-", 1)[1].isdigit() and (p / "trainer_state.json").is_file()
    )


def kill_and_resume(trainer, shift_dir, out, at_step, delay):
    """Start the run; once ``checkpoint-<at_step>`` is complete, wait ``delay`` seconds more and
    kill -9 it — retried with no delay if the run got past its last checkpoint first, so that the
    resumed run has steps left —; then resume with ``resume_from=latest`` until done. Returns the
    step of the checkpoint the resumed run started from."""
    log = out.with_name(out.name + ".stderr")  # a file, not a pipe: a full pipe would stall the run
    for attempt in range(3):
        shutil.rmtree(out, ignore_errors=True)
        with open(log, "w") as stderr:
            proc = subprocess.Popen(
                command(trainer, shift_dir, out),
                env=env(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        deadline = time.monotonic() + 600
        while proc.poll() is None and at_step not in complete_checkpoints(out) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay if attempt == 0 else 0.0)
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert killed or proc.returncode == 0, log.read_text()[-3000:]
        at_kill = complete_checkpoints(out)
        if killed and at_kill and at_kill[-1] < MAX_STEPS[trainer]:
            break
    else:
        raise AssertionError(f"{trainer}: three runs got past their last checkpoint before the kill")
    assert at_kill[-1] >= at_step > 0, at_kill  # a checkpoint existed when the run was killed
    done = subprocess.run(
        command(trainer, shift_dir, out, "resume_from=latest"), env=env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The resumed run records its config as config-resume-<checkpoint>.yaml, naming what it resumed from.
    records = sorted(p.name for p in out.glob("config-resume-*.yaml"))
    assert records == [f"config-resume-checkpoint-{at_kill[-1]}.yaml"], (records, at_kill)
    assert str(out / f"checkpoint-{at_kill[-1]}") in (out / records[0]).read_text()
    # It continued after that step: metrics.jsonl keeps the killed run's rows up to it and the resumed
    # run's after it, so each step appears once (a run started over would log steps 1.. again).
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, MAX_STEPS[trainer] + 1)), (steps, at_kill)
    return at_kill[-1]


def reference(trainer, shift_dir, out):
    done = subprocess.run(command(trainer, shift_dir, out), env=env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return final_weights(out)


def check_trials(trainer, shift_dir, tmp_path, trials):
    """``trials``: (checkpoint step to wait for, extra delay in seconds) of each kill."""
    expected = reference(trainer, shift_dir, tmp_path / "reference")
    resumed_from = []
    for i, (at_step, delay) in enumerate(trials):
        out = tmp_path / f"trial-{i}"
        resumed_from.append(kill_and_resume(trainer, shift_dir, out, at_step, delay))
        got = final_weights(out)
        assert set(got) == set(expected)
        different = [k for k in expected if not bool((got[k] == expected[k]).all())]
        assert not different, (i, resumed_from[-1], different[:5])
    return resumed_from


# Kills per trainer. Each is two processes of several seconds (the killed run and its resumption); the
# moments are drawn anew for each trainer (seeded by its name), 12 in all over the four trainers.
TRIALS = 3


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["sft", "rm", "dpo", "rl"])
def test_kill9_trials_resume_bit_identically(tmp_path, shift_dir, trainer):
    rng = random.Random(trainer)
    last = MAX_STEPS[trainer] - 1  # at least one step, its save and the final model left after it
    resumed_from = check_trials(
        trainer, shift_dir, tmp_path, [(rng.randint(1, last), rng.uniform(0.0, 0.2)) for _ in range(TRIALS)]
    )
    print(f"{trainer}: resumed from checkpoints {resumed_from}")
