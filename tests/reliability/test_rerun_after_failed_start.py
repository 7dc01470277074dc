"""A run that fails after its directory was created but before it completed a step (a bad
resume_from, a reward that fails at step 1) leaves only rlhfkit's record of it: the corrected rerun
reuses that directory without --overwrite, from the command line and from Python. A run that
completed a step is still never replaced silently."""

import json

import pytest

from rlhfkit.cli import main
from rlhfkit.config import RLConfig
from rlhfkit.run.directory import MARKER
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import RLTrainer, SFTConfig, SFTTrainer

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]


def sft_trainer(tok, run, **overrides):
    """A one-step SFT trainer writing to ``run``."""
    args = SFTConfig(learning_rate=1e-3, batch_size=2, max_steps=1, log_every=0, output_dir=str(run), **overrides)
    return SFTTrainer(tiny_causal_lm(tok, hidden_size=32), args, ROWS, processing_class=tok)


def steps(run):
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_cli_reruns_into_the_directory_of_a_failed_start(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["data", "d"]) == 0
    (tmp_path / "my_rewards.py").write_text(
        "def broken(prompts, completions, **kwargs):\n    raise RuntimeError('scoring service is down')\n"
    )
    rl = [
        "rl",
        "model=d/model",
        "train_dataset=d/prompts.jsonl",
        "max_new_tokens=4",
        "prompts_per_step=2",
        "max_steps=1",
        "output_dir=run",
        "--quiet",
    ]
    capsys.readouterr()
    assert main([*rl, "reward_funcs=[shift_oracle]", "resume_from=no/such/checkpoint-3"]) == 2
    assert "resume_from='no/such/checkpoint-3' does not exist" in capsys.readouterr().err
    assert (tmp_path / "run" / "config.yaml").is_file()  # it failed after the directory was created
    assert main([*rl, "reward_funcs=[my_rewards:broken]"]) == 2  # no --overwrite needed; fails at step 1
    assert "scoring service is down" in capsys.readouterr().err
    assert main([*rl, "reward_funcs=[shift_oracle]"]) == 0, capsys.readouterr().err  # the corrected rerun
    assert "shift_oracle" in (tmp_path / "run" / "config.yaml").read_text() and steps(tmp_path / "run") == [1]
    assert main([*rl, "reward_funcs=[shift_oracle]"]) == 2  # a run that completed a step is kept
    assert "already exists and is not empty" in capsys.readouterr().err


def test_python_reruns_into_the_directory_of_a_failed_start(tmp_path):
    tok = char_tokenizer()
    run = tmp_path / "run"
    sft = lambda **overrides: sft_trainer(tok, run, **overrides)  # noqa: E731

    with pytest.raises(ValueError, match="nowhere' does not exist"):
        sft(resume_from=str(tmp_path / "nowhere"))
    assert (run / MARKER).is_file() and (run / "config.yaml").is_file()
    sft().train()  # no overwrite needed
    assert steps(run) == [1]

    def fails_at_step_1(prompts, completions, **kwargs):
        raise RuntimeError("scoring service is down")

    def rl(reward, out):
        args = RLConfig(
            algorithm="grpo", max_steps=1, max_new_tokens=4, prompts_per_step=2, log_every=0, output_dir=str(out)
        )
        return RLTrainer(
            tiny_causal_lm(tok, hidden_size=32), [reward], args, train_dataset=PROMPTS, processing_class=tok
        )

    with pytest.raises(ValueError, match="scoring service is down"):
        rl(fails_at_step_1, tmp_path / "rl").train()
    rl(fraction_of_a, tmp_path / "rl").train()
    assert steps(tmp_path / "rl") == [1]


def test_a_failed_start_beside_a_users_file_still_needs_overwrite_and_keeps_the_file(tmp_path):
    tok = char_tokenizer()
    run = tmp_path / "run"
    sft = lambda **overrides: sft_trainer(tok, run, **overrides)  # noqa: E731

    with pytest.raises(ValueError, match="nowhere' does not exist"):
        sft(resume_from=str(tmp_path / "nowhere"))
    (run / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists and is not empty"):
        sft()
    sft(overwrite=True).train()
    assert (run / "notes.txt").read_text() == "mine" and steps(run) == [1]
