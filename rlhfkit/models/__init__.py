"""Models: loading, dropout off, per-token log-probs of responses, scalar heads (critic, reward)."""

from .heads import ScalarModel
from .lm_head import streamable
from .loading import (
    disable_dropout,
    enable_activation_checkpointing,
    freeze,
    load_causal_lm,
    load_tokenizer,
    soft_update,
)
from .policy import ResponseForward, forward_response

__all__ = [
    "ResponseForward",
    "ScalarModel",
    "disable_dropout",
    "enable_activation_checkpointing",
    "forward_response",
    "freeze",
    "soft_update",
    "load_causal_lm",
    "load_tokenizer",
    "streamable",
]
