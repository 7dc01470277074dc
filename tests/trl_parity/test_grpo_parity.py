"""GRPOTrainer and RLOOTrainer: rlhfkit's drop-in classes against TRL 1.16 itself, two optimizer
steps from the same weights, completions and config (``harness.trl_run`` / ``ours_run``):
the same weights after it, to float tolerance. Every ``loss_type`` with each of the settings that
change the loss's normaliser or terms; the sampling correction's formula for each mode; the step
count of ``num_train_epochs``."""

import pytest
from harness import TOLERANCE, dataset, fraction_of_a, ours_run, start_weights, trl_run, update_difference

LOSS_TYPES = ["dapo", "grpo", "dr_grpo", "cispo"]
# Two optimizer steps, each one generation (another epoch of the same 2 prompts) of two accumulated
# micro-steps; a micro-batch is one prompt's group on both sides.
TWO_STEPS = dict(per_device_train_batch_size=4, num_generations=4, gradient_accumulation_steps=2, max_steps=2)
SETTINGS = {
    "one micro-step a step": dict(TWO_STEPS, per_device_train_batch_size=8, gradient_accumulation_steps=1),
    "2 accumulated micro-steps": TWO_STEPS,
    "entropy bonus": dict(TWO_STEPS, entropy_coef=0.5),
    "truncated rows masked": dict(TWO_STEPS, mask_truncated_completions=True),
    "unscored rows": dict(TWO_STEPS, unscored=True),
    "2 iterations": dict(TWO_STEPS, num_iterations=2, max_steps=4),
    "beta > 0": dict(TWO_STEPS, beta=0.5, use_bias_correction_kl=False),
}


def length_tenths(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def unscored_fraction_of_a(completions, **kwargs):
    """The length, but no score (None) for the short completions ending in 'b', as a reward function
    that cannot judge them (a group's scored completions still differ)."""
    return [None if c.endswith("b") and len(c) <= 3 else len(c) / 10 for c in completions]


def compare(model_dir, tmp_path, kwargs, trainer_class="GRPO", use_vllm=False):
    kwargs = dict(kwargs)
    reward = unscored_fraction_of_a if kwargs.pop("unscored", False) else fraction_of_a
    if kwargs.pop("two_rewards", False):  # another scale: what GDPO's per-function normalisation is for
        reward = [reward, length_tenths]
    data = dataset(kwargs)
    start = start_weights(model_dir)
    theirs, trl_trainer = trl_run(
        model_dir, kwargs, str(tmp_path / "trl"), reward, data, trainer_class=trainer_class, use_vllm=use_vllm
    )
    ours, our_trainer = ours_run(
        model_dir, kwargs, str(tmp_path / "ours"), reward, data, trainer_class=trainer_class, use_vllm=use_vllm
    )
    assert our_trainer.state.global_step == trl_trainer.state.global_step == kwargs["max_steps"]
    return update_difference(start, theirs, ours)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_step_is_trls(model_dir, tmp_path, loss_type, setting):
    diff = compare(model_dir, tmp_path, dict(SETTINGS[setting], loss_type=loss_type))
    print(f"DIFF {loss_type} {setting}: {diff:.2e}")
    assert diff < TOLERANCE


@pytest.mark.parametrize(
    "mode, bounds",
    [
        ("token_truncate", {}),
        ("token_mask", {}),
        ("sequence_truncate", {}),
        ("sequence_mask", {}),
        ("token_mask", dict(vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=None)),
        ("sequence_truncate", dict(vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=None)),
    ],
)
def test_the_sampling_correction_is_trls(model_dir, tmp_path, mode, bounds):
    """``use_vllm=True``: the engine's log-probs (the model's own, shifted by up to ±1.5 per token)
    weigh each token's or sequence's loss by TRL's formula: capped at clip_max (default 3) and floored
    at clip_min (default none) for the truncate modes; zeroed outside [clip_min, clip_max] for the
    mask modes, the zeroed tokens kept in the normaliser."""
    kwargs = dict(TWO_STEPS, vllm_importance_sampling_mode=mode, **bounds)
    assert compare(model_dir, tmp_path, kwargs, use_vllm=True) < TOLERANCE


@pytest.mark.parametrize("setting", ["2 accumulated micro-steps", "2 iterations", "entropy bonus"])
@pytest.mark.parametrize("loss_type", ["bnpo", "luspo", "sapo", "vespo"])
def test_the_other_loss_types_step_as_trls(model_dir, tmp_path, loss_type, setting):
    """bnpo (each micro-batch's token mean), luspo (with TRL's recommended sequence-level ratio),
    sapo's soft gate and vespo's Gamma-weighted sequence ratio: off policy with 2 iterations too."""
    level = "sequence" if loss_type == "luspo" else "token"
    diff = compare(model_dir, tmp_path, dict(SETTINGS[setting], loss_type=loss_type, importance_sampling_level=level))
    print(f"DIFF {loss_type} {setting}: {diff:.2e}")
    assert diff < TOLERANCE


@pytest.mark.parametrize(
    "extra",
    [
        dict(top_entropy_quantile=0.5),
        dict(top_entropy_quantile=0.5, entropy_coef=0.5),
        dict(off_policy_mask_threshold=1e-4, num_iterations=2, max_steps=4),
        dict(entropy_coef=0.5, use_adaptive_entropy=True, entropy_target=15.0, entropy_coef_delta=0.2, max_steps=4),
    ],
    ids=["entropy filter", "entropy filter and bonus", "off-policy mask", "adaptive entropy"],
)
@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_the_token_filters_are_trls(model_dir, tmp_path, loss_type, extra):
    """top_entropy_quantile (the policy loss and the bonus on each micro-batch's high-entropy tokens),
    off_policy_mask_threshold (negative-advantage sequences that drifted away dropped) and the adaptive
    entropy coefficient (no bonus on the first step, then raised each optimizer step)."""
    diff = compare(model_dir, tmp_path, dict(TWO_STEPS, loss_type=loss_type, **extra))
    print(f"DIFF {loss_type} {extra}: {diff:.2e}")
    assert diff < TOLERANCE


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_two_reward_functions_combine_as_trls(model_dir, tmp_path, aggregation):
    """Two reward functions of different scales, weighted: summed then normalised, or GDPO's each
    normalised in its group, then summed and standardised over the batch."""
    kwargs = dict(TWO_STEPS, two_rewards=True, reward_weights=[0.7, 0.3], multi_objective_aggregation=aggregation)
    diff = compare(model_dir, tmp_path, kwargs)
    print(f"DIFF {aggregation}: {diff:.2e}")
    assert diff < TOLERANCE


@pytest.mark.parametrize("extra", [dict(num_iterations=2, max_steps=4), dict(normalize_advantages=True)])
def test_rloo_clips_its_sequence_ratio_and_normalises_as_trl(model_dir, tmp_path, extra):
    """TRL's RLOO off policy (2 iterations: PPO's clip on exp(sum of log-ratios)) and with
    normalize_advantages (the leave-one-out advantages standardised over the batch)."""
    diff = compare(model_dir, tmp_path, dict(TWO_STEPS, beta=0.0, **extra), trainer_class="RLOO")
    print(f"DIFF rloo {extra}: {diff:.2e}")
    assert diff < TOLERANCE


def test_rloo_step_is_trls_with_unscored_and_masked_truncated_rows(model_dir, tmp_path):
    kwargs = dict(TWO_STEPS, beta=0.0, unscored=True, mask_truncated_completions=True)
    assert compare(model_dir, tmp_path, kwargs, trainer_class="RLOO") < TOLERANCE


@pytest.mark.parametrize("epochs", [1, 3])
def test_epochs_take_trls_optimizer_steps(model_dir, tmp_path, epochs):
    """10 prompts, 4 per generation (one optimizer step each): TRL drops each epoch's incomplete last
    generation (2 steps an epoch, not 3)."""
    kwargs = dict(per_device_train_batch_size=8, num_generations=2, num_train_epochs=epochs)
    data = dataset(kwargs, 10)
    _, trl_trainer = trl_run(model_dir, kwargs, str(tmp_path / "trl"), fraction_of_a, data)
    _, our_trainer = ours_run(model_dir, kwargs, str(tmp_path / "ours"), fraction_of_a, data)
    assert our_trainer.state.global_step == trl_trainer.state.global_step == 2 * epochs
