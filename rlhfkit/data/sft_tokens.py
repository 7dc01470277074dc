"""Tokenised SFT rows: ``{"input_ids": [...]}`` with optional columns that say which tokens are
trained, under TRL's names (a dataset TRL's ``SFTTrainer`` takes as it is, already tokenised):

- ``labels``: a token is trained where its label is not -100; a label is the token itself or -100
  (rlhfkit trains a row on its own tokens: another id is refused);
- without ``labels``: ``assistant_masks`` (1 on the assistant's tokens) always applies, and
  ``completion_mask`` (1 on the completion's) when ``completion_only`` (the config's
  ``completion_only_loss``); a token is trained where every applicable mask is 1 — every token
  when none applies;
- ``attention_mask``: accepted when every value is 1 (a row's padding is not part of it: strip it).

A row with ``input_ids`` is read as tokens whatever else it holds (as TRL reads it). The first
token is never trained (nothing predicts it); ``max_length`` keeps a row's first tokens (TRL's
``keep_start``). The ids must be the model's: ``check_token_ids`` compares them with its vocabulary
once it is loaded.
"""

from __future__ import annotations

import numbers
from typing import Any

from .prompts import short_repr, type_name
from .sft_turns import TurnsEncoded

MASKS = ("completion_mask", "assistant_masks")
COLUMNS = ("labels", *MASKS, "attention_mask")


def tokens_problem(row: dict) -> tuple[str | None, str | None]:
    """(field, what is wrong with it) for a malformed tokenised row, or ``(None, None)``."""
    ids = row["input_ids"]
    if not isinstance(ids, (list, tuple)) or not ids:
        return "input_ids", f"expected a non-empty list of token ids, got {type_name(ids)} {short_repr(ids)}"
    bad = next((i for i, t in enumerate(ids) if not _is_int(t) or t < 0), None)
    if bad is not None:
        return "input_ids", f"position {bad}: expected a token id (an integer >= 0), got {short_repr(ids[bad])}"
    for column in COLUMNS:
        values = row.get(column)
        if values is None:
            continue
        if not isinstance(values, (list, tuple)) or len(values) != len(ids):
            return column, f"expected a list as long as input_ids ({len(ids)}), got {short_repr(values)}"
        allowed = {-100} if column == "labels" else {0, 1} if column != "attention_mask" else {1}
        for j, (v, t) in enumerate(zip(values, ids)):
            if not _is_int(v) or (v not in allowed and not (column == "labels" and v == t)):
                expected = {
                    "labels": f"the token ({t}) or -100",
                    "attention_mask": "1 (strip a row's padding)",
                }.get(column, "0 or 1")
                return column, f"position {j}: expected {expected}, got {short_repr(v)}"
    return None, None


def encode_tokens(row: dict, max_length: int | None, completion_only: bool = True) -> TurnsEncoded:
    """A checked tokenised row as an example (the module docstring has which tokens are trained),
    its first ``max_length`` tokens."""
    ids = [int(t) for t in row["input_ids"]]
    if row.get("labels") is not None:
        mask = [int(label != -100) for label in row["labels"]]
    else:
        masks = [row[c] for c in MASKS if row.get(c) is not None and (c != "completion_mask" or completion_only)]
        mask = [int(all(bits)) for bits in zip(*masks)] if masks else [1] * len(ids)
    cut = max_length is not None and len(ids) > max_length
    if cut:
        ids, mask = ids[:max_length], mask[:max_length]
    first = next((j for j, m in enumerate(mask) if m), len(ids))
    return TurnsEncoded(ids, first, cut, cut, mask=tuple(mask))


def check_token_ids(examples: list, vocab_size: int, name: str) -> None:
    """One line naming the first example (0-based) with a token id outside the model's vocabulary
    of ``vocab_size`` ids (a tokenised row made with another tokenizer)."""
    for i, e in enumerate(examples):
        top = max(e.input_ids)
        if top >= vocab_size:
            raise ValueError(
                f"{name}: example {i} (0-based) holds token id {top}, outside the model's vocabulary of "
                f"{vocab_size} ids (tokenised with another tokenizer?)"
            )


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral)  # Python's and numpy's integers (and bools, for masks)
