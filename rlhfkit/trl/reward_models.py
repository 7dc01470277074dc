"""The model TRL 1.16's ``RewardTrainer`` trains, built as TRL builds it, and the rlhfkit
``ScalarModel`` the reward-model loop runs on it.

TRL's ``trainer.model`` is a Hugging Face sequence classifier with one label (``num_labels=1``),
wrapped by ``peft`` when a ``peft_config`` is given (``trl/trainer/reward_trainer.py``):

- a directory or Hub id loads with ``AutoModelForSequenceClassification.from_pretrained(model,
  num_labels=1)`` after ``transformers.set_seed(seed)`` (a causal LM gets transformers' fresh
  ``score`` head, drawn from that seed);
- a sequence classifier object, or a ``peft`` model of one, is used as it is; its ``num_labels``
  must be 1 (TRL's message otherwise);
- ``peft_config`` wraps it with ``peft.get_peft_model``: only what peft makes trainable trains, so
  the ``score`` head trains only when the config names it (``modules_to_save=["score"]``, or
  ``task_type="SEQ_CLS"``), exactly as in TRL.

rlhfkit goes beyond TRL in two cases, both kept: a causal-LM object (TRL refuses it: its
``num_labels`` is 2) gets rlhfkit's fresh scalar head, shown as the sequence classifier
transformers has for it; and a directory in rlhfkit's older scalar layout, or a ``ScalarModel``,
trains as rlhfkit loads it (``trainer.model`` is then that ``ScalarModel``).

``scalar_view`` is the ``ScalarModel`` over the classifier's own modules (its transformer and its
head: no copy), so the loop's updates are the classifier's; rlhfkit scores the last attended token
of each right-padded row, the token transformers' pooling reads when the pad id is no EOS id.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..models import ScalarModel
from ..models.heads import HEAD_FILE
from ..models.lora import apply_lora, is_peft
from ..models.sources import from_hub_or_dir, resolve_model_dir

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def num_labels_error(n) -> ValueError:
    """TRL's message for a sequence classifier whose ``num_labels`` is not 1."""
    return ValueError(
        f"The model has `num_labels={n}`, but reward models require `num_labels=1` to output a single scalar "
        "reward per sequence. Please instantiate your model with `num_labels=1` or pass a model name as a string "
        "to have it configured automatically."
    )


def trl_reward_model(model, seed: int, dtype, trust_remote_code: bool, peft_config=None):
    """TRL's ``trainer.model`` for ``model`` (the module docstring), or None where rlhfkit's own
    loading applies (its scalar layout, a ``ScalarModel``, a model transformers has no sequence
    classifier for); ``dtype``: a ``torch.dtype`` for a directory or Hub id."""
    if isinstance(model, ScalarModel):
        return None
    if isinstance(model, (str, os.PathLike)):
        source = resolve_model_dir(model, "model")
        if isinstance(source, Path) and ((source / HEAD_FILE).exists() or not (source / "config.json").exists()):
            return None  # rlhfkit's scalar layout, a GGUF file: rlhfkit loads it
        if not _has_sequence_classifier(source, trust_remote_code):
            return None  # rlhfkit's AutoModel backbone and fresh head
        seq = _from_pretrained(source, seed, dtype, trust_remote_code)
    elif is_peft(model) or type(model).__name__.endswith("ForSequenceClassification"):
        labels = getattr(model.config, "num_labels", None)
        if labels != 1:
            raise num_labels_error(labels)
        seq = model
    elif isinstance(model, torch.nn.Module) and hasattr(model, "base_model"):  # a causal LM: rlhfkit's head
        seq = ScalarModel.from_causal_lm(model)._as_sequence_classifier()
        if seq is None:
            return None
    else:
        raise ValueError(
            f"model must be a model directory or Hub id, a sequence-classification model (or a peft model of one) "
            f"or a causal-LM object, got {type(model).__name__}"
        )
    return _with_adapter(seq, peft_config)


def _with_adapter(seq, peft_config):
    """``seq`` wrapped by ``peft`` with ``peft_config`` as TRL wraps it (None: ``seq`` as it is)."""
    if peft_config is None:
        return seq
    if is_peft(seq):  # TRL's message
        raise ValueError(
            "You passed a `PeftModel` instance together with a `peft_config` to the trainer. Please first merge "
            "and unload the existing adapter, save the resulting base model, and then pass that base model "
            "along with the new `peft_config` to the trainer."
        )
    return apply_lora(seq, peft_config, task_type=getattr(peft_config, "task_type", None))


def _has_sequence_classifier(source, trust_remote_code: bool) -> bool:
    """Whether transformers has a sequence classifier for the model at ``source`` (remote code: assumed)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    config = from_hub_or_dir(AutoConfig.from_pretrained, source, "model", trust_remote_code=trust_remote_code)
    return (
        trust_remote_code
        and bool(getattr(config, "auto_map", None))
        or (type(config) in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING)
    )


def _from_pretrained(source, seed: int, dtype, trust_remote_code: bool):
    """``AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)`` after
    ``set_seed(seed)``, without transformers' report of the new head (TRL hides it too)."""
    from transformers import AutoModelForSequenceClassification, set_seed
    from transformers.utils import logging as hf_logging

    set_seed(seed)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        extra = {"trust_remote_code": True} if trust_remote_code else {}
        return from_hub_or_dir(
            AutoModelForSequenceClassification.from_pretrained, source, "model", num_labels=1, dtype=dtype, **extra
        )
    finally:
        hf_logging.set_verbosity(level)


def classifier_parts(seq) -> tuple[PreTrainedModel, torch.nn.Module]:
    """``(transformer, head)`` of a sequence classifier (inside its ``peft`` wrapper): the base
    model (its ``base_model_prefix`` child, a ``PreTrainedModel``) and the one other child with
    parameters (``score``; peft's wrapper of it when trained)."""
    inner = seq.get_base_model() if is_peft(seq) else seq
    prefix = inner.base_model_prefix
    heads = [m for n, m in inner.named_children() if n != prefix and next(m.parameters(), None) is not None]
    if len(heads) != 1:
        raise ValueError(
            f"{type(inner).__name__}: expected one scoring head beside its {prefix!r} transformer, found {len(heads)}"
        )
    return getattr(inner, prefix), heads[0]


def scalar_view(seq) -> ScalarModel:
    """The ``ScalarModel`` over ``seq``'s own transformer and head (the module docstring)."""
    backbone, head = classifier_parts(seq)
    return ScalarModel(backbone, head)


def merged_scalar(seq) -> ScalarModel:
    """A plain ``ScalarModel`` of a ``peft`` classifier with its adapter merged into a copy."""
    return scalar_view(copy.deepcopy(seq).merge_and_unload())
