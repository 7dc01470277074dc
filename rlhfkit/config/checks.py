"""The allowed values of every config field and the checks that enforce them at construction:
``RANGES`` (every numeric field, by name), ``check_ranges``, ``check_fields`` (choices and rules),
``check_run_fields`` (the fields every trainer shares). ``rlhfkit.config`` re-exports them."""

from __future__ import annotations

import dataclasses
import math
import numbers

from .base import CHECKPOINTING_MODES

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")

# Allowed values of every numeric field of every config, by field name (one meaning per name
# across configs). Notation: "(a, b)" open, "[a, b]" closed, "> a", ">= a", "finite"; "or None"
# admits None; NaN and infinities are always refused. Counts have an upper bound far above any
# real run (1e9 steps, 1e7 tokens, 1e6 rows), so a slip of the keyboard (max_steps=99999999999999999999)
# is refused instead of running forever; seeds fit numpy's 32-bit seeding with room for the per-rank offset.
# tests/test_config_rules.py checks that every numeric field of every config is listed.
RANGES: dict[str, str] = {
    # rollout
    "rollout_workers": "[0, 1e6]",
    "max_staleness": "[0, 1e6]",
    "prompts_per_step": "[1, 1e6]",
    "group_size": "[1, 1e6]",
    "max_new_tokens": "[1, 1e7]",
    "max_prompt_length": "[1, 1e7] or None",
    "temperature": "> 0",
    "top_p": "(0, 1]",
    "top_k": "[0, 1e7]",
    "min_p": "[0, 1]",
    "repetition_penalty": "> 0",
    "vllm_kv_cache_gb": "> 0 or None",
    "vllm_gpu_memory_utilization": "(0, 1]",
    "vllm_tensor_parallel_size": "[1, 1024]",
    # algorithm
    "loss_horizon": "[1, 1e7] or None",
    "kl_coef": ">= 0",
    "kl_target": "> 0",
    "kl_horizon": "> 0",
    "top_entropy_quantile": "[0, 1]",
    "entropy_target": ">= 0",
    "entropy_coef_delta": ">= 0",
    "entropy_coef_min": ">= 0",
    "entropy_coef_max": ">= 0",
    "off_policy_mask_threshold": "> 0 or None",
    "clip_low": "(0, 1)",
    "clip_high": "> -1",
    "dual_clip": "> 1 or None",
    "value_clip": "> 0 or None",
    "vf_coef": ">= 0",
    "entropy_coef": ">= 0",
    "gamma": "[0, 1]",
    "lam": "[0, 1]",
    "advantage_epsilon": "(0, 1]",
    "num_iterations": "[1, 1e4]",
    # the bound of a reward function's output (rewards.functions.MAX_ABS_REWARD)
    "missing_eos_penalty": "[-1e6, 1e6] or None",
    "reward_clip": "> 0 or None",
    "rollout_is_threshold": "> 1 or None",
    "rollout_is_threshold_low": "[0, 1e6] or None",
    "max_tool_calling_iterations": "[0, 1e6]",
    "max_tool_response_tokens": "[1, 1e9] or None",
    "tool_call_timeout": "(0, 1e6]",
    "overlong_penalty": "[0, 1e6]",
    "overlong_buffer_len": "[1, 1e7] or None",
    "max_sampling_rounds": "[1, 1e6]",
    # teacher (on-policy distillation)
    "distillation_coef": ">= 0",
    "distillation_beta": "[0, 1]",
    "teacher_batch_size": "[1, 1e6]",
    "teacher_retries": "[0, 100]",
    "teacher_timeout": "(0, 1e6]",
    # optimisation
    "learning_rate": "> 0",
    "critic_learning_rate": "> 0 or None",
    "weight_decay": ">= 0",
    "max_grad_norm": "> 0 or None",
    "warmup_steps": "[0, 1e9]",
    "mini_batch_size": "[1, 1e6] or None",
    "micro_batch_size": "[1, 1e6] or None",
    "grad_accumulation": "[1, 1e6]",
    "max_consecutive_skips": "[1, 1e9]",
    "max_tokens_per_micro_batch": "[1, 1e9] or None or 'auto'",
    "memory_budget_gb": "> 0 or None",
    # run
    "max_steps": "[0, 1e9] or None",
    "seed": "[0, 2147483647]",
    "save_steps": "[0, 1e9]",
    "save_total_limit": "[1, 1e9] or None",
    "log_every": "[0, 1e9]",
    "num_logged_samples": "[0, 1e6]",
    "eval_every": "[0, 1e9]",
    "eval_max_new_tokens": "[1, 1e7] or None",
    # supervised trainers
    "num_epochs": "(0, 1e6]",
    "batch_size": "[1, 1e6]",
    "max_length": "[2, 1e7]",
    "center_rewards_coefficient": ">= 0 or None",
    # DPO
    "beta": "> 0",
    "label_smoothing": "[0, 0.5)",
    "simpo_gamma": "finite",
    "discopop_tau": "> 0",
    "f_alpha_divergence_coef": "finite",
    "ld_alpha": "[0, 1] or None",
    "ref_model_mixup_alpha": "(0, 1]",
    "ref_model_sync_steps": "[1, 1e9]",
    # KTO
    "desirable_weight": ">= 0",
    "undesirable_weight": ">= 0",
    # command-line sources
    "lora_r": "[0, 1e5]",
    "lora_alpha": "(0, 1e6]",
    "lora_dropout": "[0, 1)",
}


def in_range(value, spec: str, integer: bool = False) -> bool:
    """Whether ``value`` satisfies a ``RANGES`` spec (a bool is not a number; ``integer``: a whole
    number is required)."""
    if spec.endswith(" or 'auto'"):
        return value == "auto" or in_range(value, spec.removesuffix(" or 'auto'"), integer)
    text, none_ok = (spec[: -len(" or None")], True) if spec.endswith(" or None") else (spec, False)
    if value is None:
        return none_ok
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if integer and not isinstance(value, numbers.Integral):
        return False
    if not isinstance(value, numbers.Integral) and not math.isfinite(value):  # NaN and ±inf: never
        return False
    if text == "finite":
        return True
    if text[0] in "([":
        low, high = (float(x) for x in text[1:-1].split(","))
        above = value > low if text[0] == "(" else value >= low
        below = value < high if text[-1] == ")" else value <= high
        return above and below
    op, bound = text.split()
    return value >= float(bound) if op == ">=" else value > float(bound)


def check_ranges(config) -> None:
    """Check every field of ``config`` listed in ``RANGES`` against its range and its annotation
    (None only where the annotation admits it, whole numbers for ``int`` fields); the first
    failure is raised as one line naming the config, the field, the value and the range."""
    for f in dataclasses.fields(config):
        spec = RANGES.get(f.name)
        if spec is None or not f.init:
            continue
        annotation = str(f.type).replace(" ", "")
        if "None" not in annotation:
            spec = spec.removesuffix(" or None")
        integer = "int" in annotation.split("|") and "float" not in annotation
        value = getattr(config, f.name)
        if not in_range(value, spec, integer):
            expected = f"in {spec}" if spec[0] in "([" else spec
            kind = "an integer " if integer and not isinstance(value, numbers.Integral) else ""
            raise ValueError(
                f"{type(config).__name__}: config field {f.name!r} must be {kind}{expected}, got {value!r}"
            )


def check_run_fields(config) -> None:
    """``report_to`` as a tuple (a single name or 'none' is accepted, as in TRL) of known trackers;
    ``gradient_checkpointing`` one of ``CHECKPOINTING_MODES`` (True / False as 'on' / 'off')."""
    mode = config.gradient_checkpointing
    if isinstance(mode, bool):
        object.__setattr__(config, "gradient_checkpointing", "on" if mode else "off")
    elif mode not in CHECKPOINTING_MODES:
        raise ValueError(
            f"{type(config).__name__}: config field 'gradient_checkpointing' must be one of "
            f"{', '.join(CHECKPOINTING_MODES)} (or True / False), got {mode!r}"
        )
    value = config.report_to
    names = (value,) if isinstance(value, str) else tuple(value or ())
    names = tuple(n for n in names if n != "none")
    object.__setattr__(config, "report_to", names)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"{type(config).__name__}: config field 'report_to' must list trackers among "
            f"{', '.join(TRACKERS)} (each once), got {list(value) if not isinstance(value, str) else value!r}"
        )


def check_fields(config, checks) -> None:
    """Raise for the first ``(ok, field, expected)`` that fails, naming the config and the field."""
    for ok, name, expected in checks:
        if not ok:
            raise ValueError(
                f"{type(config).__name__}: config field {name!r} must be {expected}, got {getattr(config, name)!r}"
            )
