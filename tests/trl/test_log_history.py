"""TRL code reads ``trainer.state.log_history`` by TRL's metric names (``log_history[-1]["reward"]`` during
training, ``log_history[-1]["train_loss"]`` after it: TRL's end-of-run summary row); the drop-in's rows
carry them beside rlhfkit's (rlhfkit/trl/metrics.py), with TRL's ``step``."""

import math

import pytest

from rlhfkit.tasks.tiny import save_tiny_model
from rlhfkit.trl import (
    DPOConfig,
    DPOTrainer,
    GRPOConfig,
    GRPOTrainer,
    RewardConfig,
    RewardTrainer,
    SFTConfig,
    SFTTrainer,
)
from rlhfkit.trl.metrics import rl_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none", logging_steps=1)
PAIRS = [{"prompt": "ab", "chosen": "cd", "rejected": "zz"}, {"prompt": "x", "chosen": "yz", "rejected": "q"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def reward_len(completions, **kwargs):
    return [-abs(8 - len(completion)) for completion in completions]


def test_grpo_log_history_has_trls_names_beside_rlhfkits(model_dir, tmp_path):
    # 2 micro-steps per generation, each its own optimizer step: TRL's step is twice rlhfkit's
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=2,
        max_completion_length=8,
        max_steps=4,
        **CPU,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward_len,
        args=args,
        train_dataset=[{"prompt": p} for p in ["abc", "hello", "xyz", "qq"]],
    )
    output = trainer.train()
    last, ours = trainer.state.log_history[-2], trainer.history[-1]  # [-1]: the end-of-training summary
    summary = trainer.state.log_history[-1]
    assert summary["step"] == trainer.state.global_step == 4 and summary["train_runtime"] > 0
    losses = [row["policy/total_loss"] for row in trainer.history]  # TRL's train_loss: the whole loss
    assert summary["train_loss"] == output.training_loss == output.metrics["train_loss"] == sum(losses) / len(losses)
    assert summary["train_steps_per_second"] == pytest.approx(4 / summary["train_runtime"], rel=1e-2)
    assert summary["train_samples_per_second"] == pytest.approx(4 * summary["train_steps_per_second"], rel=1e-2)
    assert last["reward"] == ours["reward/mean"] and last["reward_std"] == ours["reward/std"]
    assert last["rewards/reward_len/mean"] == ours["reward/reward_len_mean"]
    assert last["loss"] == ours["policy/total_loss"] and last["grad_norm"] == ours["perf/grad_norm"]
    assert last["learning_rate"] == ours["perf/lr"] and last["entropy"] == ours["policy/entropy"]
    assert last["completions/mean_length"] == ours["rollout/response_length_mean"]
    assert last["completions/clipped_ratio"] == ours["rollout/truncated_frac"]
    assert last["clip_ratio/region_mean"] == ours["policy/clip_frac"]
    assert "kl" not in last  # TRL logs kl only with beta > 0
    assert last["reward/mean"] == ours["reward/mean"]  # rlhfkit's names stay
    assert last["step"] == trainer.state.global_step == 4 and ours["step"] == 2
    assert [r["step"] for r in trainer.state.log_history] == [2, 4, 4]  # the steps' rows, then the summary


def test_grpo_table_follows_the_config():
    base = dict(output_dir="out", **CPU)
    plain = rl_metrics(GRPOConfig(**base), ["f"])
    assert "kl" not in plain and plain["loss"] == "policy/total_loss" and plain["rewards/f/mean"] == "reward/f_mean"
    assert plain["rewards/f/std"] == "reward/f_std" and "policy_loss" not in plain
    with_kl = rl_metrics(GRPOConfig(beta=0.1, use_bias_correction_kl=False, **base), [])
    assert with_kl["kl"] == "kl/k3" and with_kl["loss"] == "policy/total_loss"  # TRL's loss holds beta x KL
    # with the entropy bonus TRL logs the policy loss alone as policy_loss, the whole loss as loss
    assert rl_metrics(GRPOConfig(entropy_coef=0.01, **base), [])["policy_loss"] == "policy/loss"
    assert "clip_ratio/region_mean" not in rl_metrics(GRPOConfig(loss_type="cispo", **base), [])


@pytest.mark.parametrize(
    "config_class, trainer_class, data, names",
    [
        (
            SFTConfig,
            SFTTrainer,
            [{"prompt": "ab", "completion": "cd"}, {"prompt": "x", "completion": "yz"}],
            {"loss": "sft/loss", "grad_norm": "sft/grad_norm", "learning_rate": "sft/lr", "epoch": "sft/epoch"},
        ),
        (
            DPOConfig,
            DPOTrainer,
            PAIRS,
            {
                "loss": "dpo/loss",
                "grad_norm": "perf/grad_norm",
                "learning_rate": "perf/lr",
                "rewards/margins": "rewards/margins",
                "eval_loss": "eval/loss",
                "eval_rewards/accuracies": "eval/rewards/accuracies",
            },
        ),
        (
            RewardConfig,
            RewardTrainer,
            PAIRS,
            {
                "loss": "rm/loss",
                "accuracy": "rm/accuracy",
                "margin": "rm/margin_mean",
                "mean_reward": "rm/reward_mean",
                "eval_accuracy": "eval/accuracy",
            },
        ),
    ],
    ids=["sft", "dpo", "reward"],
)
def test_supervised_log_history_has_trls_names(config_class, trainer_class, data, names, model_dir, tmp_path):
    evaluates = any(k.startswith("eval_") for k in names)
    args = config_class(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        max_steps=1,
        eval_strategy="steps" if evaluates else "no",
        eval_steps=1,
        **CPU,
    )
    trainer = trainer_class(model=model_dir, args=args, train_dataset=data, eval_dataset=data if evaluates else None)
    trainer.train()
    # TRL's layout: the step's training row, its evaluation row, the end-of-training summary
    rows, ours = trainer.state.log_history, trainer.history[-1]
    last, evaluation = (rows[-3], rows[-2]) if evaluates else (rows[-2], None)
    for trl, rlhfkit in names.items():
        assert (evaluation if trl.startswith("eval_") else last)[trl] == ours[rlhfkit], trl
    assert last["step"] == trainer.state.global_step == 1 and "eval_loss" not in last
    if evaluates:
        assert evaluation["step"] == 1 and evaluation["eval_runtime"] > 0 and "loss" not in evaluation
    summary = rows[-1]  # what TRL's training tests read first
    assert summary["step"] == 1 and summary["epoch"] == last["epoch"] and math.isfinite(summary["train_loss"])


class RecordsLikeTRL:
    """A TRL-style callback: reads the logs and state by TRL's names, as under TRL's Trainer."""

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append((type(args).__name__, state.global_step, logs["reward"], state.log_history[-1]["reward"]))


def test_a_trl_callback_sees_trls_names_args_and_steps(model_dir, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=2,
        max_completion_length=8,
        max_steps=4,
        **CPU,
    )
    callback = RecordsLikeTRL()
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=reward_len,
        args=args,
        callbacks=[callback],
        train_dataset=[{"prompt": p} for p in ["abc", "hello", "xyz", "qq"]],
    )
    trainer.train()
    assert callback.seen == [
        ("GRPOConfig", 2 * row["step"], row["reward/mean"], row["reward/mean"]) for row in trainer.history
    ]


@pytest.mark.parametrize("logging_steps, in_summary", [(10, True), (1, False)])
def test_the_summary_row_holds_the_metrics_of_steps_not_logged_yet(logging_steps, in_summary, model_dir, tmp_path):
    """TRL's log() adds its trainer metrics averaged since the last training row to every row it writes, the
    end-of-training summary too: 2 steps under logging_steps=10 leave them to the summary (TRL's prompt-tuning
    tests read log_history[-1]['mean_token_accuracy']); with every step logged the window is empty."""
    rows = [{"prompt": "ab", "completion": "cd"}, {"prompt": "x", "completion": "yz"}]
    args = SFTConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1, max_steps=2,
                     **{**CPU, "logging_steps": logging_steps})  # fmt: skip
    trainer = SFTTrainer(model=model_dir, args=args, train_dataset=rows)
    trainer.train()
    summary, steps = trainer.state.log_history[-1], trainer.history
    assert "train_loss" in summary and "loss" not in summary
    if in_summary:
        expected = sum(r["sft/token_accuracy"] for r in steps) / 2
        assert summary["mean_token_accuracy"] == pytest.approx(expected) and "entropy" in summary
    else:
        assert "mean_token_accuracy" not in summary
