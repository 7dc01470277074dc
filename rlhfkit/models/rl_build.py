"""Building the RL loop's models from what the trainer is given (``build_models``): the policy from a path or an
object, its tokenizer, the process group, LoRA and activation checkpointing, then ``RLModels`` (the reference, the
critic, the teacher, sharded under torchrun). ``ModelLoading``: the fields of ``RLConfig`` it reads."""

from __future__ import annotations

import os

from .. import distributed
from ..config.parts import takes
from .loading import disable_dropout, enable_activation_checkpointing, freeze, load_causal_lm, load_tokenizer
from .lora import apply_lora
from .remote_teacher import RemoteTeacher
from .rl_models import ModelSetup, RLModels


@takes(
    "device",
    "rollout_workers",
    "teacher_model",
    "teacher_url",
    "teacher_batch_size",
    "teacher_retries",
    "teacher_timeout",
)
class ModelLoading(ModelSetup):
    """The fields of ``RLConfig`` that ``build_models`` reads besides ``RLModels``'s: the device, the
    generator ranks (the process group starts there), the teacher's path, or its server (``teacher_url``)."""


def build_models(
    model, processing_class, args: ModelLoading, peft_config=None, ref_model=None, teacher_model=None
) -> RLModels:
    """The ``RLModels`` of a run: ``model`` a path or a causal-LM object (``processing_class`` then required),
    ``peft_config`` a LoRA adapter to train, ``ref_model`` / ``teacher_model`` (else ``args.teacher_model``) the
    frozen reference and teacher, as paths or objects; with ``args.teacher_url`` a ``RemoteTeacher`` on that server.
    A generator rank builds the policy alone."""
    if processing_class is None and not isinstance(model, (str, os.PathLike)):
        raise ValueError("processing_class (the tokenizer) is required when model is an object, not a path")
    distributed.check_device(args.device)  # before anything loads
    tokenizer = load_tokenizer(
        processing_class if processing_class is not None else model,
        "model" if processing_class is None else "processing_class",
    )
    policy = load_causal_lm(model, args.dtype if isinstance(model, (str, os.PathLike)) else None)
    # The process group starts here, after every check that could fail the same way on every rank.
    policy = policy.to(distributed.setup(args.device, args.rollout_workers))
    if distributed.is_generator():  # generates from the trainers' (merged) weights: no adapter, no critic
        return RLModels(freeze(disable_dropout(policy)).eval(), tokenizer, args, generation_only=True)
    if peft_config is not None:
        policy = disable_dropout(apply_lora(policy, peft_config, task_type=getattr(peft_config, "task_type", None)))
    if args.gradient_checkpointing != "off":  # installed; whether a pass uses it is RLModels.memory's call
        enable_activation_checkpointing(policy)
        if peft_config is not None:
            policy.enable_input_require_grads()
    # Train mode (dropout is off, so forward passes are unchanged): activation checkpointing needs it.
    policy.train()
    teacher = teacher_model if teacher_model is not None else args.teacher_model
    if args.teacher_url is not None:  # served elsewhere: teacher_model names the served model
        if teacher is not None and not isinstance(teacher, str):
            raise ValueError("teacher_model must be the served model's id (a string) with teacher_url, not a model")
        teacher = RemoteTeacher(
            args.teacher_url, teacher, args.teacher_batch_size, args.teacher_retries, args.teacher_timeout
        )
    return RLModels(policy, tokenizer, args, ref_model, teacher=teacher)


__all__ = ["ModelLoading", "build_models"]
