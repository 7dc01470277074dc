"""report_to: the real tracker libraries, offline, each read back with its own reader — TensorBoard
event files, a W&B offline run, an MLflow file store, Trackio's local database — from real
trainer runs; a tracker that is not installed is one line naming the extra, before training."""

import json
import sys
import time

import pytest

from rlhfkit.run.metrics import MetricsLogger
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import DPOConfig, DPOTrainer, RewardModelConfig, RewardModelTrainer, SFTConfig, SFTTrainer

from .trainers.test_reward_model import oracle_pairs

SFT_ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat", "dog", "sun"]]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # a local file store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 warns users off it, tests need no database
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def sft(tmp_path, **overrides):
    tok = char_tokenizer()
    args = dict(learning_rate=1e-3, batch_size=2, max_steps=3, log_every=0, output_dir=str(tmp_path / "run"))
    args.update(overrides)
    return SFTTrainer(tiny_causal_lm(tok, hidden_size=32, seed=0), SFTConfig(**args), SFT_ROWS, processing_class=tok)


def logged(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_sft_run_reports_to_tensorboard(offline):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sft(offline, report_to=("tensorboard",), run_name="first").train()
    events = EventAccumulator(str(offline / "run" / "runs" / "first"))
    events.Reload()
    rows = logged(offline)
    assert "sft/loss" in events.Tags()["scalars"]
    for key in ("sft/loss", "sft/grad_norm", "sft/lr"):
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [r["step"] for r in rows]
        assert [s.value for s in scalars] == pytest.approx([r[key] for r in rows], rel=1e-6)
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"max_steps": 3' in text and '"report_to"' in text


def wandb_records(path):
    """The protobuf records of a W&B offline run file (``run-<id>.wandb``: a ':W&B' header, then
    LevelDB-log framing — 32 KiB blocks of chunks with a 7-byte header: crc32, length, type)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, records, buf = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length == 0 and kind == 0):
            pos += left
            continue
        buf, pos = buf + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            records.append(wandb_internal_pb2.Record.FromString(buf))
            buf = b""
    return records


def test_reward_model_run_reports_to_wandb_offline(offline):
    tok = char_tokenizer()
    RewardModelTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        RewardModelConfig(
            learning_rate=1e-3,
            batch_size=8,
            max_steps=2,
            log_every=0,
            output_dir=str(offline / "run"),
            report_to="wandb",
        ),
        oracle_pairs(16, 0),
        processing_class=tok,
    ).train()
    (run_dir,) = (offline / "run" / "wandb").glob("offline-run-*")
    for _ in range(100):  # wandb-core, a separate process, may still be flushing the file
        records = wandb_records(next(run_dir.glob("run-*.wandb")))
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.1)
    history = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    rows = logged(offline)
    assert [h["_step"] for h in history] == [r["step"] for r in rows]
    assert [h["rm/loss"] for h in history] == pytest.approx([r["rm/loss"] for r in rows], rel=1e-6)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "run" and run.project == "rlhfkit"
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["config_class"] == "RewardModelConfig" and config["max_steps"] == 2


def test_dpo_run_reports_to_mlflow(offline):
    import mlflow
    from mlflow.tracking import MlflowClient

    tok = char_tokenizer()
    DPOTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        DPOConfig(
            learning_rate=1e-3,
            batch_size=4,
            max_steps=3,
            log_every=0,
            output_dir=str(offline / "run"),
            report_to=["mlflow"],
            run_name="dpo-run",
        ),
        oracle_pairs(12, 0),
        processing_class=tok,
    ).train()
    client = MlflowClient()
    (run,) = mlflow.search_runs(experiment_names=["rlhfkit"], output_format="list")
    assert run.info.run_name == "dpo-run" and run.data.params["beta"] == "0.1"
    history = client.get_metric_history(run.info.run_id, "rewards/accuracies")
    rows = logged(offline)
    assert [m.step for m in history] == [r["step"] for r in rows]
    assert [m.value for m in history] == pytest.approx([r["rewards/accuracies"] for r in rows])
    assert run.info.status == "RUNNING" or client.get_run(run.info.run_id).info.status == "FINISHED"


def test_sft_run_reports_to_trackio(offline):
    from trackio.sqlite_storage import SQLiteStorage

    sft(offline, report_to=["trackio"]).train()
    logs = SQLiteStorage.get_logs("rlhfkit", "run")  # the run is named after output_dir
    rows = logged(offline)
    assert [entry["step"] for entry in logs] == [r["step"] for r in rows]
    assert [entry["sft/loss"] for entry in logs] == pytest.approx([r["sft/loss"] for r in rows])
    assert SQLiteStorage.get_run_config("rlhfkit", "run")["max_steps"] == 3


@pytest.mark.parametrize(
    "name,module", [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow"), ("trackio", "trackio")]
)
def test_a_tracker_that_is_not_installed_is_one_line_before_training(tmp_path, monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # import then fails as if it were missing
    with pytest.raises(ValueError) as err:
        sft(tmp_path, report_to=(name,))
    assert str(err.value) == f"report_to: {name!r} is not installed; pip install 'rlhfkit[{name}]'"
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_tracker_that_cannot_start_is_one_line(offline, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")  # mlflow 3 then refuses the file store
    with pytest.raises(ValueError) as err:
        sft(offline, report_to=("mlflow",))
    assert str(err.value).startswith("report_to: mlflow could not start (MlflowException: ") and "\n" not in str(
        err.value
    )


def test_unknown_tracker_names_are_refused_by_the_config():
    with pytest.raises(ValueError, match="report_to"):
        SFTConfig(report_to=("comet",))
    with pytest.raises(ValueError, match="report_to"):
        SFTConfig(report_to=("wandb", "wandb"))
    assert SFTConfig(report_to="none").report_to == () and SFTConfig(report_to="wandb").report_to == ("wandb",)


def test_a_failing_tracker_warns_once_and_training_goes_on(offline):
    class Broken:
        def log(self, step, metrics):
            raise OSError("disk full")

        def close(self):
            pass

    logger = MetricsLogger(
        str(offline / "run"), 0, config=SFTConfig(report_to=("tensorboard",), output_dir=str(offline / "run"))
    )
    logger.trackers.active["broken"] = Broken()
    with pytest.warns(UserWarning, match="broken failed to log step 1.*disk full"):
        logger.log(1, {"a": 1.0}, 2)
    logger.log(2, {"a": 2.0}, 2)  # no second warning, the other tracker still logs
    assert list(logger.trackers.active) == ["tensorboard"]
    logger.close()
    logger.close()  # idempotent
    assert len(logged(offline)) == 2


def test_the_cli_takes_report_to(offline, monkeypatch, tmp_path):
    from rlhfkit.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["data", "data/shift"]) == 0
    assert (
        main(
            [
                "sft",
                "model=data/shift/model",
                "train_dataset=data/shift/sft.jsonl",
                "max_steps=2",
                "output_dir=run",
                "report_to=[tensorboard]",
                "--quiet",
            ]
        )
        == 0
    )
    assert list((tmp_path / "run" / "runs" / "run").glob("events.out.tfevents.*"))
