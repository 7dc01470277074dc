"""Inputs that used to end in a traceback, run for ever or pass as nonsense are refused in one line
naming what to fix (exit status 2 from the CLI): a device the machine lacks (before anything
loads), eval/data/demo counts out of range, a config count past its bound, a reward too large for
float32 statistics, a truncated RNG file of a checkpoint."""

import os

import pytest
import torch

from rlhfkit.cli import main
from rlhfkit.rewards.functions import RewardFunctions
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import SFTConfig, SFTTrainer

DATA = {"sft": "sft.jsonl", "rm": "pairs.jsonl", "dpo": "pairs.jsonl", "rl": "prompts.jsonl"}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("task")
    assert main(["data", str(root / "d")]) == 0
    return root / "d"


def one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", ["sft", "rm", "dpo", "rl"])
def test_a_device_the_machine_lacks_is_refused_before_anything_loads(task, tmp_path, capsys, monkeypatch, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # The model path does not exist: the device is refused first, so nothing was loaded.
    err = one_line(
        capsys,
        [
            command,
            f"model={tmp_path / 'no-such-model'}",
            f"train_dataset={task / DATA[command]}",
            "reward_funcs=[shift_oracle]" if command == "rl" else "log_every=0",
            "device=cuda",
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    assert "config field 'device' is 'cuda' but torch sees no cuda device on this machine" in err
    assert "device=cpu" in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--samples", "0"], "--samples must be an integer in [1, 1024]"),
        (["--samples", "-1"], "--samples must be an integer in [1, 1024]"),
        (["--samples", "100000"], "--samples must be an integer in [1, 1024]"),
        (["--batch-size", "0"], "--batch-size must be an integer in [1, 1000000], got 0"),
        (["--batch-size", "-1"], "--batch-size must be an integer in [1, 1000000], got -1"),
    ],
)
def test_eval_counts_out_of_range_are_one_line(task, capsys, argv, expected):
    err = one_line(
        capsys,
        [
            "eval",
            "--model",
            str(task / "model"),
            "--dataset",
            str(task / "prompts.jsonl"),
            "--reward",
            "shift_oracle",
            *argv,
        ],
    )
    assert expected in err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["data", "{out}", "--task", "arithmetic", "--n-train", "0"],
            "--n-train must be an integer in [1, 10000000], got 0",
        ),
        (
            ["data", "{out}", "--task", "arithmetic", "--n-train", "-5"],
            "--n-train must be an integer in [1, 10000000], got -5",
        ),
        (["demo", "--steps", "-1"], "--steps must be an integer in [1, 1000000], got -1"),
    ],
)
def test_data_and_demo_counts_out_of_range_are_one_line(tmp_path, capsys, argv, expected):
    err = one_line(capsys, [a.format(out=tmp_path / "out") for a in argv])
    assert expected in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "setting, expected",
    [
        ("max_steps=99999999999999999999", "config field 'max_steps' must be in [0, 1e9], got 99999999999999999999"),
        ("missing_eos_penalty=1e39", "config field 'missing_eos_penalty' must be in [-1e6, 1e6] or None, got 1e+39"),
    ],
)
def test_config_values_past_their_bounds_are_one_line(task, tmp_path, capsys, setting, expected):
    err = one_line(
        capsys,
        [
            "rl",
            f"model={task / 'model'}",
            f"train_dataset={task / 'prompts.jsonl'}",
            "reward_funcs=[shift_oracle]",
            setting,
            f"output_dir={tmp_path / 'run'}",
        ],
    )
    assert expected in err


def test_rewards_too_large_for_float32_statistics_are_refused_naming_the_function():
    def huge(prompts, completions, **kwargs):
        return [1.0, 3e38]

    with pytest.raises(ValueError) as err:
        RewardFunctions([huge])(["p", "q"], ["a", "b"])
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "reward function 'huge' returned 3e+38 at row 1, which is too large"
    )
    assert "expected a float in [-1e6, 1e6] or None (prompt 'q')" in message
    assert (
        float(
            RewardFunctions([lambda prompts, completions, **kw: [1e6, -1e6]])(["p", "q"], ["a", "b"]).scores.abs().max()
        )
        == 1e6
    )  # the bound itself is accepted
    with pytest.raises(ValueError, match=r"RewardFunctions: weight 0 must be in \[-1e6, 1e6\], got 1e\+30"):
        RewardFunctions([huge], weights=[1e30])


def test_a_truncated_rng_file_of_a_checkpoint_is_one_line_naming_it(tmp_path):
    tok = char_tokenizer()
    rows = [{"prompt": "ab=", "completion": "ba"}, {"prompt": "cd=", "completion": "dc"}]

    def trainer(**kw):
        args = SFTConfig(learning_rate=1e-3, batch_size=2, max_steps=2, log_every=0, **kw)
        return SFTTrainer(tiny_causal_lm(tok, hidden_size=32, seed=0), args, rows, processing_class=tok)

    trainer(output_dir=str(tmp_path / "a"), save_steps=1).train()
    rng = tmp_path / "a" / "checkpoint-1" / "rng-0.safetensors"
    os.truncate(rng, rng.stat().st_size // 2)  # a copy cut short
    with pytest.raises(ValueError) as err:
        trainer(output_dir=str(tmp_path / "b"), resume_from=str(tmp_path / "a" / "checkpoint-1"))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"checkpoint file {rng} is damaged (")
    assert message.endswith("resume from another checkpoint")
