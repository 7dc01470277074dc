"""The dataset forms TRL 1.16's ``SFTTrainer`` takes, as the SFT drop-in (``sft.py``) hands them to
rlhfkit's SFT loader, and TRL's rules for their tokens (``trl/trainer/sft_trainer.py``,
``_prepare_dataset``):

- ``formatting_func(row)`` makes each row a ``{"text"}`` row, and ``dataset_text_field`` names the
  text column; a tokenised dataset (``input_ids``) is taken as it is, the function ignored with
  TRL's warning;
- ``{"conversations": [{"from", "value"}, ...]}`` rows are ``{"messages": [{"role", "content"}]}``
  rows (TRL's ``maybe_convert_to_chatml``; the roles are kept as they are written);
- a ``Dataset.with_transform()`` is refused with TRL's message (its transform would be read once
  and kept);
- ``dataset_kwargs={"skip_prepare_dataset": True}``: the rows are trainer-ready, tokenised
  (``input_ids``, ``labels``), and are neither truncated nor filtered; mask columns without
  ``labels`` are refused with TRL's message;
- text rows, and chat rows when ``assistant_only_loss`` is off, are tokenised as TRL tokenises them
  (``trl_text_row``, ``trl_chat_row``: the row's ``chat_template_kwargs`` too), and ``max_length`` keeps each
  example's first tokens (``keep_start``; TRL's ``truncation_mode="keep_start"``);
- ``trainer.train_dataset`` / ``eval_dataset`` are TRL's prepared datasets (``sft_view``): ``input_ids``
  and ``labels`` (the token, or -100 where it is not trained), and ``seq_lengths`` for rows packed
  example by example.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

from ..data.encode import Encoded
from ..data.prompts import labelled_rows
from ..data.sft import IGNORE_INDEX, trained_flags
from ..data.sft_turns import TurnsEncoded
from .supervised import trl_encode

MASK_COLUMNS = ("completion_mask", "assistant_masks")


def check_transform(dataset, skip_prepare: bool) -> None:
    """TRL's refusal of a ``Dataset.with_transform()`` (rlhfkit reads every dataset once, so with
    ``skip_prepare_dataset`` too: a random or stateful transform would be fixed at its first read)."""
    if type(dataset).__name__ != "Dataset" or getattr(dataset, "format", {}).get("type") != "custom":
        return
    if skip_prepare:
        raise ValueError(
            "SFTTrainer: a Dataset.with_transform() is not supported by rlhfkit, which reads every dataset "
            "once (the transform would be applied once, not at each access): materialize it with Dataset.map()"
        )
    raise ValueError(  # TRL's message
        "SFTTrainer cannot prepare a dataset that uses `Dataset.with_transform()`. The preparation pipeline "
        "calls `Dataset.map()`, which reads through the transform and can bake a random or stateful transform "
        "into the tokenized columns. Pass `dataset_kwargs={'skip_prepare_dataset': True}` and make the "
        "transform return trainer-ready examples, including tokenized fields, or materialize deterministic "
        "transforms with `Dataset.map()` before constructing the trainer."
    )


def trl_rows(dataset, field: str, formatting_func, name: str):
    """TRL's SFT rows as rlhfkit's loader reads them (the module docstring): a dataset needing none
    of the conversions as it is."""
    if isinstance(dataset, (str, bytes)) or dataset is None:
        return dataset  # a file path: rlhfkit's loader reads it
    rows = [row for _, row in labelled_rows(dataset, name)[1]]
    if not rows or not isinstance(rows[0], dict):
        return dataset  # rlhfkit's loader says what is wrong
    if "input_ids" in rows[0]:
        if formatting_func is not None:
            warnings.warn(  # TRL's warning
                "You passed a dataset that is already processed (contains an `input_ids` field) together with a "
                "formatting function. Therefore `formatting_func` will be ignored. Either remove the "
                "`formatting_func` or pass a dataset that is not already processed.",
                stacklevel=3,
            )
        return rows
    if formatting_func is not None:
        return [{"text": formatting_func(row)} for row in rows]
    out = []
    for row in rows:
        conversation = _from_value(row)
        if conversation is not None:
            row = {k: v for k, v in row.items() if k != "conversations"}
            row["messages"] = [{_CHATML.get(k, k): v for k, v in m.items()} for m in conversation]
        elif field != "text" and field in row and not {"prompt", "completion", "messages"} & set(row):
            row = {"text": row[field]}
        out.append(row)
    return out


_CHATML = {"from": "role", "value": "content"}


def _from_value(row: dict) -> list | None:
    """TRL's ``conversations`` column of from/value messages, when ``row`` has one."""
    conversation = row.get("conversations")
    if isinstance(conversation, list) and conversation and isinstance(conversation[0], dict):
        return conversation if {"from", "value"} <= set(conversation[0]) else None
    return None


def check_prepared(rows: list[dict], name: str) -> None:
    """``skip_prepare_dataset``: every row tokenised, and mask columns only with ``labels`` (TRL's
    message; ``name``: TRL's, 'train' or 'eval')."""
    for i, row in enumerate(rows):
        if "input_ids" not in row:
            raise ValueError(
                f"{name} dataset row index {i} (0-based) has no 'input_ids': with skip_prepare_dataset=True "
                "rows must be tokenised (input_ids, labels); drop skip_prepare_dataset to tokenise them"
            )
        if "labels" not in row and any(c in row for c in MASK_COLUMNS):
            raise ValueError(
                f"The {name} dataset has mask columns but no 'labels', and `skip_prepare_dataset=True` skips "
                "label building, so it would train on the full sequence. Add a 'labels' column (-100 for "
                "non-loss tokens) or drop `skip_prepare_dataset`."
            )


def is_text_row(row: dict) -> bool:
    """A ``{"text"}`` row, or a prompt-completion row of two texts (no chat messages, no tokens)."""
    if "messages" in row or "input_ids" in row:
        return False
    return "prompt" not in row or isinstance(row["prompt"], str) and isinstance(row["completion"], str)


def trl_text_row(row: dict, tokenizer, completion_only: bool) -> Encoded:
    """A text row as TRL tokenises it: every token trained, or for a prompt-completion row only
    the completion's (``completion_only``)."""
    if "prompt" in row:
        e = trl_encode(row["prompt"], row["completion"], tokenizer)
        return e if completion_only else replace(e, prompt_len=0)
    return replace(trl_encode("", row["text"], tokenizer), prompt_len=0)


def is_chat_row(row: dict) -> bool:
    """A ``messages`` row, or a prompt-completion row of chat messages (no tokens)."""
    return "input_ids" not in row and ("messages" in row or isinstance(row.get("prompt"), (list, tuple)))


def trl_chat_row(row: dict, tokenizer, completion_only: bool) -> Encoded:
    """A chat row as TRL tokenises it when ``assistant_only_loss`` is off: the whole conversation
    through the chat template (the row's ``tools``, a list or its JSON, and ``chat_template_kwargs``),
    no EOS added (the template ends the turn); every token trained, or for a prompt-completion row
    with ``completion_only`` those after where the prompt's rendering with the generation prompt
    and the conversation's part (TRL's ``common_prefix_length``)."""
    tools = row.get("tools")
    try:
        tools = json.loads(tools) if isinstance(tools, str) else tools
    except json.JSONDecodeError as e:
        raise ValueError(f"field 'tools': invalid JSON: {e.msg}") from None
    kwargs = {"tools": tools, **(row.get("chat_template_kwargs") or {})}

    def tokens(messages, **more) -> list[int]:
        out = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=True, **kwargs, **more)
        return list(out["input_ids"])

    if "messages" in row:
        return Encoded(tokens(row["messages"]), 0, False)
    ids = tokens([*row["prompt"], *row["completion"]])
    if not completion_only:
        return Encoded(ids, 0, False)
    prompt = tokens(row["prompt"], add_generation_prompt=True)
    n = next((j for j, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))
    return Encoded(ids, n, False)


def keep_start(e: Encoded, limit: int) -> Encoded:
    """``e``'s first ``limit`` tokens (TRL's ``keep_start``)."""
    if len(e.input_ids) <= limit:
        return e
    ids, start = e.input_ids[:limit], min(e.prompt_len, limit)
    if isinstance(e, TurnsEncoded):
        return replace(e, input_ids=ids, prompt_len=start, truncated=True, cut=True, mask=e.mask[:limit])
    return replace(e, input_ids=ids, prompt_len=start, truncated=True, cut=True)


def trains(e: Encoded) -> bool:
    """Whether ``e`` has a trained token (TRL's test: a label that is not -100)."""
    return any(e.mask) if isinstance(e, TurnsEncoded) else e.prompt_len < len(e.input_ids)


def sft_view(units: list[list[Encoded]], seq_lengths: bool):
    """A ``datasets.Dataset`` of TRL's prepared SFT rows for rlhfkit's training units (one example
    each, or packed): ``input_ids``, ``labels``, and with ``seq_lengths`` each example's length."""
    from datasets import Dataset

    columns = {
        "input_ids": [[t for e in unit for t in e.input_ids] for unit in units],
        "labels": [
            [t if f else IGNORE_INDEX for e in unit for t, f in zip(e.input_ids, trained_flags(e))] for unit in units
        ],
    }
    if seq_lengths:
        columns["seq_lengths"] = [[len(e.input_ids) for e in unit] for unit in units]
    return Dataset.from_dict(columns)
