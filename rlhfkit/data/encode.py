"""Tokenising a (prompt, completion) pair for SFT and reward-model training, and the RL loop's
prompts (``tokenize_prompts``, under the length limit ``prompt_limit``).

The completion always ends with the tokenizer's EOS token, appended by id (never by text), so the
model learns to stop even when pad and EOS share an id: masks are built by position, not value.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from .. import distributed
from .prompts import render_prompt


@dataclass(frozen=True)
class Encoded:
    input_ids: list[int]
    prompt_len: int  # tokens before the completion (their labels are ignored)
    truncated: bool  # the completion lost its end (and its EOS) to max_length
    cut: bool = False  # tokens were lost to max_length: the prompt's start, and maybe the completion's end


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
    truncated, over = False, False
    if max_length is not None and len(prompt_ids) + len(completion_ids) > max_length:
        over = True
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        excess = len(prompt_ids) + len(completion_ids) - max_length
        cut = max(0, min(excess, len(prompt_ids) - 1))  # keep one prompt token (none if it had none)
        prompt_ids = prompt_ids[cut:]
        if excess > cut:
            completion_ids = completion_ids[: len(completion_ids) - (excess - cut)]
            truncated = True
    return Encoded(prompt_ids + completion_ids, len(prompt_ids), truncated, over)


def warn_once(message: str) -> None:
    """``warning: message`` on stderr, once: from the main process only (every process encodes the
    same data). Not ``warnings.warn``, which adds the source line (two lines on the terminal)."""
    if distributed.launch_rank() == 0:
        print(f"warning: {message}", file=sys.stderr, flush=True)


def note_cut(name: str, cut: int, total: int, kind: str, max_length: int | None, what: str) -> None:
    """Say how many of ``total`` rows (``kind``: 'rows', 'pairs') lost tokens to ``max_length``."""
    if cut:
        warn_once(
            f"{name}: {cut} of {total} {kind} are longer than max_length={max_length} tokens and were cut "
            f"({what}); raise max_length to keep them whole"
        )


def note_unknown(name: str, token_lists: list, tokenizer, kind: str = "rows") -> int:
    """Say how many rows hold the tokenizer's unknown token (text it has no tokens for; only for a
    tokenizer that has one). ``token_lists``: per row, one id list or a tuple of them. Returns the count."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return 0
    rows = [ids if isinstance(ids, tuple) else (ids,) for ids in token_lists]
    count = sum(1 for parts in rows if any(unk in part for part in parts))
    if count:
        warn_once(
            f"{name}: {count} of {len(rows)} {kind} hold text the tokenizer does not know, read as its unknown "
            f"token {tokenizer.unk_token!r}; check the data's characters, or use a tokenizer that covers them"
        )
    return count


def prompt_limit(max_prompt_length: int | None, max_new_tokens: int, model_config) -> int | None:
    """The prompt-length limit in tokens: ``max_prompt_length`` when set, else what the model can
    take — its ``max_position_embeddings`` minus ``max_new_tokens`` (None when the config has no
    such bound)."""
    if max_prompt_length is not None:
        return max_prompt_length
    positions = getattr(model_config, "max_position_embeddings", None) if model_config is not None else None
    if not isinstance(positions, int):
        return None
    if positions <= max_new_tokens:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} leaves no room for a prompt: the model takes "
            f"{positions} positions (max_position_embeddings)"
        )
    return positions - max_new_tokens


def tokenize_prompts(
    rows: list[dict], tokenizer, limit: int | None, truncate: str | None = None, name: str = "train_dataset"
) -> list[list[int]]:
    """Each row's prompt rendered (chat template) and tokenised once. A prompt longer than
    ``limit`` tokens (``prompt_limit``) is refused in one line naming its row, or, with
    ``truncate='left'`` (``truncate_prompts``), loses its start, keeping the end next to the
    response."""
    ids = []
    for i, row in enumerate(rows):
        tokens = tokenizer(render_prompt(row["prompt"], tokenizer), add_special_tokens=False)["input_ids"]
        if limit is not None and len(tokens) > limit:
            if truncate != "left":
                raise ValueError(
                    f"{name}: row index {i} (0-based): the prompt is {len(tokens)} tokens, longer than "
                    f"{limit} (max_prompt_length, by default the model's positions minus "
                    "max_new_tokens); set truncate_prompts=left to keep its last tokens, or shorten it"
                )
            tokens = tokens[-limit:]
        ids.append(tokens)
    note_unknown(name, ids, tokenizer, "prompts")
    return ids
