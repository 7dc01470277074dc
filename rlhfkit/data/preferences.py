"""Preference datasets for reward-model training, and completion sets to centre a reward model on.

A preference row is ``{"prompt", "chosen", "rejected"}`` with an optional ``margin`` (TRL's
explicit-prompt preference format): the prompt is a string or a list of chat messages (checked
with ``prompt_problem``); ``chosen`` and ``rejected`` are non-empty strings, or lists of chat
messages whose last one is the assistant's reply (its content is the completion); ``margin`` is a
finite number — how much better ``chosen`` is, for the margin loss of Llama 2
(arXiv:2307.09288, eq. 2); null means no margin for that row. Every other column is kept.
A row without ``prompt`` whose ``chosen`` and ``rejected`` start alike (TRL's implicit-prompt
format: two conversations, or two texts) has that shared start as its prompt (``with_prompt``).
A chat completion may hold the assistant's tool calls before its reply: such a message's
``content`` may be null. A row with ``chosen_ids`` and ``rejected_ids`` (TRL's tokenised preference
rows; ``prompt_ids`` too for DPO) is already tokenised (``is_tokenized``): non-empty lists of token
ids, used as they are.

Sources and error messages are those of ``prompts.load_prompt_dataset``: ``datasets.Dataset``,
lists of dicts, ``.jsonl`` / ``.json`` / ``.parquet`` files; a ``ValueError`` names the source, the
row (1-based for files, 0-based index in memory) and the field, before any model is loaded.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from .encode import split_messages
from .prompts import labelled_rows, load_checked_rows, message_problem, prompt_problem, short_repr, type_name

PREFERENCE_FIELDS = ("prompt", "chosen", "rejected")


def load_preference_dataset(source: Any, name: str = "train_dataset") -> list[dict]:
    """Load and check a preference dataset; returns one dict per row with all of its columns.

    Args:
        source: a ``datasets.Dataset``, a list of dicts, or a path to a ``.jsonl``, ``.json`` or
            ``.parquet`` file.
        name: how in-memory data is named in error messages (file sources use their path).

    Raises ``ValueError`` naming source, row and field for: an empty dataset, a row that is not an
    object, a missing ``prompt`` / ``chosen`` / ``rejected``, a malformed prompt, an empty or
    malformed completion, ``chosen`` equal to ``rejected`` (a pair that teaches nothing), and a
    ``margin`` that is not a finite number. Unreadable files (missing, not UTF-8, bad JSON) are
    reported by the readers of ``prompts.py``.
    """
    rows = load_checked_rows(source, name, lambda row: preference_row_problem(with_prompt(row)))
    return [with_prompt(row) for row in rows]


def with_prompt(row: Any) -> Any:
    """An implicit-prompt row (no ``prompt``; ``chosen`` and ``rejected`` two message lists, or two
    strings, with a common start) as an explicit one: the longest common start is the prompt
    (TRL's ``extract_prompt``: a text prompt leaves a space before the completions). Any other
    row as it is."""
    if not isinstance(row, dict) or "prompt" in row or not {"chosen", "rejected"} <= set(row):
        return row
    chosen, rejected = row["chosen"], row["rejected"]
    if not (
        isinstance(chosen, str) and isinstance(rejected, str) or isinstance(chosen, list) and isinstance(rejected, list)
    ):
        return row
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n and isinstance(chosen, str) and chosen[n - 1] == " ":
        n -= 1
    return {**row, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]} if n else row


TOKENIZED_FIELDS = ("chosen_ids", "rejected_ids")


def is_tokenized(row: Any) -> bool:
    """Whether ``row`` is a tokenised preference row (``chosen_ids`` and ``rejected_ids``)."""
    return isinstance(row, dict) and all(field in row for field in TOKENIZED_FIELDS)


def preference_row_problem(row: Any) -> str | None:
    """What is wrong with one preference row (naming the field), or ``None``."""
    if not isinstance(row, dict):
        return f"expected an object (dict), got {type_name(row)}"
    if is_tokenized(row):
        return _tokenized_problem(row)
    for field in PREFERENCE_FIELDS:
        if field not in row:
            present = ", ".join(map(repr, row)) or "none"
            return f"missing field {field!r} (fields present: {present})"
    problem = prompt_problem(row["prompt"])
    if problem:
        return f"field 'prompt': {problem}"
    texts = {}
    for field in ("chosen", "rejected"):
        text, problem = read_completion(row[field])
        if problem:
            return f"field {field!r}: {problem}"
        texts[field] = text
    if texts["chosen"] == texts["rejected"]:
        same = short_repr(texts["chosen"])
        return f"fields 'chosen' and 'rejected' are the same completion {same}: the pair teaches nothing"
    return _margin_problem(row)


def _margin_problem(row: dict) -> str | None:
    if row.get("margin") is not None:  # null: no margin for this row (a column with gaps)
        margin = row["margin"]
        if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not math.isfinite(margin):
            return f"field 'margin': expected a finite number, got {type_name(margin)} {short_repr(margin)}"
    return None


def _tokenized_problem(row: dict) -> str | None:
    """What is wrong with a tokenised row: each of its id fields a list of ints, the two sides non-empty."""
    for field in ("prompt_ids", *TOKENIZED_FIELDS):
        if field not in row:
            continue
        ids = row[field]
        if not isinstance(ids, (list, tuple)) or not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids
        ):
            return f"field {field!r}: expected a list of token ids, got {type_name(ids)} {short_repr(ids)}"
        if field != "prompt_ids" and not ids:
            return f"field {field!r}: the completion is an empty list of token ids"
    return _margin_problem(row)


def read_completion(value: Any) -> tuple[str, str | None]:
    """(completion text, problem or None) for a string or a list of messages ending with the assistant's
    (the completions of preference rows, of unpaired rows: ``unpaired.py``, and of completion sets)."""
    if isinstance(value, str):
        return value, (None if value.strip() else "the completion is an empty (or whitespace-only) string")
    if not isinstance(value, (list, tuple)):
        return "", f"expected a string or a list of chat messages, got {type_name(value)} {short_repr(value)}"
    if not value:
        return "", "the completion is an empty list of chat messages"
    for i, msg in enumerate(value):
        problem = message_problem(msg) if i == len(value) - 1 or not _tool_calls_only(msg) else None
        if problem:
            return "", f"message {i} (0-based): {problem}"
    last = value[-1]
    if last["role"] != "assistant":
        return "", f"the last message must be the assistant's (the completion), got role {last['role']!r}"
    if not last["content"].strip():
        return "", "the assistant's message is empty (or whitespace-only)"
    return last["content"], None


def _tool_calls_only(msg: Any) -> bool:
    """An assistant message holding tool calls and no text (``content`` null or absent): the
    chat template renders its calls."""
    return (
        isinstance(msg, dict)
        and msg.get("role") == "assistant"
        and bool(msg.get("tool_calls"))
        and msg.get("content") is None
    )


def load_completions(source: Any, name: str = "center_dataset") -> list[dict]:
    """Load (prompt, completion) pairs to score, e.g. the SFT data a reward model is centred on.

    Rows may be plain strings (a completion with an empty prompt; in-memory lists only),
    ``{"prompt", "completion"}`` dicts, chat ``{"messages"}`` dicts (the last, assistant message
    is the completion) or ``{"text"}`` dicts (a completion with an empty prompt). Returns
    ``[{"prompt": ..., "completion": ...}]``; errors name source, row and field.
    """
    label, rows = labelled_rows(source, name)
    if not rows:
        raise ValueError(f"{label}: the dataset is empty (no rows)")
    out = []
    for where, row in rows:
        pair, problem = _completion_row(row)
        if problem:
            raise ValueError(f"{label}: {where}: {problem}")
        assert pair is not None  # _completion_row gives a row or a problem
        out.append(pair)
    return out


def _completion_row(row: Any) -> tuple[dict | None, str | None]:
    """One row of a completion set as ``{"prompt", "completion"}``, or what is wrong with it (naming
    the field), by its form: a string, or a dict of ``messages``, of ``text`` or of ``prompt`` and
    ``completion``."""
    if isinstance(row, str):
        return {"prompt": "", "completion": row}, (None if row.strip() else "the text is an empty string")
    if not isinstance(row, dict):
        return None, f"expected a string or an object (dict), got {type_name(row)}"
    if "messages" in row:
        return _messages_row(row)
    if "text" in row and "completion" not in row:
        return _text_row(row)
    return _prompt_completion_row(row)


def _messages_row(row: dict) -> tuple[dict | None, str | None]:
    """A chat row: the last, assistant message is the completion, the messages before it the prompt."""
    text, problem = read_completion(row["messages"])
    if problem:
        return None, f"field 'messages': {problem}"
    return {"prompt": split_messages(list(row["messages"]))[0] or "", "completion": text}, None


def _text_row(row: dict) -> tuple[dict | None, str | None]:
    """A ``text`` row: a completion with an empty prompt."""
    text = row["text"]
    if not isinstance(text, str) or not text.strip():
        return None, f"field 'text': expected a non-empty string, got {type_name(text)} {short_repr(text)}"
    return {"prompt": "", "completion": text}, None


def _prompt_completion_row(row: dict) -> tuple[dict | None, str | None]:
    """A ``{"prompt", "completion"}`` row, each checked as a preference row's prompt and completion are."""
    for field in ("prompt", "completion"):
        if field not in row:
            present = ", ".join(map(repr, row)) or "none"
            return None, (
                f"missing field {field!r} (fields present: {present}); expected 'prompt' and "
                "'completion', 'messages' or 'text'"
            )
    problem = prompt_problem(row["prompt"])
    if problem:
        return None, f"field 'prompt': {problem}"
    text, problem = read_completion(row["completion"])
    if problem:
        return None, f"field 'completion': {problem}"
    return {"prompt": row["prompt"], "completion": text}, None
