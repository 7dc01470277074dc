"""Every TRL 1.16 GRPOConfig loss_type, scale_rewards and delta maps to the algorithm core's formula
(rlhfkit/trl/grpo.py: LOSS_TYPES) and trains; refusals name the field in one line."""

import pytest

from rlhfkit.tasks.tiny import save_tiny_model
from rlhfkit.trl import GRPOConfig, GRPOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none")


def config(**changes):
    return GRPOConfig(output_dir="out", per_device_train_batch_size=4, num_generations=4, **{**CPU, **changes})


@pytest.mark.parametrize(
    "loss_type, policy_loss, loss_agg, options",
    [
        ("grpo", "ppo_clip", "seq-mean-token-mean", {}),
        ("bnpo", "ppo_clip", "micro-batch-token-mean", {}),
        ("dapo", "ppo_clip", "token-mean", {}),
        ("dr_grpo", "ppo_clip", "seq-mean-token-sum-norm", {}),
        ("luspo", "ppo_clip", "seq-mean-token-sum", {}),
        ("cispo", "cispo", "token-mean", {}),
        ("sapo", "sapo", "seq-mean-token-mean", {"temperature_pos": 1.0, "temperature_neg": 1.05}),
        ("vespo", "vespo", "token-mean", {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}),
    ],
)
def test_each_loss_type_is_the_core_formula(loss_type, policy_loss, loss_agg, options):
    native = config(loss_type=loss_type).to_rlhfkit(n_rows=8)
    assert (native.policy_loss, native.loss_agg, dict(native.loss_options)) == (policy_loss, loss_agg, options)


def test_trls_knobs_reach_the_losses():
    sapo = config(loss_type="sapo", sapo_temperature_pos=0.5, sapo_temperature_neg=2.0).to_rlhfkit(n_rows=8)
    assert sapo.loss_options == {"temperature_pos": 0.5, "temperature_neg": 2.0}
    vespo = config(loss_type="vespo", vespo_k_neg=1.5, importance_sampling_level="sequence").to_rlhfkit(n_rows=8)
    assert vespo.loss_options["k_neg"] == 1.5 and vespo.importance_sampling_level == "token"  # VESPO's own ratio


def test_scale_rewards_and_delta():
    assert config(scale_rewards="batch").to_rlhfkit(n_rows=8).advantage_estimator == "group_batch_std"
    assert config(scale_rewards=False).to_rlhfkit(n_rows=8).advantage_estimator == "group_no_std"
    assert config(delta=2.0).to_rlhfkit(n_rows=8).dual_clip == 2.0  # INTELLECT-2's two-sided clip
    for bad, says in [(dict(delta=1.1), r"below 1 \+ epsilon_high"), (dict(delta=2.0, loss_type="sapo"), "clipped")]:
        with pytest.raises(ValueError, match=says) as err:
            config(**bad).to_rlhfkit(n_rows=8)
        assert "'delta'" in str(err.value) and "\n" not in str(err.value)


def test_a_trl_refusal_comes_when_the_trainer_is_built_as_trls_own():
    """TRL's tests build the config first, then expect the trainer to refuse: rlhfkit refuses a TRL
    field it does not support there too (``check_supported``), TrainingArguments' own at once."""
    args = config(off_policy_mask_threshold=0.5, use_liger_kernel=True)  # built
    with pytest.raises(ValueError, match="use_liger_kernel.*lm_head"):
        args.to_rlhfkit(n_rows=8)
    with pytest.raises(ValueError, match="'torch_compile'"):
        config(torch_compile=True)


@pytest.mark.parametrize("loss_type", ["bnpo", "luspo", "sapo", "vespo"])
def test_the_new_loss_types_train(loss_type, tmp_path):
    model = save_tiny_model(tmp_path / "model", seed=0)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, num_generations=3, max_completion_length=6,
        gradient_accumulation_steps=2, max_steps=1, learning_rate=0.1, loss_type=loss_type,
        importance_sampling_level="sequence" if loss_type == "luspo" else "token", **CPU,
    )  # fmt: skip
    trainer = GRPOTrainer(model, lambda completions, **kw: [float(len(set(c))) for c in completions], args, [
        {"prompt": p} for p in ["abc", "hello", "xyz", "qq"]
    ])  # fmt: skip
    before = {n: p.clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert any(not (p == before[n]).all() for n, p in trainer.model.named_parameters())


def test_rloo_is_trls_clipped_sequence_ratio(tmp_path):
    """TRL's RLOO loss: PPO's clip on each completion's probability ratio, one loss per completion;
    normalize_advantages standardises the leave-one-out advantages; several iterations train."""
    from rlhfkit.trl import RLOOConfig, RLOOTrainer

    native = RLOOConfig(output_dir="out", per_device_train_batch_size=4, **CPU).to_rlhfkit(n_rows=8)
    assert (native.policy_loss, native.importance_sampling_level, native.loss_agg) == (
        "ppo_clip", "sequence_sum", "seq-mean-token-mean",
    )  # fmt: skip
    assert native.advantage_estimator == "rloo" and native.kl_in_reward and native.clip_low == 0.2
    model = save_tiny_model(tmp_path / "model", seed=0)
    args = RLOOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, num_generations=3, max_completion_length=6,
        num_iterations=2, normalize_advantages=True, max_steps=2, learning_rate=0.1, **CPU,
    )  # fmt: skip
    trainer = RLOOTrainer(model, lambda completions, **kw: [float(len(set(c))) for c in completions], args, [
        {"prompt": p} for p in ["abc", "hello", "xyz", "qq"]
    ])  # fmt: skip
    assert trainer.config.advantage_estimator == "rloo_standardized" and trainer.config.num_iterations == 2
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.state.log_history[-1]["train_loss"] is not None


def test_the_token_filters_are_translated():
    native = config(top_entropy_quantile=0.2, off_policy_mask_threshold=0.5).to_rlhfkit(n_rows=8)
    assert native.top_entropy_quantile == 0.2 and native.off_policy_mask_threshold == 0.5
    with pytest.raises(ValueError, match="policy_loss") as err:  # VESPO folds its weights into its ratio
        config(loss_type="vespo", top_entropy_quantile=0.2).to_rlhfkit(n_rows=8)
    assert "\n" not in str(err.value)


def test_adaptive_entropy_as_trls_test_counts_it(tmp_path):
    """TRL's own check: the entropy always below the target, the coefficient rises once per optimizer
    step (here 2 micro-steps each), entropy_coef and policy_loss logged."""
    model = save_tiny_model(tmp_path / "model", seed=0)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, num_generations=3, max_completion_length=6,
        gradient_accumulation_steps=2, max_steps=2, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0,
        entropy_coef_delta=0.005, logging_steps=1, **CPU,
    )  # fmt: skip
    trainer = GRPOTrainer(model, lambda completions, **kw: [float(len(set(c))) for c in completions], args, [
        {"prompt": p} for p in ["abc", "hello", "xyz", "qq"]
    ])  # fmt: skip
    trainer.train()
    assert trainer.entropy_coef == pytest.approx(min(0.01 + 0.005 * trainer.state.global_step, 1.0), abs=1e-6)
    last = trainer.state.log_history[-2]  # the last training row (then the summary)
    assert last["entropy_coef"] == pytest.approx(trainer.entropy_coef) and "policy_loss" in last


def test_sampling_settings_reach_the_sampler():
    native = config(top_p=0.9, top_k=10, min_p=0.01, repetition_penalty=1.1).to_rlhfkit(n_rows=8)
    assert (native.top_p, native.top_k, native.min_p, native.repetition_penalty) == (0.9, 10, 0.01, 1.1)
    assert config().to_rlhfkit(n_rows=8).min_p == 0.0  # TRL's None: off
    with pytest.raises(ValueError, match="'generation_kwargs'"):  # beam search and generate's other settings
        config(generation_kwargs={"num_beams": 2}).to_rlhfkit(n_rows=8)


def test_gdpo_is_translated_and_refused_beside_the_sums_shaping():
    native = config(multi_objective_aggregation="normalize_then_sum").to_rlhfkit(n_rows=8)
    assert native.reward_aggregation == "normalize_then_sum" and native.advantage_estimator == "batch_standardized"
    from rlhfkit.config import RLConfig

    with pytest.raises(ValueError, match="reward_aggregation") as err:
        RLConfig(reward_aggregation="normalize_then_sum", missing_eos_penalty=-1.0)
    assert "\n" not in str(err.value)


def test_adaptive_entropy_bounds_are_checked():
    from rlhfkit.config import RLConfig

    with pytest.raises(ValueError, match="entropy_coef_min") as err:
        RLConfig(use_adaptive_entropy=True, entropy_coef_min=0.5, entropy_coef_max=0.1)
    assert "\n" not in str(err.value)
