"""Prompt datasets for the RL loop: read rows from JSONL / JSON / Parquet files, a
``datasets.Dataset`` or a list of dicts, check every prompt before training starts, and render
chat prompts with the tokenizer's chat template.

A prompt is either a non-empty string or a non-empty list of chat messages
``{"role": "system" | "user" | "assistant" | "tool", "content": str}`` (the conversational format
of TRL and the Hugging Face chat templates). Every other column of a row is kept: reward functions
receive them as keyword lists (e.g. a reference ``answer`` for a verifiable reward).

Errors are one-line ``ValueError``s naming the source (file path or dataset name), the row and
the field — files count rows from 1 (JSONL: the line number), in-memory data from 0 — so a bad
row is found without a debugger, before any model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .reasoning_gym import prompt_rows

if TYPE_CHECKING:
    import datasets

CHAT_ROLES = ("system", "user", "assistant", "tool")


class DataFileNotFoundError(ValueError, FileNotFoundError):
    """A data file that does not exist: a ``ValueError`` like every input error here, and a
    ``FileNotFoundError`` for callers that catch that."""


def read_jsonl(path: str | Path) -> list[dict]:
    """Read a JSON Lines file: every non-blank line one JSON object; returns the objects in order.

    The file is read as bytes and decoded line by line, so invalid UTF-8, invalid JSON and a line
    that is not an object are each reported with the file and its 1-based line number.
    """
    return [row for _, row in read_jsonl_numbered(Path(path))]


def read_jsonl_numbered(path: Path) -> list[tuple[int, dict]]:
    """(1-based line number, object) for every non-blank line of a JSONL file."""
    rows = []
    for lineno, raw in enumerate(_read_bytes(path).splitlines(), start=1):
        where = f"{path}: line {lineno}"
        try:
            # utf-8-sig drops a byte-order mark some editors put at the start of the file.
            text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where}: not valid UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r})") from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type_name(obj)}")
        rows.append((lineno, obj))
    return rows


def _check_file(path: Path) -> None:
    """A missing path or a directory is a one-line error naming the path."""
    if not path.exists():
        raise DataFileNotFoundError(f"data file not found: {path}")
    if path.is_dir():
        raise ValueError(f"expected a data file, got a directory: {path}")


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, after ``_check_file``."""
    _check_file(path)
    return path.read_bytes()


def _read_json_list(path: Path) -> list[tuple[str, Any]]:
    """Rows of a ``.json`` file holding one list of objects, labelled with 1-based row numbers."""
    try:
        data = json.loads(_read_bytes(path).decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid UTF-8 (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of objects, got {type_name(data)}")
    return [(f"row {i} (1-based)", row) for i, row in enumerate(data, start=1)]


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    """Rows of a Parquet file (via pyarrow, a dependency of ``datasets``), 1-based row numbers."""
    _check_file(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises its own error types for a corrupt file
        raise ValueError(f"{path}: cannot read Parquet: {type(e).__name__}: {e}") from e
    return [(f"row {i} (1-based)", row) for i, row in enumerate(rows, start=1)]


def labelled_rows(source: Any, name: str) -> tuple[str, list[tuple[str, Any]]]:
    """(source label for messages, [(row label, row)]) for every supported kind of ``source``
    (a file, a Hub id, a list of dicts, a ``datasets.Dataset``): every dataset loader of
    ``rlhfkit.data`` reads its rows through this, so they all accept the same sources."""
    if isinstance(source, str) and not Path(source).exists():
        from .hub import resolve_dataset

        resolved = resolve_dataset(source, what=name)  # a Hub id: its default split
        if resolved is not source:
            return labelled_rows(resolved, f"{name} {source!r} (Hub)")
    if isinstance(source, (str, Path)):
        path = Path(source)
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return str(path), [(f"line {n}", row) for n, row in read_jsonl_numbered(path)]
        if suffix == ".json":
            return str(path), _read_json_list(path)
        if suffix == ".parquet":
            return str(path), _read_parquet(path)
        raise ValueError(
            f"{name}: unsupported file type {suffix or '(none)'!r} for {path}; expected .jsonl, .json or .parquet"
        )
    if isinstance(source, (list, tuple)):
        return name, [(f"row index {i} (0-based)", row) for i, row in enumerate(source)]
    if type(source).__name__ == "DatasetDict":
        raise ValueError(
            f"{name}: got a DatasetDict with splits {sorted(source)}; pass one split, e.g. dataset['train']"
        )
    dataset_cls = _datasets_class()
    if dataset_cls is not None and isinstance(source, dataset_cls):
        return name, [(f"row index {i} (0-based)", row) for i, row in enumerate(source.to_list())]
    raise ValueError(
        f"{name}: expected a datasets.Dataset, a list of dicts or a path to a "
        f".jsonl / .json / .parquet file, got {type_name(source)}"
    )


def _datasets_class() -> type[datasets.Dataset] | None:
    """``datasets.Dataset``, imported lazily (it is slow to import), or ``None`` if not installed."""
    try:
        import datasets
    except ImportError:
        return None
    return datasets.Dataset


def load_prompt_dataset(
    source: Any, prompt_column: str = "prompt", name: str = "train_dataset", train_rows: list[dict] | None = None
) -> list[dict]:
    """Load and check a prompt dataset; returns one dict per row with all of its columns.

    Args:
        source: a ``datasets.Dataset``, a list of dicts, or a path (str / ``Path``) to a ``.jsonl``
            file (one object per line), a ``.json`` file (a list of objects) or a ``.parquet`` file.
        prompt_column: the field holding the prompt (a string or a list of chat messages).
        name: how in-memory data is named in error messages (file sources use their path).

    Raises ``ValueError`` naming the source, the row (1-based for files, 0-based index for
    in-memory data) and the field when the source is empty, a row is not an object, or a prompt
    is missing or malformed.

    A ``"reasoning_gym:<task>"`` string or a ``{"reasoning_gym": ...}`` mapping generates the rows of
    reasoning-gym tasks (``data/reasoning_gym.py``; an eval set when ``name`` starts with "eval",
    less every question of ``train_rows``, the loaded training rows).
    """
    source = prompt_rows(source, name, train_rows)  # reasoning-gym sources as rows; any other source unchanged

    def problem(row: dict) -> str | None:
        if prompt_column not in row:
            present = ", ".join(map(repr, row)) or "none"
            return f"missing field {prompt_column!r} (fields present: {present})"
        found = prompt_problem(row[prompt_column])
        return f"field {prompt_column!r}: {found}" if found else None

    return load_checked_rows(source, name, problem)


def load_checked_rows(source: Any, name: str, row_problem) -> list[dict]:
    """Rows of ``source`` (see ``load_prompt_dataset``), each a dict that ``row_problem(row)``
    finds nothing wrong with (it returns a sentence, or None); the first problem is raised as a
    ``ValueError`` naming the source and the row. The loaders of every dataset kind share this."""
    label, rows = labelled_rows(source, name)
    if not rows:
        raise ValueError(f"{label}: the dataset is empty (no rows)")
    out = []
    for where, row in rows:
        if not isinstance(row, dict):
            raise ValueError(f"{label}: {where}: expected an object (dict), got {type_name(row)}")
        problem = row_problem(row)
        if problem:
            raise ValueError(f"{label}: {where}: {problem}")
        out.append(dict(row))
    return out


def prompt_problem(prompt: Any) -> str | None:
    """What is wrong with ``prompt`` (a sentence), or ``None`` when it is a non-empty string or
    a non-empty list of well-formed chat messages."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "the prompt is an empty (or whitespace-only) string"
    if not isinstance(prompt, (list, tuple)):
        return f"expected a string or a list of chat messages, got {type_name(prompt)} {short_repr(prompt)}"
    if not prompt:
        return "the prompt is an empty list of chat messages"
    for i, msg in enumerate(prompt):
        problem = message_problem(msg)
        if problem:
            return f"message {i} (0-based): {problem}"
    return None


def message_problem(msg: Any) -> str | None:
    """What is wrong with one chat message (``role`` and string ``content``), or ``None``;
    the prompt, preference and multi-turn SFT checks share it."""
    if not isinstance(msg, dict):
        return f"expected a dict with 'role' and 'content', got {type_name(msg)} {short_repr(msg)}"
    role, content = msg.get("role"), msg.get("content")
    if role not in CHAT_ROLES:
        return f"'role' must be one of {', '.join(CHAT_ROLES)}, got {short_repr(role)}"
    if not isinstance(content, str):
        return f"'content' must be a string, got {type_name(content)} {short_repr(content)}"
    return None


def render_prompt(prompt: str | list[dict], tokenizer: Any) -> str:
    """The text the policy continues: a string prompt unchanged; a list of chat messages rendered
    with ``tokenizer.apply_chat_template(..., tokenize=False, add_generation_prompt=True)`` (so
    the text ends where the assistant's reply starts)."""
    if isinstance(prompt, str):
        return prompt
    problem = prompt_problem(prompt)
    if problem:
        raise ValueError(f"render_prompt: {problem}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"render_prompt: the prompt is a list of chat messages but the tokenizer "
            f"({type(tokenizer).__name__}) has no chat template; set tokenizer.chat_template or "
            "use plain-string prompts"
        )
    return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)


def type_name(x: Any) -> str:
    """The name of ``x``'s type in an error message (``null`` for None, as JSON says)."""
    return "null" if x is None else type(x).__name__


def short_repr(x: Any, limit: int = 60) -> str:
    """``repr(x)`` cut to ``limit`` characters, for error messages."""
    text = repr(x)
    return text if len(text) <= limit else text[: limit - 3] + "..."
