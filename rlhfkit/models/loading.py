"""Loading causal LMs and tokenizers from local Hugging Face directories (or model objects)."""

from __future__ import annotations

from numbers import Integral
from pathlib import Path

import torch

from ..config import DTYPES
from .sources import from_hub_or_dir, resolve_model_dir


def resolve_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:  # config.DTYPES: the one list of weight dtypes, all named as in torch
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return getattr(torch, dtype)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Set every dropout probability to 0 (RL needs the same log-probs in rollout and update:
    dropout would make the PPO ratio ≠ 1 on the very first step)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        # Attention layers copy their dropout rate from the config at construction (e.g. Llama's
        # ``self.attention_dropout``) and pass it to the attention kernel: zero those copies too.
        for key in ("attention_dropout", "dropout", "attn_dropout", "dropout_p"):
            if isinstance(getattr(module, key, None), float):
                setattr(module, key, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key in (
            "attention_dropout",
            "hidden_dropout",
            "dropout",
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
            "hidden_dropout_prob",
            "attention_probs_dropout_prob",
            "classifier_dropout",
        ):
            if isinstance(getattr(config, key, None), float):
                setattr(config, key, 0.0)
    return model


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Eval mode and no gradients: a frozen reference or reward model."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@torch.no_grad()
def soft_update(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """``target ← α source + (1 - α) target``, parameter by parameter (the two of one architecture):
    TR-DPO's reference sync (Gorbatovski et al. 2024, "Learn Your Reference Model for Real Good
    Alignment", arXiv:2404.09656; TRL's ``SyncRefModelCallback``), for the DPO and RL trainers. Under
    FSDP2 each parameter is its shard first (a forward pass leaves the root's gathered: plain tensors
    beside DTensor shards)."""
    from .. import distributed

    for m in (source, target):
        distributed.reshard(m)
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.mul_(1 - alpha).add_(s.detach().to(t.dtype), alpha=alpha)


def eos_token_ids(*sources) -> tuple[int, ...]:
    """Every id that ends a completion — a turn: the EOS ids of ``sources``, in order, each once.
    A source is an id, a collection of ids, None, a model (its ``generation_config.eos_token_id``:
    an id, a list or None), or anything with an ``eos_token_id`` (a tokenizer, a config).

    The one rule for "where a response ends", as TRL 1.16's GRPO stops generation:
    ``eos_token_ids(tokenizer, model)`` is the tokenizer's EOS plus every id the model's generation
    config declares — Gemma 2's ``<end_of_turn>`` besides ``<eos>``, the first Llama 3 Instruct's
    ``<|eot_id|>``, Phi-3's ``<|end|>``. Engines stop at any of them, and a response ends at the first
    (``rollout.base.response_mask_from_ids``: ``response_mask``, ``has_eos``). An int is a set of one."""
    ids: list[int] = []
    for source in sources:
        if isinstance(source, torch.nn.Module) or hasattr(source, "generation_config"):  # a model
            source = getattr(getattr(source, "generation_config", None), "eos_token_id", None)
        elif hasattr(source, "eos_token_id"):  # a tokenizer, a generation config, a model config
            source = source.eos_token_id
        for value in [] if source is None else [source] if isinstance(source, Integral) else source:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
    return tuple(ids)


def load_tokenizer(source, what: str = "tokenizer"):
    """A tokenizer from a directory (or the tokenizer object itself). Left padding for generation;
    a missing pad token falls back to EOS (masks are built from positions, so this is safe).
    ``what``: the field the user set, named by the errors (``model`` when the tokenizer is read
    from the model's directory)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    if isinstance(source, PreTrainedTokenizerBase):
        tok = source
    else:
        tok = from_hub_or_dir(AutoTokenizer.from_pretrained, resolve_model_dir(source, what), what)
    if tok.eos_token_id is None:
        raise ValueError(
            f"tokenizer {getattr(tok, 'name_or_path', '')!r} has no EOS token; RL needs one to end completions"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def check_finite_weights(modules, what: str) -> None:
    """Refuse (one line) to go on with weights holding NaN or ±inf: ``what`` says where (a save
    path, a loaded model). Sharded parameters are checked shard by shard, the verdict reduced over
    processes, so every process raises together."""
    from .. import distributed

    bad = []
    for prefix, module in modules.items() if isinstance(modules, dict) else [("", modules)]:
        for name, p in module.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if local.numel() and not bool(torch.isfinite(local.detach()).all()):
                bad.append(f"{prefix}.{name}" if prefix else name)
    if distributed.reduce_max(len(bad)) > 0:
        shown = ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise ValueError(
            f"{what}: the weights hold non-finite values (NaN or inf)"
            + (f" in {shown}" if bad else "")
            + "; refusing to use or save them"
        )


def load_causal_lm(source, dtype="float32"):
    """An ``AutoModelForCausalLM`` from a local directory, or a model object as given; dropout off.

    The path is checked before anything is loaded, so a typo is one clear line.
    """
    from transformers import AutoModelForCausalLM

    if isinstance(source, torch.nn.Module):
        model = source
        if dtype is not None:
            model = model.to(resolve_dtype(dtype))
    else:
        model = load_pretrained(AutoModelForCausalLM, source, dtype)
    check_finite_weights(model, f"model {source if isinstance(source, (str, Path)) else type(source).__name__}")
    return disable_dropout(model)


def load_pretrained(auto_class, source, dtype="float32", what: str = "model", **kwargs):
    """``auto_class.from_pretrained`` of a local directory, GGUF / ``package:`` source or Hub id
    (checked first: a typo is one clear line, a Hub id that cannot be fetched too)."""
    model = from_hub_or_dir(
        auto_class.from_pretrained, resolve_model_dir(source, what), what, dtype=resolve_dtype(dtype), **kwargs
    )
    check_finite_weights(model, f"{what} {source}")
    return model


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in backward (non-reentrant), through the current
    ``activation_checkpointing_enable`` where transformers has it, else its older name."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
