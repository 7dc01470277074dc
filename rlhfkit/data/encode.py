"""Tokenising a (prompt, completion) pair for SFT and reward-model training.

The completion always ends with the tokenizer's EOS token, appended by id (never by text), so the
model learns to stop even when pad and EOS share an id: masks are built by position, not value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .prompts import render_prompt


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    prompt_len: int  # tokens before the completion (their labels are ignored)
    truncated: bool  # the completion lost its end (and its EOS) to max_length


def completion_text(completion: Any) -> str:
    """A completion given as text, or as a list of messages whose last one is the assistant's."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"a completion must be a string or a list of chat messages, got {type(completion).__name__}")


def split_messages(messages: list[dict]) -> tuple[list[dict], str]:
    """A chat ``messages`` row → (the conversation before the last assistant turn, that turn's text)."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("a 'messages' row must end with an assistant message (the completion to learn)")
    return list(messages[:-1]), messages[-1]["content"]


def encode_pair(prompt: Any, completion: Any, tokenizer, max_length: int | None = None) -> Encoded:
    """``prompt`` (text or chat messages, rendered with the chat template) + ``completion`` + EOS.

    Truncation policy when longer than ``max_length``: the prompt loses tokens from its *start*
    first (its end, next to the completion, matters most) down to one token; then the completion
    is cut at its end, and ``truncated`` is set (its EOS is gone: the model is not taught to stop
    at an arbitrary cut).
    """
    prompt_ids = tokenizer(render_prompt(prompt, tokenizer), add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion_text(completion), add_special_tokens=False)["input_ids"]
    completion_ids = completion_ids + [tokenizer.eos_token_id]
    truncated = False
    if max_length is not None and len(prompt_ids) + len(completion_ids) > max_length:
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        excess = len(prompt_ids) + len(completion_ids) - max_length
        cut = max(0, min(excess, len(prompt_ids) - 1))  # keep one prompt token (none if it had none)
        prompt_ids = prompt_ids[cut:]
        if excess > cut:
            completion_ids = completion_ids[: len(completion_ids) - (excess - cut)]
            truncated = True
    return Encoded(prompt_ids + completion_ids, len(prompt_ids), truncated)
