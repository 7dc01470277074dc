"""run.json (rlhfkit/run/record.py): when and where a run ran, written as it starts and ends."""

from __future__ import annotations

import json
import socket
import sys

import torch

import rlhfkit
from rlhfkit import SFTConfig, SFTTrainer
from rlhfkit.report import write_report
from rlhfkit.run.record import record_end, record_start


def test_a_run_records_its_start_and_end_and_the_report_shows_them(tmp_path, tiny_model_dir):
    data = [{"prompt": "ab", "completion": "aaa"}, {"prompt": "cd", "completion": "aa"}]
    args = SFTConfig(
        learning_rate=1e-3, max_steps=2, batch_size=2, log_every=0, progress_bar=False, output_dir=str(tmp_path / "sft")
    )
    SFTTrainer(str(tiny_model_dir), args, train_dataset=data).train()
    (session,) = json.loads((tmp_path / "sft" / "run.json").read_text())["sessions"]
    assert session["rlhfkit"] == rlhfkit.__version__ and session["torch"] == torch.__version__
    assert session["host"] == socket.gethostname() and session["python"] == sys.version.split()[0]
    gpus = torch.cuda.is_initialized()  # the run trained on a GPU (device auto on a GPU machine)
    assert session["device"] == (f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}" if gpus else "cpu")
    assert session["transformers"] and session["processes"] == 1
    assert len(session["git_commit"] or "x" * 40) == 40  # this checkout's commit (None outside a checkout)
    assert session["ended"] and 0 < session["duration_s"] < 600
    page = write_report(tmp_path / "sft").read_text()
    assert f"<td>torch</td><td>{torch.__version__}</td>" in page and "<td>status</td><td>finished</td>" in page
    assert 'data-metric="sft/lr"' in page and 'data-metric="sft/grad_norm"' in page  # logged, so plotted


def test_a_resumed_session_is_added_and_the_durations_add_up(tmp_path):
    record_start(tmp_path)
    record_end(tmp_path)
    record_start(tmp_path, resume_from=str(tmp_path / "checkpoint-2"))
    first, second = json.loads((tmp_path / "run.json").read_text())["sessions"]
    assert first["ended"] and second["ended"] is None and second["resume_from"].endswith("checkpoint-2")
    record_end(tmp_path)
    first, second = json.loads((tmp_path / "run.json").read_text())["sessions"]
    assert second["duration_s"] is not None and first["started"] <= second["started"]


def test_record_end_without_a_record_writes_nothing(tmp_path):
    assert record_end(tmp_path) is None and record_end(None) is None
    assert not (tmp_path / "run.json").exists()


def test_a_run_json_that_cannot_be_written_never_stops_the_run(tmp_path):
    import pytest

    (tmp_path / "run.json").mkdir()  # what cannot be replaced by a file
    with pytest.warns(UserWarning, match=r"run\.json: not written \("):
        assert record_start(tmp_path) is None
