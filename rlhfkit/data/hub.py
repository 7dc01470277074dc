"""Datasets by Hugging Face Hub name: anything given as a dataset that is not a local path (and
does not look like one) and reads as a Hub id goes to ``datasets.load_dataset(name, subset,
split=split)``. Without network access that fails; the failure is one line saying the name was
treated as a Hub id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..models.sources import hub_error, is_hub_id


def default_split(name: str) -> str:
    """The split a Hub dataset is read from when none is named: 'test' for an eval dataset."""
    return "test" if name.startswith("eval") else "train"


def hub_dataset(name: str, subset: str | None = None, split: str | None = None, what: str = "train_dataset"):
    """``datasets.load_dataset(name, subset, split=split)`` as a ``datasets.Dataset`` (split
    default: ``default_split(what)``), or one ``ValueError`` line when it cannot be loaded."""
    import datasets

    split = split or default_split(what)
    try:
        dataset = datasets.load_dataset(name, subset, split=split)
    except Exception as err:
        raise hub_error(name, what, err) from None
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"{what} {name!r}: split {split!r} is not a single dataset (got {type(dataset).__name__})")
    return dataset


def resolve_dataset(source: Any, subset: str | None = None, split: str | None = None, what: str = "train_dataset"):
    """``source`` as given, or the Hub dataset it names (``is_hub_id``, and not an existing path)."""
    if isinstance(source, str) and not Path(source).exists() and is_hub_id(source):
        return hub_dataset(source, subset, split, what)
    return source
