"""Unpaired preference datasets for KTO: each row one completion with a thumbs-up or thumbs-down.

A row is ``{"prompt", "completion", "label"}`` (TRL's unpaired preference format): the prompt a
string or a list of chat messages (``prompts.prompt_problem``), the completion a non-empty string
or a list of chat messages whose last one is the assistant's reply (as a preference row's
``chosen``), ``label`` true (desirable) or false (undesirable). Every other column is kept.

A *paired* dataset (its first row has ``chosen`` and ``rejected``; the prompt explicit or implicit,
``preferences.with_prompt``) is checked as preference pairs and split in two as TRL's
``unpair_preference_dataset`` splits it: in blocks of ``UNPAIR_BLOCK`` pairs (its ``Dataset.map``
batch), each block's chosen completions (label true), then its rejected ones (label false) — the
same rows in the same order as TRL's, which matters where the order sets KTO's mismatched pairs.

Sources and error messages are those of ``prompts.load_prompt_dataset``: a ``ValueError`` names the
source, the row (1-based for files, 0-based index in memory) and the field, before any model is
loaded.
"""

from __future__ import annotations

from typing import Any

from .preferences import preference_row_problem, read_completion, with_prompt
from .prompts import load_checked_rows, prompt_problem, short_repr, type_name

UNPAIRED_FIELDS = ("prompt", "completion", "label")
UNPAIR_BLOCK = 1000  # datasets.Dataset.map's default batch size, which TRL's unpairing runs in


def load_unpaired_dataset(source: Any, name: str = "train_dataset") -> list[dict]:
    """Load and check an unpaired preference dataset (or a paired one, split in two); returns one
    dict per row with ``prompt``, ``completion``, ``label`` and the row's other columns.

    Raises ``ValueError`` naming source, row and field for: an empty dataset, a row that is not an
    object, a missing ``prompt`` / ``completion`` / ``label``, a malformed prompt, an empty or
    malformed completion, a ``label`` that is not true or false; for paired rows, what
    ``preferences.load_preference_dataset`` refuses."""
    first: dict = {}

    def problem(row: dict) -> str | None:
        if not first:
            first.update(paired=_is_paired(row))
        return preference_row_problem(with_prompt(row)) if first["paired"] else unpaired_row_problem(row)

    rows = load_checked_rows(source, name, problem)
    return unpair(rows) if first["paired"] else rows


def _is_paired(row: dict) -> bool:
    """TRL's test, on the first row: ``chosen`` and ``rejected`` present."""
    return "chosen" in row and "rejected" in row


def unpaired_row_problem(row: dict) -> str | None:
    """What is wrong with one unpaired row (naming the field), or ``None``."""
    for field in UNPAIRED_FIELDS:
        if field not in row:
            present = ", ".join(map(repr, row)) or "none"
            return (
                f"missing field {field!r} (fields present: {present}); expected 'prompt', 'completion' and "
                "'label' (or a paired dataset: 'chosen' and 'rejected')"
            )
    problem = prompt_problem(row["prompt"])
    if problem:
        return f"field 'prompt': {problem}"
    _, problem = read_completion(row["completion"])
    if problem:
        return f"field 'completion': {problem}"
    label = row["label"]
    if not isinstance(label, bool):
        expected = "expected true (desirable) or false (undesirable)"
        return f"field 'label': {expected}, got {type_name(label)} {short_repr(label)}"
    return None


def unpair(pairs: list[dict]) -> list[dict]:
    """Preference rows as unpaired rows, in TRL's order (the module docstring); other columns are
    repeated on both rows of a pair."""
    out = []
    for start in range(0, len(pairs), UNPAIR_BLOCK):
        block = [with_prompt(p) for p in pairs[start : start + UNPAIR_BLOCK]]
        for side, label in (("chosen", True), ("rejected", False)):
            for row in block:
                rest = {k: v for k, v in row.items() if k not in ("chosen", "rejected")}
                out.append({**rest, "completion": row[side], "label": label})
    return out
