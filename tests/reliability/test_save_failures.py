"""A save that fails (disk full, not a directory) is one line naming the path; the previous
checkpoint stays intact and resumable, and no half-written checkpoint remains."""

import errno
import os
import subprocess
import sys

import pytest
import torch

from rlhfkit.run import checkpoint_format
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import SFTConfig, SFTTrainer

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]


def sft(out, **overrides):
    tok = char_tokenizer()
    args = dict(learning_rate=1e-3, batch_size=2, max_steps=3, log_every=0, output_dir=str(out), save_steps=1)
    args.update(overrides)
    return SFTTrainer(tiny_causal_lm(tok, hidden_size=32, seed=0), SFTConfig(**args), ROWS, processing_class=tok)


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    real, calls = checkpoint_format.save_tree, []

    def save_tree(path, stem, state, **header):
        calls.append(path)
        if "checkpoint-2" in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path / f"{stem}.json"))
        return real(path, stem, state, **header)

    monkeypatch.setattr("rlhfkit.run.checkpoint.save_tree", save_tree)
    trainer = sft(tmp_path / "run")
    with pytest.raises(ValueError) as err:
        trainer.train()
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        f"cannot write checkpoint {tmp_path / 'run' / 'checkpoint-2'}: No space left on device"
    )
    assert message.endswith("the previous checkpoints are intact")
    names = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint"))
    assert names == ["checkpoint-1"]  # no checkpoint-2, no checkpoint-2.partial
    monkeypatch.undo()
    resumed = sft(tmp_path / "again", resume_from=str(tmp_path / "run" / "checkpoint-1"))
    assert resumed.step == 1
    resumed.train()
    full = sft(tmp_path / "full")
    full.train()
    assert all(torch.equal(a, b) for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values()))


def test_an_output_dir_under_a_file_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    from rlhfkit.tasks.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlhfkit",
            "sft",
            f"model={model}",
            f"train_dataset={tmp_path / 'rows.jsonl'}",
            "max_steps=1",
            f"output_dir={tmp_path / 'notes.txt' / 'run'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "notes.txt" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_real_full_disk_on_a_small_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("this machine does not allow mounting a tmpfs")
    try:
        trainer = sft(mount / "run", max_steps=2, save_steps=1)
        with pytest.raises(ValueError, match="cannot write checkpoint .*checkpoint-1: No space left on device"):
            trainer.train()
        leftovers = [p.name for p in (mount / "run").glob("checkpoint-*")]
        assert not any(name.endswith(".partial") for name in leftovers)
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def test_eval_output_pointing_at_a_directory_is_one_line(tmp_path, capsys):
    from rlhfkit.cli import main

    assert main(["data", str(tmp_path / "data")]) == 0
    (tmp_path / "out").mkdir()
    capsys.readouterr()
    code = main(
        [
            "eval",
            "--model",
            str(tmp_path / "data" / "model"),
            "--dataset",
            str(tmp_path / "data" / "eval_prompts.jsonl"),
            "--reward",
            "shift_oracle",
            "--output",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(tmp_path / "out") in err and "Traceback" not in err, err
