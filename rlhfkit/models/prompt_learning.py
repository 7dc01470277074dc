"""peft's prompt-learning adapters — prompt tuning (Lester et al. 2021, arXiv:2104.08691), P-tuning
(Liu et al. 2021, arXiv:2103.10385) and prefix tuning (Li & Liang 2021, arXiv:2101.00190) — as the
trainers see them: trained virtual tokens instead of changed weights.

Two things differ from LoRA (``models/lora.py``):

- prompt tuning and P-tuning put their virtual tokens *before* the input, as positions: the model's
  hidden states and logits come back ``num_virtual_tokens`` longer than ``input_ids``, those
  positions first (``virtual_positions``), and peft ignores ``position_ids`` (it warns and drops
  them). Prefix tuning puts them in the attention's keys and values instead: the output keeps the
  input's length;
- nothing merges into the weights (peft's ``merge_and_unload`` is LoRA's): a trained model leaves
  the run as its adapter (``PeftModel.save_pretrained``), which ``PeftModel.from_pretrained`` loads
  on the base model.
"""

from __future__ import annotations

import torch


def prompt_learning_config(model):
    """The active peft config of ``model`` (a DDP wrapper's module) when it is a prompt-learning
    adapter, else None; ``model`` may also be a peft config itself."""
    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    config = getattr(inner, "active_peft_config", inner)
    return config if getattr(config, "is_prompt_learning", False) is True else None


def _kind(config) -> str:
    return str(getattr(getattr(config, "peft_type", None), "value", getattr(config, "peft_type", "")))


def prefix_in_cache(model) -> bool:
    """Whether ``model``'s adapter (or the peft config ``model``) is prefix tuning, whose virtual
    tokens reach the layers as a key-value cache: activation checkpointing, which transformers runs
    without a cache, would drop them."""
    config = prompt_learning_config(model)
    return config is not None and _kind(config) in ("PREFIX_TUNING", "CARTRIDGE")


def is_prompt_learning(model: torch.nn.Module) -> bool:
    """Whether ``model`` trains a prompt-learning adapter (prompt tuning, P-tuning, prefix tuning)."""
    return prompt_learning_config(model) is not None


def virtual_positions(model: torch.nn.Module) -> int:
    """How many positions ``model``'s adapter puts before the input in its output (hidden states,
    logits): ``num_virtual_tokens`` for prompt tuning, P-tuning and peft's other adapters that
    prepend embeddings; 0 for prefix tuning (keys and values only) and for any other model."""
    config = prompt_learning_config(model)
    return 0 if config is None or prefix_in_cache(config) else int(config.num_virtual_tokens)
