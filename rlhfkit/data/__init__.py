"""Datasets for training: prompt datasets for the RL loop (JSONL, JSON, Parquet, ``datasets``
objects, lists of dicts), prompt checks and chat-template rendering."""

from .prompts import (
    CHAT_ROLES,
    DataFileNotFoundError,
    load_prompt_dataset,
    prompt_problem,
    read_jsonl,
    render_prompt,
)

__all__ = [
    "CHAT_ROLES",
    "DataFileNotFoundError",
    "load_prompt_dataset",
    "prompt_problem",
    "read_jsonl",
    "render_prompt",
]
