"""The name tables the command line's "did you mean" reads (rlhfkit/config/trl_names.py) say what
the drop-in configs do: each TRL field listed there sets the rlhfkit field it names, through
``to_rlhfkit``. A table entry without a sample here fails, so no entry goes unchecked."""

import pytest

from rlhfkit.config.trl_names import DPO_NAMES, RL_NAMES, SUPERVISED_NAMES, rlhfkit_field
from rlhfkit.trl import DPOConfig, GRPOConfig, RLOOConfig, SFTConfig

BASE = dict(
    output_dir="out", bf16=False, report_to="none", max_steps=10, disable_tqdm=False
)  # its default follows the log level


def training_arguments(cls) -> dict:
    """Samples of the TrainingArguments renames every drop-in shares (config/trl_names.py), for ``cls``."""
    return {
        "lr_scheduler_type": (cls, dict(lr_scheduler_type="cosine"), "hf_cosine"),
        "resume_from_checkpoint": (cls, dict(resume_from_checkpoint="out/checkpoint-2"), "out/checkpoint-2"),
        "use_cpu": (cls, dict(use_cpu=True), "cpu"),
        "disable_tqdm": (cls, dict(disable_tqdm=True), False),
        "bf16": (cls, dict(bf16=True, use_cpu=True), "bfloat16"),
        "fp16": (cls, dict(fp16=True, use_cpu=True), "float16"),
        "model_init_kwargs": (cls, dict(model_init_kwargs={"dtype": "bfloat16"}), "bfloat16"),
    }


# TRL name -> (TRL config, its fields, the rlhfkit field's value); the field is the table's
RL_SAMPLES = {
    "num_generations": (GRPOConfig, dict(num_generations=4), 4),
    "max_completion_length": (GRPOConfig, dict(max_completion_length=64), 64),
    "beta": (GRPOConfig, dict(beta=0.05, use_bias_correction_kl=False), 0.05),
    "epsilon": (GRPOConfig, dict(epsilon=0.3), 0.3),
    "epsilon_high": (GRPOConfig, dict(epsilon_high=0.28), 0.28),
    "generation_batch_size": (GRPOConfig, dict(generation_batch_size=16), 2),
    "per_device_train_batch_size": (GRPOConfig, dict(per_device_train_batch_size=4, num_generations=4), 4),
    "gradient_accumulation_steps": (GRPOConfig, dict(gradient_accumulation_steps=2), 16),
    "logging_steps": (GRPOConfig, dict(logging_steps=3), 3),
    "eval_steps": (GRPOConfig, dict(eval_steps=4, eval_strategy="steps"), 4),
    "use_vllm": (GRPOConfig, dict(use_vllm=True), "vllm"),
    "vllm_enable_sleep_mode": (GRPOConfig, dict(use_vllm=True, vllm_enable_sleep_mode=True), True),
    "scale_rewards": (GRPOConfig, dict(scale_rewards="none"), "group_no_std"),
    "loss_type": (GRPOConfig, dict(loss_type="grpo"), "seq-mean-token-mean"),
    "vllm_importance_sampling_mode": (
        GRPOConfig,
        dict(vllm_importance_sampling_mode="token_truncate"),
        "token_truncate",
    ),
    "vllm_importance_sampling_clip_max": (GRPOConfig, dict(vllm_importance_sampling_clip_max=5.0), 5.0),
    "vllm_importance_sampling_clip_min": (GRPOConfig, dict(vllm_importance_sampling_clip_min=0.5), 0.5),
    "reward_clip_range": (RLOOConfig, dict(reward_clip_range=(-2.0, 2.0)), 2.0),
}
SUPERVISED_SAMPLES = {
    "per_device_train_batch_size": (SFTConfig, dict(per_device_train_batch_size=4), 4),
    "gradient_accumulation_steps": (SFTConfig, dict(gradient_accumulation_steps=2), 2),
    "num_train_epochs": (SFTConfig, dict(num_train_epochs=2.0, max_steps=-1), 2.0),
    "logging_steps": (SFTConfig, dict(logging_steps=3), 3),
    "eval_steps": (SFTConfig, dict(eval_steps=4, eval_strategy="steps"), 4),
}
RL_SAMPLES.update(training_arguments(GRPOConfig))
SUPERVISED_SAMPLES.update(training_arguments(SFTConfig))
DPO_SAMPLES = {"precompute_ref_log_probs": (DPOConfig, dict(precompute_ref_log_probs=True), True)}

CASES = [
    (table, samples, name)
    for table, samples in ((RL_NAMES, RL_SAMPLES), (SUPERVISED_NAMES, SUPERVISED_SAMPLES), (DPO_NAMES, DPO_SAMPLES))
    for name in table
]


@pytest.mark.parametrize("table, samples, name", CASES, ids=[f"{len(t)}-{n}" for t, _, n in CASES])
def test_each_renamed_trl_field_sets_the_rlhfkit_field_the_table_names(table, samples, name):
    assert name in samples, f"no sample for the table's entry {name!r}: add one"
    config_class, fields, expected = samples[name]
    field = rlhfkit_field(table[name])
    try:
        config = config_class(**{**BASE, **fields})
    except ValueError as e:  # e.g. transformers refuses fp16 on a machine without a GPU
        pytest.skip(f"{config_class.__name__}({fields}) is refused here: {e}")
    ours = config.to_rlhfkit(n_rows=100)
    assert getattr(ours, field) == expected
    default = config_class(**BASE).to_rlhfkit(n_rows=100)
    assert getattr(default, field) != expected  # the sample moved the field: the TRL field sets it
