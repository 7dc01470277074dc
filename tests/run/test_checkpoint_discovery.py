"""Checkpoint discovery (rlhfkit/run/checkpoint.py): one listing of an output_dir's complete
checkpoints, used by ``resume_from='latest'`` and by pruning."""

import pytest

from rlhfkit.run.checkpoint import STATE_FILE, complete_checkpoints, prune_checkpoints
from rlhfkit.run.directory import latest_checkpoint


def _checkpoint(root, name, complete=True):
    path = root / name
    path.mkdir()
    if complete:
        (path / STATE_FILE).write_text('{"step": 1}')
    return path


def test_only_complete_numbered_checkpoints_are_listed_oldest_step_first(tmp_path):
    ten, two = _checkpoint(tmp_path, "checkpoint-10"), _checkpoint(tmp_path, "checkpoint-2")
    _checkpoint(tmp_path, "checkpoint-30", complete=False)  # interrupted: its state file is written last
    _checkpoint(tmp_path, "checkpoint-best")
    _checkpoint(tmp_path, "checkpoint-40.partial")
    assert complete_checkpoints(tmp_path) == [two, ten]  # by step, not by name
    assert latest_checkpoint(tmp_path) == str(ten)
    assert complete_checkpoints(tmp_path / "missing") == []


def test_pruning_and_latest_see_the_same_checkpoints(tmp_path):
    kept = [_checkpoint(tmp_path, f"checkpoint-{step}") for step in (9, 11)]
    doomed = _checkpoint(tmp_path, "checkpoint-3")
    partial = _checkpoint(tmp_path, "checkpoint-12", complete=False)
    assert prune_checkpoints(tmp_path, 2) == [doomed]
    assert complete_checkpoints(tmp_path) == kept and partial.is_dir()
    assert latest_checkpoint(tmp_path) == str(kept[-1])


@pytest.mark.parametrize("output_dir", [None, ""])
def test_latest_without_an_output_dir_is_one_line(output_dir):
    with pytest.raises(ValueError, match="resume_from='latest': no complete checkpoint-<step> directory"):
        latest_checkpoint(output_dir)
