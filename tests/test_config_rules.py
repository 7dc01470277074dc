"""Config rules: every numeric field range-checked (table-driven), the preset rule (a value the
user set always wins), KL estimators that cannot go in the loss refused, estimator needs read from
the registry."""

from __future__ import annotations

import dataclasses
import math

import pytest

from rlhfkit.algorithms import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS
from rlhfkit.config import PRESETS, RANGES, RLConfig
from rlhfkit.jobs import DPOJob, KTOJob, RLJob, RMJob, SFTJob
from rlhfkit.rollout import SamplingParams
from rlhfkit.trainers import DPOConfig, KTOConfig, RewardModelConfig, SFTConfig

# field: (values that must be refused, a value that must be accepted); counts refuse values past
# their upper bound (a run of 99999999999999999999 steps would run forever)
TABLE = {
    "prompts_per_step": ([0, -1, 1.5, 10**6 + 1], 1),
    "group_size": ([0, 10**6 + 1], 2),
    "max_new_tokens": ([0, 10**7 + 1], 1),
    "max_prompt_length": ([0, 10**7 + 1], 1),
    "temperature": ([0.0, -1.0, math.nan], 0.7),
    "top_p": ([0.0, 1.5], 0.9),
    "top_k": ([-1, 10**7 + 1], 0),
    "min_p": ([-0.1, 1.5], 0.05),
    "repetition_penalty": ([0.0, -1.0], 1.1),
    "loss_horizon": ([0, 10**7 + 1], 8),
    "kl_coef": ([-0.1, math.nan], 0.0),
    "kl_target": ([0.0], 1.0),
    "kl_horizon": ([0.0], 100.0),
    "top_entropy_quantile": ([-0.1, 1.5], 0.2),
    "entropy_target": ([-1.0], 0.5),
    "entropy_coef_delta": ([-0.1], 0.01),
    "entropy_coef_min": ([-0.1], 0.0),
    "entropy_coef_max": ([-0.1], 0.5),
    "off_policy_mask_threshold": ([0.0, -1.0], 0.5),
    "clip_low": ([0.0, 1.0, 1.5], 0.1),
    "clip_high": ([0.0, -0.2, -1.0], 0.28),
    "dual_clip": ([1.0, 0.5], 3.0),
    "value_clip": ([0.0], 0.5),
    "vf_coef": ([-1.0], 0.0),
    "entropy_coef": ([-0.01], 0.01),
    "gamma": ([1.5, -0.1], 0.99),
    "lam": ([-0.1, 1.01], 1.0),
    "advantage_epsilon": ([0.0, -1e-6, 2.0], 1e-4),
    "num_iterations": ([0, 10**4 + 1], 2),
    "missing_eos_penalty": ([math.inf, math.nan, 1e39, -1e7], -1.0),
    "reward_clip": ([0.0], 5.0),
    "learning_rate": ([0.0, -1e-5], 1e-4),
    "critic_learning_rate": ([0.0], 1e-4),
    "weight_decay": ([-0.1], 0.01),
    "max_grad_norm": ([0.0], 0.5),
    "warmup_steps": ([-1, 10**9 + 1], 5),
    "mini_batch_size": ([0, 10**6 + 1], 1),
    "max_tokens_per_micro_batch": ([0, -1, 1.5, 10**9 + 1, "automatic"], 4096),
    "micro_batch_size": ([0, 10**6 + 1], 1),
    "grad_accumulation": ([0, 10**6 + 1], 2),
    "max_steps": ([-1, 99999999999999999999], 0),
    "seed": ([-1, 2**31], 3),
    "save_steps": ([-1, 10**9 + 1], 10),
    "save_total_limit": ([0, 10**9 + 1], 1),
    "log_every": ([-1, 10**9 + 1], 0),
    "num_logged_samples": ([-1, 10**6 + 1], 0),
    "eval_every": ([-1, 10**9 + 1], 5),
    "eval_max_new_tokens": ([0, 10**7 + 1], 4),
    "num_epochs": ([0.0, -1.0, 1e300], 0.5),
    "batch_size": ([0, 10**6 + 1], 2),
    "max_length": ([1, 10**7 + 1], 2),
    "lora_r": ([-1, 10**5 + 1], 8),
    "lora_alpha": ([0, 10**6 + 1], 32),
    "vllm_kv_cache_gb": ([0.0, -1.0, math.inf], 0.5),
    "memory_budget_gb": ([0.0, -1.0, math.inf], 24.0),
    "vllm_gpu_memory_utilization": ([0.0, 1.5], 0.5),
    "vllm_tensor_parallel_size": ([0, 1025], 1),
    "rollout_is_threshold": ([1.0, 0.5, math.nan], 3.0),
    "rollout_is_threshold_low": ([-0.1, math.inf], 0.5),
    "beta": ([0.0, -0.1, math.inf], 0.5),
    "label_smoothing": ([-0.1, 0.5, math.nan], 0.0),
    "simpo_gamma": ([math.inf, math.nan], 1.0),
    "discopop_tau": ([0.0, -0.1, math.nan], 0.1),
    "f_alpha_divergence_coef": ([math.inf, math.nan], 0.3),
    "ld_alpha": ([-0.1, 1.5, math.nan], 0.5),
    "ref_model_mixup_alpha": ([0.0, 1.5, math.nan], 0.5),
    "ref_model_sync_steps": ([0, -1, 10**9 + 1], 4),
    "lora_dropout": ([-0.1, 1.0], 0.05),
    "max_consecutive_skips": ([0, -1, 10**9 + 1], 5),
    "overlong_buffer_len": ([0, -4, 10**7 + 1], 8),
    "overlong_penalty": ([-0.5, 1e6 + 1], 0.5),
    "max_sampling_rounds": ([0, -1, 2.5, 10**6 + 1], 3),
    "distillation_coef": ([-0.1, math.nan], 0.5),
    "distillation_beta": ([-0.1, 1.5], 0.5),
    "teacher_batch_size": ([0, 1000001], 4),
    "teacher_retries": ([-1, 101], 3),
    "teacher_timeout": ([0, -1.0, 1000001], 30.0),
    "center_rewards_coefficient": ([-0.01, math.inf], 0.01),
    "desirable_weight": ([-0.1, math.inf, math.nan], 1.33),
    "undesirable_weight": ([-0.1, math.inf, math.nan], 0.75),
    "max_tool_calling_iterations": ([-1, 1.5, 10**6 + 1], 0),
    "max_tool_response_tokens": ([0, -1, 2.5, 10**9 + 1], 1),
    "tool_call_timeout": ([0, -1, 10**6 + 1], 0.5),
    "rollout_workers": ([-1, 1.5, 10**6 + 1], 1),
    "max_staleness": ([-1, 0.5, 10**6 + 1], 2),
}
CONFIGS = [
    RLConfig,
    SFTConfig,
    RewardModelConfig,
    DPOConfig,
    KTOConfig,
    RLJob,
    SFTJob,
    RMJob,
    DPOJob,
    KTOJob,
    SamplingParams,
]


def _numeric_fields(cls):
    out = []
    for f in dataclasses.fields(cls):
        ann = str(f.type).replace(" ", "")
        if f.init and any(t in ann.split("|") for t in ("int", "float")):
            out.append(f.name)
    return out


def test_every_numeric_field_of_every_config_has_a_range_and_a_table_row():
    for cls in CONFIGS:
        for name in _numeric_fields(cls):
            assert name in RANGES, f"{cls.__name__}.{name} has no entry in config.RANGES"
            assert name in TABLE, f"{cls.__name__}.{name} has no row in this test's table"
    assert set(TABLE) == set(RANGES)


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_out_of_range_values_are_refused_with_one_line_naming_field_value_and_range(cls):
    for name in _numeric_fields(cls):
        bad_values, good = TABLE[name]
        cls(**{name: good})  # accepted
        for bad in bad_values + [True, "1"]:
            with pytest.raises(ValueError) as err:
                cls(**{name: bad})
            message = str(err.value)
            assert "\n" not in message and f"'{name}'" in message and repr(bad) in message, message
            spec = RANGES[name].removesuffix(" or None")
            assert spec in message, message


def test_none_only_where_the_field_admits_it():
    with pytest.raises(ValueError, match=r"'max_steps' must be an integer in \[0, 1e9\], got None"):
        RLConfig(max_steps=None)
    assert SFTConfig(max_steps=None).max_steps is None
    RLConfig(dual_clip=None, reward_clip=None)


def test_the_issue_examples_read_as_expected():
    with pytest.raises(ValueError, match=r"RLConfig: config field 'clip_low' must be in \(0, 1\), got 1.5"):
        RLConfig(clip_low=1.5)
    with pytest.raises(ValueError, match=r"config field 'top_p' must be in \(0, 1\], got 0"):
        RLConfig(top_p=0)
    with pytest.raises(ValueError, match=r"config field 'gamma' must be in \[0, 1\]"):
        RLConfig(gamma=2)


# ---- the preset rule ----


def test_the_issue_example_keeps_an_explicit_kl_coef():
    assert RLConfig(algorithm="ppo", kl_coef=0.05).replace(algorithm="grpo").kl_coef == 0.05


@pytest.mark.parametrize("old", list(PRESETS))
@pytest.mark.parametrize("new", list(PRESETS))
def test_presets_never_drop_an_explicit_setting(old, new):
    assert RLConfig(algorithm=old).replace(algorithm=new) == RLConfig(algorithm=new)  # unset: the new preset's
    for field, preset_value in PRESETS[old].items():
        # the explicit value equals the old preset's: the case the old rule mistook for "unset"
        try:
            switched = RLConfig(algorithm=old, **{field: preset_value}).replace(algorithm=new)
        except ValueError as err:  # the explicit value does not fit the new algorithm: said, not dropped
            assert f"'{field}'" in str(err) or "config field" in str(err)
            continue
        assert getattr(switched, field) == preset_value, (old, new, field)
        others = {k: v for k, v in PRESETS[new].items() if k != field}
        assert {k: getattr(switched, k) for k in others} == others  # the rest follows the new preset


def test_replacing_other_fields_keeps_the_preset_tracking():
    twice = RLConfig(algorithm="ppo").replace(learning_rate=1e-3).replace(algorithm="rloo")
    assert twice == RLConfig(algorithm="rloo", learning_rate=1e-3)


# ---- KL estimators in the loss ----


@pytest.mark.parametrize("estimator", ["k1", "abs"])
def test_kl_estimators_without_a_useful_gradient_are_refused_in_the_loss(estimator):
    with pytest.raises(ValueError) as err:
        RLConfig(kl_estimator=estimator, kl_in_reward=False)
    message = str(err.value)
    assert "\n" not in message and "'kl_estimator'" in message and "one of k2, k3" in message
    RLConfig(kl_estimator=estimator, kl_in_reward=True)  # in the reward it is fine
    RLConfig(kl_estimator=estimator, kl_in_reward=False, kl_coef=0.0)  # no penalty at all: nothing to refuse


def test_the_kl_estimator_docstring_names_each_gradients_divergence():
    from rlhfkit.config import field_docs

    doc = field_docs(RLConfig)["kl_estimator"]
    assert "k3" in doc and "KL(ref‖π)" in doc and "k2" in doc and "KL(π‖ref)" in doc
    assert KL_ESTIMATORS.traits("k3")["loss_gradient"] == "KL(ref‖π)"
    assert KL_ESTIMATORS.traits("k2")["loss_gradient"] == "KL(π‖ref)"


# ---- estimator needs live in the registry ----


def test_a_new_estimator_is_one_registry_entry_and_the_config_reads_its_needs():
    @ADVANTAGE_ESTIMATORS.register(
        "_test_groupwise", needs_groups=True, needs_values=False, gives_returns=False, sequence_level=True
    )
    def _est(token_rewards, response_mask, *, values=None, group_size=1, gamma=1.0, lam=1.0, reduce=None):
        return token_rewards, None

    try:
        with pytest.raises(ValueError, match="'group_size' must be >= 2 for the '_test_groupwise' estimator"):
            RLConfig(advantage_estimator="_test_groupwise", group_size=1)
        with pytest.raises(ValueError, match="gives the critic no returns"):
            RLConfig(advantage_estimator="_test_groupwise", use_critic=True)
        assert RLConfig(advantage_estimator="_test_groupwise").advantage_estimator == "_test_groupwise"
    finally:
        ADVANTAGE_ESTIMATORS._entries.pop("_test_groupwise")
        ADVANTAGE_ESTIMATORS._traits.pop("_test_groupwise")


def test_registry_traits_must_be_declared():
    with pytest.raises(ValueError, match="must declare the traits"):
        ADVANTAGE_ESTIMATORS.register("_incomplete", needs_groups=True)
    assert ADVANTAGE_ESTIMATORS.traits("gae") == dict(
        needs_groups=False, needs_values=True, gives_returns=True, sequence_level=False
    )


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_infinities_and_nan_are_refused_and_numpy_numbers_accepted(cls):
    import numpy as np

    for name in _numeric_fields(cls):
        for bad in (math.inf, -math.inf, math.nan):
            with pytest.raises(ValueError, match=f"'{name}'"):
                cls(**{name: bad})
        good = TABLE[name][1]
        cls(**{name: np.int64(good) if isinstance(good, int) else np.float64(good)})
    if "seed" in _numeric_fields(cls):  # an integer too large for a float is a range error, not OverflowError
        with pytest.raises(ValueError, match="'seed'"):
            cls(seed=-(10**400))


def test_a_saved_config_keeps_the_preset_rule_when_loaded_under_another_algorithm(tmp_path):
    from rlhfkit.config import load_config, save_config
    from rlhfkit.jobs import trainer_config

    path = save_config(RLConfig(kl_coef=0.04, max_steps=3), tmp_path / "config.yaml")
    loaded = load_config(RLConfig, path, ["algorithm=ppo"])  # `rlhfkit rl --config <run>/config.yaml algorithm=ppo`
    assert loaded == RLConfig(algorithm="ppo", kl_coef=0.04, max_steps=3)
    job = load_config(RLJob, path)
    assert trainer_config(job, RLConfig).replace(algorithm="rloo") == RLConfig(
        algorithm="rloo", kl_coef=0.04, max_steps=3
    )


@pytest.mark.parametrize(
    "field, value, names",
    [
        ("rollout_engine", "sglang", "hf, vllm"),
        ("rollout_is", "truncate", "none, token_truncate, token_mask, sequence_truncate, sequence_mask"),
    ],
)
def test_engine_and_rollout_correction_choices_are_checked(field, value, names):
    with pytest.raises(ValueError) as err:
        RLConfig(**{field: value})
    assert "\n" not in str(err.value) and repr(field) in str(err.value) and names in str(err.value)


# ---- the objectives of issue 21: GSPO, CISPO, DAPO ----


def test_the_new_presets_resolve_to_their_papers_settings():
    gspo, cispo, dapo = (RLConfig(algorithm=a) for a in ("gspo", "cispo", "dapo"))
    assert (
        gspo.policy_loss,
        gspo.importance_sampling_level,
        gspo.clip_low,
        gspo.clip_high,
        gspo.loss_agg,
        gspo.kl_coef,
        gspo.advantage_estimator,
    ) == ("ppo_clip", "sequence", 3e-4, 4e-4, "seq-mean-token-mean", 0.0, "group")
    assert (
        cispo.policy_loss,
        cispo.importance_sampling_level,
        cispo.clip_high,
        cispo.loss_agg,
        cispo.kl_coef,
        cispo.advantage_estimator,
    ) == ("cispo", "token", 4.0, "token-mean", 0.0, "group")
    assert (
        dapo.policy_loss,
        dapo.clip_low,
        dapo.clip_high,
        dapo.loss_agg,
        dapo.kl_coef,
        dapo.dynamic_sampling,
        dapo.overlong_buffer_len,
        dapo.advantage_estimator,
    ) == ("ppo_clip", 0.2, 0.28, "token-mean", 0.0, True, None, "group")
    for name in ("ppo", "grpo", "dr_grpo", "reinforce", "rloo", "reinforce_plus_plus"):  # unchanged
        c = RLConfig(algorithm=name)
        assert (c.clip_low, c.clip_high, c.importance_sampling_level, c.dynamic_sampling) == (0.2, 0.2, "token", False)
    assert RLConfig(algorithm="grpo", importance_sampling_level="sequence").importance_sampling_level == "sequence"


@pytest.mark.parametrize(
    "changes, field, expected",
    [
        (dict(importance_sampling_level="seq"), "importance_sampling_level", "one of token, sequence, sequence_token"),
        (
            dict(algorithm="rloo", importance_sampling_level="sequence"),
            "importance_sampling_level",
            "'token' with the 'vanilla' policy loss",
        ),
        (dict(overlong_buffer_len=32, max_new_tokens=32), "overlong_buffer_len", "less than max_new_tokens (32)"),
        (dict(overlong_buffer_len=-4), "overlong_buffer_len", "in [1, 1e7] or None"),
        (dict(max_sampling_rounds=0), "max_sampling_rounds", "in [1, 1e6]"),
        (dict(distillation_mode="sampled"), "distillation_mode", "one of token, full"),
        (dict(teacher_model="t", algorithm="grpo"), "distillation_coef", "> 0 with a teacher_model"),
        (dict(algorithm="ppo", dynamic_sampling=True), "dynamic_sampling", "False when group_size is 1"),
        (dict(overlong_penalty=-1.0), "overlong_penalty", "in [0, 1e6]"),
    ],
)
def test_the_objectives_fields_are_checked_with_one_line_naming_the_field(changes, field, expected):
    with pytest.raises(ValueError) as err:
        RLConfig(**changes)
    message = str(err.value)
    assert "\n" not in message and f"config field {field!r} must be {expected}" in message, message


def test_the_objectives_fields_accept_good_values():
    c = RLConfig(
        algorithm="dapo",
        overlong_buffer_len=8,
        overlong_penalty=0.5,
        max_sampling_rounds=3,
        mask_truncated_completions=True,
    )
    assert (c.overlong_buffer_len, c.overlong_penalty, c.max_sampling_rounds, c.mask_truncated_completions) == (
        8,
        0.5,
        3,
        True,
    )
    assert RLConfig(algorithm="cispo", importance_sampling_level="sequence_token").policy_loss == "cispo"


@pytest.mark.parametrize("name", ["vespo", "rlhfkit.algorithms.loss_registry:_vespo"])
def test_a_loss_that_weighs_its_tokens_itself_takes_no_token_filter_by_name_or_by_path(name):
    # the rule reads the registration (applies_correction), not the name: the path to VESPO's function is VESPO
    for filters in (dict(top_entropy_quantile=0.5), dict(off_policy_mask_threshold=0.5)):
        with pytest.raises(ValueError, match="'policy_loss' must be a loss the framework weighs by the correction"):
            RLConfig(policy_loss=name, **filters)
    assert RLConfig(policy_loss=name).policy_loss == name
