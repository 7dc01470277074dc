"""The argument forms TRL 1.16's ``GRPOTrainer`` / ``RLOOTrainer`` take, turned into what rlhfkit's
RL loop takes (``trl/trainer/grpo_trainer.py``'s ``__init__``, rule by rule):

- ``args``: a ``GRPOConfig`` / ``RLOOConfig``, None (TRL's default config) or a plain
  ``transformers.TrainingArguments``, whose fields become the trainer's config (``trl_config``);
- ``processing_class`` None beside a model object: the tokenizer of the checkpoint the model was
  loaded from (``config._name_or_path``), as TRL loads it (``tokenizer_for``);
- ``reward_funcs``: a function, a reward model's Hub id or directory, a sequence-classification model
  object, or a list of them; ``reward_processing_classes``: None, one tokenizer or a list, one per
  reward function (TRL's "must match" rule); a reward model without one is scored with its own
  checkpoint's tokenizer (``reward_sources``); its name is its checkpoint's last path part, TRL's;
- ``chat_template_kwargs`` (the config's): passed to every ``apply_chat_template`` call the run makes
  with the policy's tokenizer (``with_template_kwargs``), as TRL passes them when it renders prompts;
- ``train_dataset`` / ``eval_dataset``: ``datasets.Dataset``, a list of rows, or a
  ``datasets.IterableDataset`` (a stream: the training run reads the prompts ``max_steps`` takes,
  which TRL requires for a stream; ``prompt_rows``), ``eval_dataset`` also a dict of them.
"""

from __future__ import annotations

import itertools
from typing import Any

from ..models import ScalarModel, freeze, load_tokenizer
from ..rewards.reward_model import RewardModelFunction
from .arguments import from_training_arguments


def is_iterable_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` is a ``datasets.IterableDataset`` (a stream of unknown length)."""
    return type(dataset).__name__ == "IterableDataset" and hasattr(dataset, "__iter__")


def prompt_rows(dataset: Any, limit: int | None = None) -> Any:
    """A stream's first ``limit`` rows (None: all) as a list of dicts; any other source as it is
    (rlhfkit's loader reads it)."""
    if not is_iterable_dataset(dataset):
        return dataset
    return [dict(row) for row in itertools.islice(iter(dataset), limit)]


def eval_sets(eval_dataset: Any) -> dict[str | None, Any]:
    """``eval_dataset`` by name: ``{}`` for None, ``{None: dataset}`` for one dataset, ``{name:
    dataset}`` for a ``DatasetDict``, an ``IterableDatasetDict`` or a dict of datasets (their metrics
    are named ``eval_<name>_<metric>``, as ``transformers.Trainer`` names them)."""
    if eval_dataset is None:
        return {}
    if isinstance(eval_dataset, dict):  # DatasetDict and IterableDatasetDict are dicts too
        if not eval_dataset:
            raise ValueError("eval_dataset: an empty dict of datasets; pass at least one, or None")
        return {str(name): dataset for name, dataset in eval_dataset.items()}
    return {None: eval_dataset}


def trl_config(args, config_class):
    """TRL's rule for ``args``: a plain ``TrainingArguments`` (not the trainer's config) becomes the
    trainer's config with the same field values (``arguments.from_training_arguments``)."""
    from transformers import TrainingArguments

    if isinstance(args, TrainingArguments) and not isinstance(args, config_class):
        return from_training_arguments(args, config_class)
    return args


def checkpoint_id(model) -> str:
    """The checkpoint a model object was loaded from (TRL's ``get_config_model_id``): its
    ``config._name_or_path``; for a ``peft`` model, its base model's."""
    return getattr(getattr(model, "config", None), "_name_or_path", "") or ""


def tokenizer_for(model, processing_class):
    """``processing_class``, or for a model object without one the tokenizer of the checkpoint it
    was loaded from, as TRL loads it (``AutoProcessor.from_pretrained(config._name_or_path)``); a
    model object that names no checkpoint needs its tokenizer, said in one line."""
    if processing_class is not None or isinstance(model, str) or not hasattr(model, "config"):
        return processing_class
    source = checkpoint_id(model)
    if not source:
        raise ValueError(
            "processing_class (the tokenizer) is required: the model object names no checkpoint "
            "(config._name_or_path) to load one from"
        )
    return load_tokenizer(source, "the model's checkpoint")


def reward_sources(reward_funcs, reward_processing_classes) -> tuple[list, list, list[str]]:
    """``(sources, processing_classes, names)`` of TRL's ``reward_funcs`` and
    ``reward_processing_classes`` (the module docstring): functions and reward-model ids as rlhfkit
    takes them, or as a ``RewardModelFunction`` where a model object or a given tokenizer must be
    used; ``processing_classes`` one per function (TRL's ``trainer.reward_processing_classes``: the
    tokenizer each reward model scores with, None for a function); ``names`` TRL's."""
    if reward_funcs is None:
        funcs = []
    else:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if not funcs:
        raise ValueError(
            "No reward source provided. Pass `reward_funcs`, or an `environment_factory` whose environment "
            "defines a `get_reward` method."
        )
    if reward_processing_classes is None:
        classes = [None] * len(funcs)
    else:
        classes = (
            list(reward_processing_classes)
            if isinstance(reward_processing_classes, (list, tuple))
            else [reward_processing_classes]
        )
    if len(classes) != len(funcs):
        raise ValueError(
            f"The number of reward processing classes ({len(classes)}) must match the number of reward "
            f"functions ({len(funcs)})."
        )
    sources, names = [], []
    for i, (spec, tokenizer) in enumerate(zip(funcs, classes)):
        model = _sequence_classifier(spec)
        if model is None and not (isinstance(spec, str) and tokenizer is not None):
            if tokenizer is not None and callable(spec):
                raise ValueError(
                    f"reward_processing_classes[{i}] is given for reward function {_name(spec)!r}, which is no "
                    "reward model: pass None at its place"
                )
            sources.append(spec)
            names.append(_name(spec))
            continue
        reward_model, classes[i], name = _reward_model_function(spec, model, tokenizer, i)
        sources.append(reward_model)
        names.append(name)
    return sources, classes, names


def _reward_model_function(spec, model, tokenizer, i: int) -> tuple[RewardModelFunction, Any, str]:
    """``(function, tokenizer, name)`` of ``reward_funcs[i]``, a reward model: its id or directory
    ``spec``, or the model object ``model``; scored with ``tokenizer`` (None: its checkpoint's)."""
    scalar = ScalarModel.from_pretrained(spec) if model is None else _scalar(model, i)
    source = spec if isinstance(spec, str) else checkpoint_id(model)
    if tokenizer is None:
        if not source:
            raise ValueError(
                f"reward_funcs[{i}]: a reward model object that names no checkpoint (config._name_or_path); "
                "pass its tokenizer in reward_processing_classes"
            )
        tokenizer = load_tokenizer(source, "reward model")
    if tokenizer.pad_token_id is None:  # TRL's rule: the EOS pads
        tokenizer.pad_token = tokenizer.eos_token
    from ..data.encode import encode_pair

    name = source.rstrip("/").split("/")[-1] or f"reward_model_{i}"
    return RewardModelFunction(freeze(scalar), tokenizer, encode=encode_pair, name=name), tokenizer, name


def _sequence_classifier(spec):
    """``spec`` when it is a transformers model object (a reward model), else None."""
    import torch

    if isinstance(spec, ScalarModel):
        return spec
    return spec if isinstance(spec, torch.nn.Module) and hasattr(spec, "config") else None


def _scalar(model, i: int) -> ScalarModel:
    """rlhfkit's ``ScalarModel`` over a sequence classifier's own modules (no copy)."""
    import torch

    if isinstance(model, ScalarModel):
        return model
    heads = [
        m
        for n, m in model.named_children()
        if n != getattr(model, "base_model_prefix", None) and next(m.parameters(), None) is not None
    ]  # a sequence classifier: its base model and one head (transformers' "score" or "classifier")
    head = heads[0] if len(heads) == 1 else None
    if not (isinstance(head, torch.nn.Linear) and head.out_features == 1):
        raise ValueError(
            f"reward_funcs[{i}]: {type(model).__name__} is no sequence classifier with one output (a linear "
            "'score' head of num_labels=1)"
        )
    return ScalarModel(model.base_model, head)


def _name(fn) -> str:
    """TRL's name of a reward function (``get_callable_name``), or the string given."""
    if isinstance(fn, str):
        return fn.replace(":", ".").rsplit(".", 1)[-1] if "/" not in fn else fn.rstrip("/").split("/")[-1]
    return getattr(fn, "__name__", None) or type(fn).__name__


def with_template_kwargs(model, processing_class, kwargs: dict | None):
    """``processing_class`` (or the model's own tokenizer) with ``kwargs`` (TRL's
    ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``) bound to its ``apply_chat_template``:
    a shallow copy, so the caller's tokenizer is left as it was; a call's own keywords still win.
    None or ``{}``: ``processing_class`` as it is."""
    if not kwargs:
        return processing_class
    import copy
    import functools

    tokenizer = copy.copy(load_tokenizer(model if processing_class is None else processing_class, "model"))
    tokenizer.apply_chat_template = functools.partial(tokenizer.apply_chat_template, **kwargs)
    return tokenizer
