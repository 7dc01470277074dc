"""What every drop-in config shares: ``transformers.TrainingArguments``' fields, TRL's base defaults,
and the rule that no field is silently ignored.

TRL's configs are ``TrainingArguments`` with TRL's fields added and a few defaults changed
(``trl/trainer/base_config.py``: ``logging_steps=10``, ``gradient_checkpointing=True``, ``bf16``
True unless ``fp16``). The drop-in configs (``rlhfkit.trl``) are the same dataclasses, so a TRL
script's keyword arguments, defaults and ``__post_init__`` checks are TRL's; each then translates
itself into an rlhfkit config (``to_rlhfkit``). Every ``TrainingArguments`` field is one of:

- **translated** (``TRANSLATED``): it has an rlhfkit counterpart, set from it (``common``);
- **without effect here** (``NO_EFFECT``): it only steers what rlhfkit does its own way (data
  loader workers, log levels, evaluation batch sizes, DDP knobs torchrun and rlhfkit set) — any
  value is accepted;
- **refused** otherwise, unless it holds its default: one line naming the field, and what to use
  instead when there is something (``ADVICE``).
"""

from __future__ import annotations

import dataclasses
import math

# Accepted with any value: they change no number rlhfkit computes (see the module docstring).
NO_EFFECT = frozenset(
    {
        "logging_first_step",
        "logging_nan_inf_filter",
        "logging_strategy",
        "log_level",
        "log_level_replica",
        "log_on_each_node",
        "skip_memory_metrics",
        "include_num_input_tokens_seen",
        "project",
        "trackio_bucket_id",
        "trackio_space_id",
        "trackio_static_space_id",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "dataloader_multiprocessing_context",
        "remove_unused_columns",
        "label_names",
        "do_train",
        "do_eval",
        "do_predict",
        "per_device_eval_batch_size",
        "eval_accumulation_steps",
        "eval_do_concat_batches",
        "eval_use_gather_object",
        "batch_eval_metrics",
        "prediction_loss_only",
        "include_for_metrics",
        "save_on_each_node",
        "save_only_model",
        "local_rank",
        "ddp_timeout",
        "ddp_backend",
        "ddp_find_unused_parameters",
        "ddp_bucket_cap_mb",
        "ddp_broadcast_buffers",
        "ddp_static_graph",
        "use_cache",
        "torch_empty_cache_steps",
        "average_tokens_across_devices",
        "accelerator_config",
        "hub_model_id",
        "hub_strategy",
        "hub_token",
        "hub_private_repo",
        "hub_revision",
        "restore_callback_states_from_checkpoint",
        "ignore_data_skip",
        "tf32",
        "eval_on_start",
        # TRL's own logging and loading switches with no counterpart to steer
        "log_completions",
        "num_completions_to_print",
        "log_unique_prompts",
        "log_multimodal",
        "trust_remote_code",
        "dataset_num_proc",
        "ds3_gather_for_generation",
        "pad_to_multiple_of",
        "disable_dropout",
    }
)

# Translated by ``common`` (the trainer-specific ones by each config's own ``to_rlhfkit``).
TRANSLATED = frozenset(
    {
        "output_dir",
        "learning_rate",
        "weight_decay",
        "max_grad_norm",
        "seed",
        "lr_scheduler_type",
        "warmup_steps",
        "report_to",
        "run_name",
        "logging_steps",
        "save_strategy",
        "save_steps",
        "save_total_limit",
        "bf16",
        "fp16",
        "gradient_checkpointing",
        "optim",
        "use_cpu",
        "disable_tqdm",
        "resume_from_checkpoint",
        "eval_strategy",
        "eval_steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "max_steps",
        "num_train_epochs",
    }
)

_STREAMED_HEAD = (
    "rlhfkit streams the LM head itself instead of Liger's kernels (lm_head='chunked', the default): "
    "no tokens x vocabulary logits, forward or backward"
)
ADVICE = {
    "deepspeed": "run under torchrun with FSDP2 (rlhfkit <command> --nproc-per-node N; parallelism='fsdp')",
    "fsdp": "rlhfkit shards with FSDP2 whenever it runs under torchrun (--nproc-per-node N; parallelism='fsdp')",
    "fsdp_config": "rlhfkit shards with FSDP2 whenever it runs under torchrun (--nproc-per-node N)",
    "use_liger_kernel": _STREAMED_HEAD,
    "liger_kernel_config": _STREAMED_HEAD,
    "torch_compile": "no compiled training step yet",
    "push_to_hub": "save_model(dir), then upload the directory with huggingface_hub",
    "load_best_model_at_end": "evaluate the checkpoints with rlhfkit eval and pick one",
    "neftune_noise_alpha": "no NEFTune noise",
    "auto_find_batch_size": "set per_device_train_batch_size",
    "gradient_checkpointing_kwargs": "{'use_reentrant': True | False} only (rlhfkit recomputes each block "
    "non-reentrantly either way: the same gradients)",
    "lr_scheduler_kwargs": "lr_scheduler_type 'linear', 'cosine' or 'constant'",
    "model_init_kwargs": "model_init_kwargs={'dtype': ...} only (float32, bfloat16, float16)",
    "vllm_mode": "vllm_mode='colocate'; for generation on separate processes use rollout_workers (RLConfig)",
    "vllm_tensor_parallel_size": "1 (each training process runs its own engine)",
    "sync_ref_model": "a fixed reference (TR-DPO syncing is in the DPO trainer only)",
}

# transformers' schedules (rlhfkit's hf_*: warmup factor s/w, the first update at learning rate 0);
# plain "constant" ignores warmup_steps there, so ``common`` sets the warmup to 0 for it.
SCHEDULERS = {
    "linear": "hf_linear",
    "cosine": "hf_cosine",
    "constant": "hf_constant",
    "constant_with_warmup": "hf_constant",
}
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")


def field_default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else None


def unset(value) -> bool:
    """Whether ``value`` is one of the forms an unset ``TrainingArguments`` field takes: None, '', [], False or
    'no' (``HfArgumentParser``, which TRL's scripts parse with, gives ``debug`` None for its default '' and
    ``include_num_input_tokens_seen`` False for its 'no'; ``TrainingArguments`` normalises them alike)."""
    return value is None or value is False or (isinstance(value, (str, list)) and value in ("", [], "no"))


def refuse_unsupported(config, handled: frozenset) -> None:
    """Refuse, in one line, a field of ``config`` that is neither ``handled`` (translated by the
    config), translated here (``TRANSLATED``), nor without effect (``NO_EFFECT``) and does not hold
    its default. Called in ``__post_init__`` before ``TrainingArguments`` normalises anything."""
    name = type(config).__name__
    for field in dataclasses.fields(config):
        if field.name in handled or field.name in TRANSLATED or field.name in NO_EFFECT:
            continue
        value, default = getattr(config, field.name), field_default(field)
        if field.name == "gradient_checkpointing_kwargs" and set(value or {}) <= {"use_reentrant"}:
            continue  # how the recompute is wired, not what it computes (the gradients are the same)
        if value != default and not (unset(value) and unset(default)):
            instead = f"; instead: {ADVICE[field.name]}" if field.name in ADVICE else ""
            raise ValueError(
                f"{name} field {field.name!r}={value!r} is not supported by rlhfkit (only its default "
                f"{default!r}){instead}"
            )


def check_choice(config, field: str, allowed) -> None:
    value = getattr(config, field)
    value = getattr(value, "value", value)  # transformers' enums
    if value not in allowed:
        instead = ADVICE.get(field, f"one of {', '.join(map(repr, allowed))}")
        raise ValueError(
            f"{type(config).__name__} field {field!r}={value!r} is not supported by rlhfkit: use {instead}"
        )


def common(config, optimizer_steps: int) -> dict:
    """rlhfkit's values for the translated ``TrainingArguments`` fields of ``config``.
    ``optimizer_steps``: the run's total (it turns a warmup or logging ratio into steps). The
    schedule is transformers' own (``SCHEDULERS``: rlhfkit's ``hf_*``), with no warmup for plain
    ``constant`` as there."""
    check_choice(config, "lr_scheduler_type", tuple(SCHEDULERS))
    check_choice(config, "optim", OPTIMIZERS)
    check_choice(config, "save_strategy", ("steps", "no"))
    check_choice(config, "eval_strategy", ("steps", "no"))
    scheduler = getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type)
    report = config.report_to
    report = () if report in (None, "none", ["none"]) else tuple([report] if isinstance(report, str) else report)
    if "all" in report:
        raise ValueError(
            f"{type(config).__name__} field 'report_to'='all' is not supported by rlhfkit: name the "
            "trackers (tensorboard, wandb, mlflow, trackio)"
        )
    autocast = "bfloat16" if config.bf16 else "float16" if config.fp16 else None
    return dict(
        output_dir=config.output_dir,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm or None,
        seed=config.seed,
        lr_scheduler=SCHEDULERS[scheduler],
        warmup_steps=0 if scheduler == "constant" else as_steps(config.warmup_steps, optimizer_steps),
        report_to=report,
        run_name=config.run_name,
        autocast=autocast,
        gradient_checkpointing=bool(config.gradient_checkpointing),
        device="cpu" if config.use_cpu else "auto",
        progress_bar=not config.disable_tqdm,
        resume_from=config.resume_from_checkpoint,
    )


def as_steps(value: float, total: int) -> int:
    """TrainingArguments' step counts: a value below 1 is a ratio of ``total``."""
    return int(math.ceil(value * total)) if 0 < value < 1 else int(value)


def from_training_arguments(args, config_class):
    """TRL's conversion of a plain ``transformers.TrainingArguments`` given as a trainer's ``args``
    (``SFTConfig(**args.to_dict())`` in TRL's trainers): ``config_class`` with every field of
    ``args``, so ``TrainingArguments``' defaults replace the TRL config's (its ``learning_rate``,
    ``logging_steps``, ``gradient_checkpointing``...), as in TRL. A field ``args`` holds at its
    default is passed as declared (``TrainingArguments`` normalises some, e.g. ``debug`` '' to
    []), so the config's checks see only what the user set."""
    from transformers import TrainingArguments

    declared = {f.name: field_default(f) for f in dataclasses.fields(TrainingArguments) if f.init}
    defaults = TrainingArguments(output_dir=args.output_dir).to_dict()
    values = {k: declared[k] if v == defaults.get(k) else v for k, v in args.to_dict().items() if k in declared}
    values["hub_token"] = args.hub_token  # to_dict hides it
    values["output_dir"] = args.output_dir  # compared with itself above: kept whatever it is
    return config_class(**values)


def trl_fields(cls) -> frozenset:
    """The fields ``cls`` adds to ``TrainingArguments`` or re-declares (TRL's own)."""
    from transformers import TrainingArguments

    base = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    return frozenset(f.name for f in dataclasses.fields(cls) if f.name not in base or f is not base[f.name])


# model_init_kwargs keys accepted when they hold from_pretrained's own value (TRL's scripts pass them)
_INIT_DEFAULTS = {"revision": (None, "main"), "trust_remote_code": (None, False), "attn_implementation": (None,)}


def model_dtype(config, field: str = "model_init_kwargs", default: str = "float32") -> str:
    """rlhfkit's ``dtype`` from ``model_init_kwargs`` (or another ``field`` of the same form):
    ``{'dtype': 'float32' | 'bfloat16' | 'float16'}`` (None: ``default``, TRL's float32), with any other key only
    at from_pretrained's own value; else one line."""
    kwargs = dict(getattr(config, field) or {})
    dtype = kwargs.pop("dtype", None)
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    odd = {k: v for k, v in kwargs.items() if v not in _INIT_DEFAULTS.get(k, ())}
    if odd or dtype not in (None, "float32", "bfloat16", "float16"):
        raise ValueError(
            f"{type(config).__name__} field {field!r}={getattr(config, field)!r} is not "
            "supported by rlhfkit: only {'dtype': 'float32' | 'bfloat16' | 'float16'} (name the "
            "checkpoint's dtype instead of 'auto')"
        )
    return dtype or default
