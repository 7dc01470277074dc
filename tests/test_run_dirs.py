"""Run directories never lose an earlier run silently; config presets switch cleanly."""

import json

import pytest

from rlhfkit.cli import main
from rlhfkit.config import RLConfig
from rlhfkit.data.encode import encode_pair
from rlhfkit.run.directory import finish_run, prepare_run_dir
from rlhfkit.tasks.tiny import char_tokenizer


def test_overwrite_removes_the_old_runs_logs(tmp_path):
    run = tmp_path / "run"
    prepare_run_dir(str(run))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "old/metric": 1.0}) + "\n")
    (run / "plots").mkdir()
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists and is not empty"):
        prepare_run_dir(str(run))
    prepare_run_dir(str(run), overwrite=True, config=RLConfig())
    assert not (run / "metrics.jsonl").exists() and not (run / "plots").exists()
    assert (run / "notes.txt").read_text() == "mine" and (run / "config.yaml").exists()


def test_resuming_is_allowed_only_into_the_checkpoints_own_run(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    (run / "checkpoint-2").mkdir(parents=True)
    other.mkdir()
    (other / "metrics.jsonl").write_text("")
    prepare_run_dir(str(run), resume_from=str(run / "checkpoint-2"), config=RLConfig())
    assert (run / "config-resume-checkpoint-2.yaml").exists()
    with pytest.raises(ValueError, match="is not inside it"):
        prepare_run_dir(str(other), resume_from=str(run / "checkpoint-2"))


def test_a_run_without_steps_finishes_without_plots(tmp_path):
    finish_run(str(tmp_path))
    assert not (tmp_path / "plots").exists()


def test_switching_algorithm_takes_the_new_presets_settings():
    ppo = RLConfig().replace(algorithm="ppo")
    assert ppo.advantage_estimator == "gae" and ppo.use_critic and ppo.kl_in_reward
    custom = RLConfig(kl_coef=0.3).replace(algorithm="rloo")
    assert custom.kl_coef == 0.3 and custom.advantage_estimator == "rloo"


def test_a_critic_needs_returns_to_learn():
    with pytest.raises(ValueError, match="use_critic"):
        RLConfig(algorithm="rloo", use_critic=True)


def test_data_command_never_overwrites_silently(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d", "--task", "arithmetic"]) == 0
    assert main(["data", "d", "--task", "arithmetic"]) == 2
    assert "already holds" in capsys.readouterr().err
    assert main(["data", "d", "--task", "arithmetic", "--overwrite"]) == 0


def test_encode_pair_with_an_empty_prompt_keeps_the_completion():
    tok = char_tokenizer()
    enc = encode_pair("", "abcdef", tok, max_length=5)
    assert enc.prompt_len == 0 and enc.input_ids == tok("abcde", add_special_tokens=False)["input_ids"]
