"""Ctrl-C (SIGINT) and SIGTERM end an ``rlhfkit`` run with exit status 130 / 143 and one line on
stderr naming this run's newest complete checkpoint and the command that resumes from it; that
command ends with the weights of an uninterrupted run, bit for bit. A signal during a save leaves
``checkpoint-N.partial``, never a checkpoint that looks complete (the way test_kill9.py checks
kill -9). In-process cases (the signal sent from inside, at a chosen moment) run by default; the
random-moment trials from outside and torchrun's are ``slow``."""

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rlhfkit.cli import main
from rlhfkit.run import checkpoint as ckpt_module
from rlhfkit.run.checkpoint import complete_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there"]
STEPS = 4


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def rl(model, prompts, out, *extra):
    return [
        "rl",
        f"model={model}",
        f"train_dataset={prompts}",
        "reward_funcs=[rlhfkit.tasks.toy:fraction_of_a]",
        "max_new_tokens=4",
        "prompts_per_step=4",
        f"max_steps={STEPS}",
        "save_steps=1",
        f"output_dir={out}",
        "--quiet",
        "log_every=0",
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir, prompts, one_thread):
    out = tmp_path_factory.mktemp("reference") / "run"
    assert main(rl(tiny_model_dir, prompts, out)) == 0
    return load_file(str(out / "final" / "model.safetensors"))


def check_line(err: str, signame: str, out: Path) -> list[str]:
    """The one stderr line: the signal, the newest complete checkpoint (complete, loadable, the newest
    on disk), and the resume command; returns the command's arguments after ``rlhfkit``."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    prefix = f"rlhfkit rl: interrupted ({signame}); newest complete checkpoint: "
    assert lines[0].startswith(prefix), lines[0]
    named, command = lines[0][len(prefix) :].split("; resume with: ")
    named = Path(named)
    assert (named / "trainer_state.json").is_file() and (named / "dcp" / ".metadata").is_file()
    assert complete_checkpoints(out)[-1] == named
    for path in complete_checkpoints(out):  # every checkpoint that looks complete is
        assert (path / "dcp" / ".metadata").is_file() and (path / "training_state.json").is_file(), path
    argv = shlex.split(command)
    assert argv[0] == "rlhfkit" and argv[-1] == f"resume_from={named}" and "--overwrite" not in argv
    return argv[1:]


def _signal_self():
    os.kill(os.getpid(), signal.SIGINT)


def _during_save(monkeypatch, step):
    """SIGINT while checkpoint-<step> is being written (after DCP's shards, before its state)."""
    real = ckpt_module.save_tree

    def save_tree(path, name, *args, **kwargs):
        if Path(path).name == f"checkpoint-{step}.partial" and name == "training_state":
            _signal_self()
        return real(path, name, *args, **kwargs)

    monkeypatch.setattr(ckpt_module, "save_tree", save_tree)


def _before_rename(monkeypatch, step):
    """SIGINT once checkpoint-<step>.partial is whole (trainer_state.json in), before its rename."""
    real = Path.rename

    def rename(self, target):
        if self.name == f"checkpoint-{step}.partial":
            assert (self / "trainer_state.json").is_file()
            _signal_self()
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)


@pytest.mark.parametrize("moment", [_during_save, _before_rename], ids=["during-save", "before-rename"])
def test_sigint_while_a_checkpoint_is_written_leaves_it_partial_and_resumes_bit_identically(
    moment, tmp_path, tiny_model_dir, prompts, reference, monkeypatch, capsys
):
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        moment(patch, 3)
        assert main(rl(tiny_model_dir, prompts, out)) == 130
    argv = check_line(capsys.readouterr().err, "SIGINT", out)
    assert argv[-1] == f"resume_from={out / 'checkpoint-2'}"
    assert (out / "checkpoint-3.partial").is_dir() and not (out / "checkpoint-3").exists()
    assert main(argv) == 0, capsys.readouterr().err
    got = load_file(str(out / "final" / "model.safetensors"))
    assert set(got) == set(reference) and all(bool((got[k] == reference[k]).all()) for k in reference)


def test_sigint_while_pruning_never_leaves_a_half_deleted_checkpoint_that_looks_complete(
    tmp_path, tiny_model_dir, prompts, monkeypatch, capsys
):
    out = tmp_path / "run"
    real = ckpt_module.shutil.rmtree

    def rmtree(path, *args, **kwargs):  # deletes the shards first, as rmtree may, then the signal
        if Path(path).name == "checkpoint-1":
            real(Path(path) / "dcp")
            _signal_self()
        return real(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(ckpt_module.shutil, "rmtree", rmtree)
        assert main(rl(tiny_model_dir, prompts, out, "save_total_limit=2")) == 130
    check_line(capsys.readouterr().err, "SIGINT", out)  # checks every complete-looking checkpoint
    assert [p.name for p in complete_checkpoints(out)] == ["checkpoint-2", "checkpoint-3"]


def test_no_checkpoint_yet_says_what_rerunning_does(tmp_path, tiny_model_dir, prompts, monkeypatch, capsys):
    from rlhfkit.run import lifecycle

    with monkeypatch.context() as patch:
        patch.setattr(lifecycle.Run, "step_begin", lambda self: _signal_self())
        assert main(rl(tiny_model_dir, prompts, tmp_path / "run")) == 130
    assert capsys.readouterr().err == (
        "rlhfkit rl: interrupted (SIGINT); no complete checkpoint yet: rerunning the same command starts over\n"
    )
    with monkeypatch.context() as patch:
        patch.setattr("rlhfkit.tasks.arithmetic.write_task_files", lambda *a, **k: _signal_self())
        assert main(["data", str(tmp_path / "e"), "--task", "arithmetic"]) == 130
    assert capsys.readouterr().err.endswith("rlhfkit data: interrupted (SIGINT)\n")


# ---------------------------------------------------------------- from outside, as a terminal or a scheduler
def env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "RLHFKIT_DIST_TIMEOUT": "60"}


def interrupt(argv, out, signum, after_step, delay=0.0, timeout=900):  # a no-hang bound only
    """``python -m rlhfkit <argv>`` in its own session; once checkpoint-<after_step> is complete (and
    ``delay`` more seconds), ``signum`` to the whole process group, as Ctrl-C in a terminal sends it."""
    log = out.with_name(out.name + ".stderr")  # a file, not a pipe: a full pipe would stall the run
    with open(log, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlhfkit", *argv],
            env=env(),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while proc.poll() is None and not (out / f"checkpoint-{after_step}" / "trainer_state.json").is_file():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)
    time.sleep(delay)
    if proc.poll() is None:
        os.killpg(proc.pid, signum)
    proc.wait(timeout=600)  # a no-hang bound: the run saves and exits after the signal, however loaded the machine
    return proc.returncode, log.read_text()


def test_sigterm_from_outside_exits_143_with_one_line(tmp_path, tiny_model_dir, prompts):
    out = tmp_path / "run"
    code, err = interrupt(rl(tiny_model_dir, prompts, out, "max_steps=40"), out, signal.SIGTERM, after_step=1)
    assert code == 143, err
    check_line(err, "SIGTERM", out)


@pytest.mark.slow
def test_a_signal_at_a_random_moment_then_the_printed_command_ends_bit_identically(tmp_path, tiny_model_dir, prompts):
    steps = ["max_steps=8"]  # 7 steps and saves after checkpoint-1: the signal hits a step or a save
    assert main(rl(tiny_model_dir, prompts, tmp_path / "reference", *steps)) == 0
    reference = load_file(str(tmp_path / "reference" / "final" / "model.safetensors"))
    out = tmp_path / "run"
    code, err = interrupt(
        rl(tiny_model_dir, prompts, out, *steps), out, signal.SIGINT, after_step=1, delay=random.uniform(0.0, 0.3)
    )
    assert code == 130, err
    argv = check_line(err, "SIGINT", out)
    done = subprocess.run(
        [sys.executable, "-m", "rlhfkit", *argv], env=env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, 9))  # resumed, not started over: each step once
    got = load_file(str(out / "final" / "model.safetensors"))
    assert set(got) == set(reference) and all(bool((got[k] == reference[k]).all()) for k in reference)


CUT_TORCH_SAVE = """
import os, signal, sys, torch

writer, out, sent = torch._C.PyTorchFileWriter, sys.argv[1], []
real = writer.write_end_of_file


def write_end_of_file(self):  # SIGINT as torch.save ends the first shard item of checkpoint-2
    if not sent and os.path.exists(os.path.join(out, "checkpoint-1", "trainer_state.json")):
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)
    return real(self)


writer.write_end_of_file = write_end_of_file
"""
THE_COMMAND = "from rlhfkit.cli import main\nsys.exit(main(sys.argv[2:]))\n"
FROM_PYTHON = """
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (xdist's children inherit it ignored)
from rlhfkit import RLConfig, RLTrainer
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

tokenizer = char_tokenizer()
args = RLConfig(max_new_tokens=4, max_steps=3, prompts_per_step=4, save_steps=1, output_dir=out, log_every=0)
RLTrainer(
    model=tiny_causal_lm(tokenizer),
    processing_class=tokenizer,
    reward_funcs=[lambda prompts, completions, **columns: [float(len(c)) for c in completions]],
    args=args,
    train_dataset=[{"prompt": p} for p in ["abc", "hello", "xyz 12", "qq"]],
).train()
"""


def cut_in_a_shard_write(out: Path, code: str, *argv: str) -> subprocess.CompletedProcess:
    """``code`` run with SIGINT sent inside the end record of checkpoint-2's first shard item."""
    return subprocess.run(
        [sys.executable, "-c", CUT_TORCH_SAVE + code, str(out), *argv],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_signal_inside_a_shard_write_waits_for_it_then_ends_with_one_line(tmp_path, tiny_model_dir, prompts):
    """SIGINT while DCP's ``torch.save`` ends a shard item of checkpoint-2: the shards are finished first
    (cut there, the zip writer, freed later, wrote its end into the closed shard file and the process
    aborted), then the run ends as any interrupted one: 130, one line naming checkpoint-1, checkpoint-2
    left partial."""
    out = tmp_path / "run"
    done = cut_in_a_shard_write(out, THE_COMMAND, *rl(tiny_model_dir, prompts, out, "max_steps=3"))
    assert done.returncode == 130, done.stderr[-3000:]
    assert check_line(done.stderr, "SIGINT", out)[-1] == f"resume_from={out / 'checkpoint-1'}"
    assert (out / "checkpoint-2.partial").is_dir() and not (out / "checkpoint-2").exists()


@pytest.mark.slow
def test_ctrl_c_inside_a_shard_write_from_python_is_a_keyboard_interrupt_after_it(tmp_path):
    """A trainer called from Python (no command, no handlers of ours): Ctrl-C inside a shard write is
    held to its end, then Python's own KeyboardInterrupt; the process is not aborted."""
    out = tmp_path / "run"
    done = cut_in_a_shard_write(out, FROM_PYTHON)
    assert done.returncode in (1, -signal.SIGINT), done.stderr[-3000:]  # an uncaught KeyboardInterrupt, not -6
    assert done.stderr.rstrip().endswith("KeyboardInterrupt"), done.stderr[-3000:]
    assert (out / "checkpoint-2.partial").is_dir() and not (out / "checkpoint-2").exists()


@pytest.mark.slow
def test_ctrl_c_under_torchrun_stops_every_process_and_prints_one_line(tmp_path, tiny_model_dir, prompts):
    out = tmp_path / "run"
    argv = rl(tiny_model_dir, prompts, out, "max_steps=40", "--nproc-per-node", "2")
    start = time.monotonic()
    code, err = interrupt(argv, out, signal.SIGINT, after_step=1)
    assert code == 130, err
    resume = check_line(err, "SIGINT", out)
    assert resume[resume.index("--nproc-per-node") + 1] == "2"  # the command as typed
    assert time.monotonic() - start < 120
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps  # no rank left running
