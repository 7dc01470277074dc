"""The dataset forms TRL 1.16's SFT, DPO and reward trainers take, as rlhfkit's loaders read them,
and the prepared datasets TRL's trainers show as ``trainer.train_dataset`` / ``trainer.eval_dataset``.

- A ``datasets.IterableDataset`` (a streaming dataset) is read row by row: for training, only the
  rows ``max_steps`` optimizer steps take (``rows_per_step x max_steps``; TRL requires ``max_steps``
  for one, as its length is unknown), since a stream may be endless; for evaluation, to its end.
- ``eval_dataset`` may be one dataset, a ``DatasetDict`` / ``IterableDatasetDict`` or a dict of
  datasets: each is evaluated on its own, its metrics named ``eval_<name>_<metric>`` as
  ``transformers.Trainer`` names them (``eval_sets``).
- The prepared datasets are TRL's columns of the rows as rlhfkit tokenised them (``trl_view``): the
  reward model's ``chosen_ids`` / ``rejected_ids`` (and ``margin``), DPO's ``prompt_ids`` /
  ``chosen_ids`` / ``rejected_ids``, SFT's ``input_ids`` / ``completion_mask`` (1 where a token is
  trained; packed rows add ``seq_lengths``). Rows dropped for their length are absent, as in TRL.
"""

from __future__ import annotations

import itertools
from typing import Any


def is_iterable_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` is a ``datasets.IterableDataset`` (a stream of unknown length)."""
    return type(dataset).__name__ == "IterableDataset" and hasattr(dataset, "__iter__")


def stream_rows(dataset: Any, limit: int | None = None) -> Any:
    """An ``IterableDataset`` as a list of its first ``limit`` rows (None: all); any other source
    as it is (rlhfkit's loaders read it)."""
    if not is_iterable_dataset(dataset):
        return dataset
    return [dict(row) for row in itertools.islice(iter(dataset), limit)]


def eval_sets(eval_dataset: Any) -> dict[str | None, Any]:
    """``eval_dataset`` by name: ``{}`` for None, ``{None: dataset}`` for one dataset, ``{name:
    dataset}`` for a ``DatasetDict``, an ``IterableDatasetDict`` or a dict of datasets."""
    if eval_dataset is None:
        return {}
    if isinstance(eval_dataset, dict):  # DatasetDict and IterableDatasetDict are dicts too
        if not eval_dataset:
            raise ValueError("eval_dataset: an empty dict of datasets; pass at least one, or None")
        return {str(name): dataset for name, dataset in eval_dataset.items()}
    return {None: eval_dataset}


def eval_label(name: str | None) -> str:
    """How an evaluation set is named in messages."""
    return "eval_dataset" if name is None else f"eval_dataset[{name!r}]"


def trl_view(items: list, packed: bool = False):
    """A ``datasets.Dataset`` of TRL's columns for rlhfkit's tokenised ``items`` (the module
    docstring): reward ``Pair``s, DPO ``PreferencePair``s, SFT examples (``Encoded``) or SFT
    training units (lists of examples; ``packed``: with ``seq_lengths``)."""
    from datasets import Dataset

    return Dataset.from_dict(trl_columns(items, packed))


def trl_columns(items: list, packed: bool = False) -> dict[str, list]:
    """The columns of ``trl_view``."""
    from ..data.encode import Encoded
    from ..trainers.dpo import PreferencePair
    from ..trainers.reward_model import Pair

    if not items:
        return {}
    first = items[0]
    if isinstance(first, Pair):
        columns = {"chosen_ids": [p.chosen for p in items], "rejected_ids": [p.rejected for p in items]}
        if any(p.margin is not None for p in items):
            columns["margin"] = [p.margin for p in items]
        return columns
    if isinstance(first, PreferencePair):
        return {
            k: [getattr(p, k.removesuffix("_ids")) for p in items] for k in ("prompt_ids", "chosen_ids", "rejected_ids")
        }
    units = items if isinstance(first, list) else [[e] for e in items]
    if not all(isinstance(e, Encoded) for unit in units for e in unit):
        raise TypeError(f"no TRL columns for {type(first).__name__} items")
    columns = {
        "input_ids": [[t for e in unit for t in e.input_ids] for unit in units],
        "completion_mask": [[m for e in unit for m in trained_mask(e)] for unit in units],
    }
    if packed:
        columns["seq_lengths"] = [[len(e.input_ids) for e in unit] for unit in units]
    return columns


def trained_mask(example) -> list[int]:
    """1 for each token of an SFT example that is trained, else 0."""
    mask = getattr(example, "mask", None)
    if mask:
        return list(mask)
    n, start = len(example.input_ids), example.prompt_len
    return [0] * start + [1] * (n - start)
