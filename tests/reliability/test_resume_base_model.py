"""resume_from onto another base model is refused in one line, as a changed seed is: every
checkpoint records a fingerprint of the model its run started from (``models.fingerprint``), and
the same base model still resumes."""

import warnings

import pytest

from rlhfkit.cli import main
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import DPOConfig, DPOTrainer, RewardModelConfig, RewardModelTrainer, SFTConfig, SFTTrainer

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]
PAIRS = [{"prompt": p, "chosen": "aaaa", "rejected": "bbbb"} for p in ["abc", "hello", "xyz", "go"]]
TRAINERS = {
    "sft": (SFTTrainer, SFTConfig, ROWS),
    "rm": (RewardModelTrainer, RewardModelConfig, PAIRS),
    "dpo": (DPOTrainer, DPOConfig, PAIRS),
}


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_a_supervised_run_refuses_to_resume_onto_another_base_model(tmp_path, name):
    trainer_cls, config_cls, rows = TRAINERS[name]
    tok = char_tokenizer()

    def run(out, model_seed, **overrides):
        args = config_cls(
            learning_rate=1e-3, batch_size=2, max_steps=2, log_every=0, output_dir=str(out), save_steps=1, **overrides
        )
        return trainer_cls(tiny_causal_lm(tok, hidden_size=32, seed=model_seed), args, rows, processing_class=tok)

    run(tmp_path / "a", model_seed=0).train()
    checkpoint = str(tmp_path / "a" / "checkpoint-1")
    with pytest.raises(ValueError) as err:  # the same architecture, other weights
        run(tmp_path / "b", model_seed=1, resume_from=checkpoint)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"resume_from={checkpoint!r}: "), message
    assert "is not the base model it was trained from (its weights have other values)" in message
    assert run(tmp_path / "c", model_seed=0, resume_from=checkpoint).step == 1  # the same base model resumes


def test_rl_refuses_to_resume_onto_another_base_model_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d"]) == 0
    assert main(["sft", "model=d/model", "train_dataset=d/sft.jsonl", "max_steps=1", "output_dir=sft", "--quiet"]) == 0
    rl = [
        "rl",
        "train_dataset=d/prompts.jsonl",
        "reward_funcs=[shift_oracle]",
        "max_new_tokens=4",
        "prompts_per_step=2",
        "max_steps=2",
        "save_steps=1",
        "--quiet",
    ]
    assert main([*rl, "model=d/model", "output_dir=a"]) == 0
    capsys.readouterr()
    assert main([*rl, "model=sft/final", "output_dir=b", "resume_from=a/checkpoint-1"]) == 2  # the SFT'd model
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        "rlhfkit rl: error: resume_from='a/checkpoint-1': it was trained from 'd/model', and this "
        "run's model 'sft/final' is another base model"
    ), err
    assert main([*rl, "model=d/model", "output_dir=c", "resume_from=a/checkpoint-1"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "change, says",
    [
        ("algorithm=ppo", "it trained policy and this run trains policy + critic: it was saved by another algorithm"),
        (
            "lora_r=4",
            "its policy was trained without LoRA adapters and this run's policy is with them; resume with the lora_r",
        ),
    ],
)
def test_resuming_with_another_algorithm_or_lora_names_what_differs(tmp_path, monkeypatch, capsys, change, says):
    """Not 'this run's model is not the base model' (issue 51): the checkpoint's trained modules are named,
    and nothing else is printed around the line (peft's deprecation warning was)."""
    monkeypatch.chdir(tmp_path)
    assert main(["data", "d"]) == 0
    rl = ["rl", "model=d/model", "train_dataset=d/prompts.jsonl", "reward_funcs=[shift_oracle]", "max_new_tokens=4",
          "prompts_per_step=2", "max_steps=1", "save_steps=1", "--quiet"]  # fmt: skip
    assert main([*rl, "output_dir=a"]) == 0
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:  # what the terminal would show around the line
        warnings.simplefilter("always")
        assert main([*rl, "output_dir=b", "resume_from=a/checkpoint-1", change]) == 2
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message)]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlhfkit rl: error: resume_from='a/checkpoint-1': " + says), err
