"""Error lines name what the user wrote: a model path is called ``model`` (not the tokenizer read
from it), a bare name that is not a local path fails at once without network (no ~50 s of Hub
retries), and a full disk names the file or directory that could not be written."""

import os
import subprocess
import time

import pytest

from rlhfkit.cli import main
from rlhfkit.models.sources import hub_unreachable

RL = ["reward_funcs=[shift_oracle]", "max_new_tokens=4", "prompts_per_step=2"]
DATA = {"sft": "d/sft.jsonl", "dpo": "d/pairs.jsonl", "rl": "d/prompts.jsonl"}


@pytest.fixture
def task(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d"]) == 0
    capsys.readouterr()
    return tmp_path


@pytest.mark.parametrize("command", ["sft", "dpo", "rl", "eval"])
def test_a_missing_model_path_is_called_model(task, capsys, command):
    if command == "eval":
        argv = ["eval", "--model", "./no-such-model", "--dataset", "d/prompts.jsonl", "--reward", "shift_oracle"]
    else:
        argv = [
            command,
            "model=./no-such-model",
            f"train_dataset={DATA[command]}",
            "max_steps=1",
            "output_dir=run",
            *(RL if command == "rl" else []),
        ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"rlhfkit {command}: error: model path does not exist: no-such-model\n"


def test_a_bare_name_without_network_fails_at_once_in_one_line(task, monkeypatch, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(task / "hf"))  # an empty cache
    start = time.monotonic()
    code = main(["sft", "model=nope", "train_dataset=d/sft.jsonl", "max_steps=1", "output_dir=run"])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        "rlhfkit sft: error: model 'nope' is not a local path, so it was treated as a Hugging Face Hub id"
    ), err
    if hub_unreachable():  # this machine has no route to the Hub
        assert "the Hub cannot be reached from this machine" in err and elapsed < 12, (elapsed, err)
    assert not (task / "run").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of ``pages`` memory pages at tmp_path/small (skipped where mounting is not allowed)."""
    mount = tmp_path / "small"
    mount.mkdir()

    def make(pages):
        size = pages * os.sysconf("SC_PAGE_SIZE")
        if subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
        ).returncode:
            pytest.skip("this machine does not allow mounting a tmpfs")
        return mount

    yield make
    subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.parametrize("pages,where", [(2, "metrics.jsonl"), (50, "final")])
def test_a_full_disk_names_what_could_not_be_written(task, small_disk, capsys, pages, where):
    # 2 pages: the run's marker and config.yaml fit, its first metrics row does not;
    # 50 pages: the logs fit, the model in final/ (340 kB) does not.
    disk = small_disk(pages)
    code = main(
        ["sft", "model=d/model", "train_dataset=d/sft.jsonl", "max_steps=1", f"output_dir={disk / 'run'}", "--quiet"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err == f"rlhfkit sft: error: {disk / 'run' / where}: No space left on device\n", err
