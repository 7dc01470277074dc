"""TRL 1.16's field names and rlhfkit's for the same setting: the drop-in configs' renames
(``rlhfkit/trl/``: ``GRPOConfig.to_rlhfkit`` and the others set each rlhfkit field named here from
its TRL field; ``tests/trl/test_trl_names.py`` checks every entry against them), read by the
command line's "did you mean" (``io.load_config``): ``num_generations=8`` is answered with
"'num_generations' is TRL's name: rlhfkit's is group_size".

Plain data in the config layer, so that the config files' parser can read it without importing the
drop-in (``rlhfkit.trl``, a layer above). Each value is how rlhfkit spells the setting: a field, a
``field=value``, and after it, in brackets, what differs in unit or meaning. Only renames are here:
a TRL field of the same name as rlhfkit's (``max_steps``, ``num_iterations``, ``temperature``) is no
unknown key, and one without a counterpart is not listed (docs/guides/trl.md: "What is refused").
"""

from __future__ import annotations

# TrainingArguments fields every drop-in translates alike
_TRAINING_ARGUMENTS = {
    "lr_scheduler_type": "lr_scheduler (linear: hf_linear, cosine: hf_cosine, constant: hf_constant)",
    "resume_from_checkpoint": "resume_from",
    "use_cpu": "device=cpu",
    "disable_tqdm": "progress_bar=false",
    "bf16": "autocast=bfloat16",
    "fp16": "autocast=float16",
    "model_init_kwargs": "dtype (model_init_kwargs={'dtype': ...})",
}

# GRPOConfig / RLOOConfig -> RLConfig
RL_NAMES = {
    "num_generations": "group_size",
    "max_completion_length": "max_new_tokens",
    "beta": "kl_coef",
    "epsilon": "clip_low",
    "epsilon_high": "clip_high",
    "generation_batch_size": "prompts_per_step (= generation_batch_size / num_generations)",
    "per_device_train_batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "mini_batch_size (completions per optimizer step: per_device_train_batch_size "
    "x processes x gradient_accumulation_steps)",
    "logging_steps": "log_every (in RL steps, one generation each)",
    "eval_steps": "eval_every (in RL steps, one generation each)",
    "use_vllm": "rollout_engine=vllm",
    "vllm_enable_sleep_mode": "vllm_sleep",
    "scale_rewards": "advantage_estimator (group; none: group_no_std)",
    "loss_type": "loss_agg (dapo: token-mean, grpo: seq-mean-token-mean, dr_grpo: seq-mean-token-sum-norm)",
    "vllm_importance_sampling_mode": "rollout_is",
    "vllm_importance_sampling_clip_max": "rollout_is_threshold",
    "vllm_importance_sampling_clip_min": "rollout_is_threshold_low",
    "reward_clip_range": "reward_clip (c of TRL's (-c, c))",
    **_TRAINING_ARGUMENTS,
}

# SFTConfig / DPOConfig / RewardConfig -> rlhfkit's SFTConfig / DPOConfig / RewardModelConfig
SUPERVISED_NAMES = {
    "per_device_train_batch_size": "batch_size (rows per micro-step over all processes)",
    "gradient_accumulation_steps": "grad_accumulation",
    "num_train_epochs": "num_epochs",
    "logging_steps": "log_every",
    "eval_steps": "eval_every",
    **_TRAINING_ARGUMENTS,
}

DPO_NAMES = {"precompute_ref_log_probs": "precompute_ref_logprobs"}

# (table, a field only the configs it translates into have), the most specific first
TABLES = ((RL_NAMES, "group_size"), (DPO_NAMES, "precompute_ref_logprobs"), (SUPERVISED_NAMES, "grad_accumulation"))


def rlhfkit_field(spelling: str) -> str:
    """The field a table's value names: ``rollout_engine=vllm (...)`` -> ``rollout_engine``."""
    return spelling.split(" ", 1)[0].split("=", 1)[0]


def trl_names_of(fields) -> dict[str, list[str]]:
    """rlhfkit field -> the TRL names that set it, for a config of ``fields`` (its field names): the
    entries of every table that translates into such a config (``TABLES``' signature field is among
    ``fields``), each TRL name with what the table adds: the value it sets (``use_vllm
    (rollout_engine=vllm)``) or what differs (``logging_steps (in RL steps, one generation each)``);
    ``--help`` lists them under each field's doc."""
    names: dict[str, list[str]] = {}
    seen = set()
    for table, signature in TABLES:
        if signature not in fields:
            continue
        for trl, spelling in table.items():
            field = rlhfkit_field(spelling)
            if field in fields and trl not in seen:
                seen.add(trl)
                rest = spelling[len(field) :]  # "=vllm (...)" or " (= generation_batch_size / ...)" or ""
                names.setdefault(field, []).append(f"{trl} ({spelling})" if rest.startswith("=") else trl + rest)
    return names


def trl_name_hint(key: str, fields) -> str:
    """``" 'num_generations' is TRL's name: rlhfkit's is group_size."`` when ``key`` is a TRL field
    name that one of ``TABLES`` renames to a field among ``fields`` (a config's field names), else
    ``""``."""
    for table, signature in TABLES:
        spelling = table.get(key)
        if spelling and signature in fields and rlhfkit_field(spelling) in fields:
            return f" {key!r} is TRL's name: rlhfkit's is {spelling}."
    return ""
