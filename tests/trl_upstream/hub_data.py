"""The Hub's test datasets that TRL's tests load (``trl-internal-testing/zen``, ``toolcall``, ``harmony``), offline.

TRL makes them with the scripts in its ``scripts/`` folder and pushes them to the Hub; those scripts are in
``upstream/scripts`` unchanged. Here each script runs with ``push_to_hub`` caught: every configuration it
would push is written as Parquet files (one a split) instead, and ``load_dataset`` (``plugin.py``) reads them
back with the split syntax and streaming of the real call. The rows are TRL's own, not look-alikes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from unittest import mock

SCRIPTS = Path(__file__).parent / "upstream" / "scripts"
DATASETS = {"trl-internal-testing/zen": "zen", "trl-internal-testing/toolcall": "toolcall",
            "trl-internal-testing/harmony": "harmony"}  # fmt: skip


def build_datasets(root: Path) -> Path:
    """Every configuration of every dataset in ``DATASETS`` under ``root/<name>/<config>/<split>.parquet``."""
    from datasets import DatasetDict

    for repo_id, name in DATASETS.items():
        if (root / name / ".done").exists():
            continue
        spec = importlib.util.spec_from_file_location(f"generate_{name}", SCRIPTS / f"generate_{name}_dataset.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        def save(self, repo, config_name="default", _name=name, **_):
            for split, rows in self.items():
                path = root / _name / config_name / f"{split}.parquet"
                path.parent.mkdir(parents=True, exist_ok=True)
                rows.to_parquet(str(path))

        with mock.patch.object(DatasetDict, "push_to_hub", save):
            module.main(test_size=0.1, push_to_hub=True, repo_id=repo_id)
        (root / name / ".done").touch()
    return root


def data_files(root: Path, repo_id: str, config: str | None) -> dict[str, str] | None:
    """The Parquet files of one configuration by split, or None when it was not built."""
    name = DATASETS.get(repo_id)
    folder = root / str(name) / str(config or "default")
    if name is None or not folder.is_dir():
        return None
    return {p.stem: str(p) for p in sorted(folder.glob("*.parquet"))}
