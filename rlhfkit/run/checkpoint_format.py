"""How a checkpoint's files are read and written without pickle (see ``checkpoint.py``): state
dicts as JSON + safetensors (``save_tree`` / ``load_tree``), and DCP's ``.metadata`` index read by
an unpickler that admits DCP's metadata classes alone and gives state to nothing but the records
the file creates (``read_dcp_metadata``), handed to DCP through a reader that never unpickles again
and a planner that refuses non-tensor entries."""

from __future__ import annotations

import importlib
import io
import json
import logging
import pickle
import re
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

# --- pickle-free (de)serialisation of state dicts --------------------------------------------------
# A state dict is a tree of dicts, lists, tuples, numbers, strings, None, tensors and (numpy's RNG
# key) ndarrays. ``_flatten`` moves the tensors out into a flat ``{name: tensor}`` dict for
# safetensors and leaves a JSON tree; ``_unflatten`` puts them back. Plain JSON would lose three
# things, so they are tagged: tensors/ndarrays (``{"tensor": name}``/``{"ndarray": name}``),
# tuples (``{"tuple": [...]}``: AdamW's ``betas``, ``random.getstate()``) and dict keys that are
# ints (``{"int_keys": {...}}``: the optimizer's ``state`` is keyed by parameter index). Every
# other dict is wrapped as ``{"dict": {...}}``, so a tag never collides with a real key.


def _flatten(obj, name: str, tensors: dict[str, torch.Tensor]):
    def sub(key) -> str:  # dotted tensor names, e.g. "optimizer.state.0.exp_avg"
        return f"{name}.{key}" if name else str(key)

    if isinstance(obj, torch.Tensor):
        tensors[name] = obj.detach().cpu().contiguous()
        return {"tensor": name}
    if isinstance(obj, np.ndarray):
        tensors[name] = torch.from_numpy(np.ascontiguousarray(obj))
        return {"ndarray": name}
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, sub(i), tensors) for i, v in enumerate(obj)]
        return {"tuple": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        if obj and all(type(k) is int for k in obj):
            return {"int_keys": {str(k): _flatten(v, sub(k), tensors) for k, v in obj.items()}}
        if not all(isinstance(k, str) for k in obj):
            raise TypeError(f"cannot store {name}: dict keys must be all str or all int")
        return {"dict": {k: _flatten(v, sub(k), tensors) for k, v in obj.items()}}
    if isinstance(obj, np.generic):  # e.g. a numpy float an LR lambda returned
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store {name} of type {type(obj).__name__} without pickle")


def _unflatten(obj, tensors: dict[str, torch.Tensor]):
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) != 1:
        raise ValueError(f"unexpected object: keys {sorted(obj)[:5]}")
    ((tag, value),) = obj.items()
    if tag == "tensor":
        return tensors[value]
    if tag == "ndarray":
        return tensors[value].numpy()
    if tag == "tuple":
        return tuple(_unflatten(v, tensors) for v in value)
    if tag == "int_keys":
        return {int(k): _unflatten(v, tensors) for k, v in value.items()}
    if tag == "dict":
        return {k: _unflatten(v, tensors) for k, v in value.items()}
    raise ValueError(f"unexpected tag {tag!r}")


def save_tree(path: Path, stem: str, state: dict, **header) -> None:
    """``state`` as ``<stem>.json`` (with ``header``'s entries beside it) and, when it holds
    tensors, ``<stem>.safetensors``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors)
    if tensors:
        save_file(tensors, str(path / f"{stem}.safetensors"))
    (path / f"{stem}.json").write_text(json.dumps({**header, "state": tree}))


def read_json(file: Path) -> dict:
    """A checkpoint's JSON file as a dict; missing, unreadable or damaged is one line naming it."""
    try:
        value = json.loads(Path(file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"checkpoint file {file} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"checkpoint file {file} is damaged ({type(err).__name__}: {err})") from None
    if not isinstance(value, dict):
        raise ValueError(f"checkpoint file {file} is damaged: expected a JSON object, got {type(value).__name__}")
    return value


def load_tree(path: Path, stem: str, format: int) -> tuple[dict, dict]:
    """``(header, state)`` of ``save_tree``'s files, whose header must say ``format``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta = read_json(path / f"{stem}.json")
    if meta.get("format") != format:
        raise ValueError(f"checkpoint {path}: unknown {stem}.json format {meta.get('format')!r}")
    file = path / f"{stem}.safetensors"
    try:
        tensors = load_file(str(file)) if file.exists() else {}
    except SafetensorError as err:  # truncated (a copy cut short) or not safetensors at all
        raise ValueError(f"checkpoint file {file} is damaged ({err}); resume from another checkpoint") from None
    try:
        return meta, _unflatten(meta["state"], tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: {stem}.json and {file.name} do not match ({e!r})") from None


# --- DCP metadata, read without unpickling anything but DCP's own index --------------------------
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_METADATA_GLOBALS = {
    *(
        (_DCP_METADATA, n)
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    *((m, c) for m in ("pathlib", "pathlib._local") for c in ("Path", "PosixPath", "WindowsPath")),
    *(("torch", n) for n, v in vars(torch).items() if isinstance(v, torch.dtype)),
}
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp")


# The records DCP's index is made of: the only objects a BUILD (pickle's "set this object's state")
# may target. Anything else an allowed global yields is process-wide — a class, a function, an enum
# member, a dtype — and a BUILD on it would set its attributes before the file was refused.
_METADATA_RECORDS = {
    *(
        (_DCP_METADATA, n)
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
}


def _resolve(module: str, name: str):
    return getattr(importlib.import_module(module), name)


class _MetadataUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (the C one's opcodes cannot be overridden; the index is small):
    globals from ``_METADATA_GLOBALS`` alone, and BUILD only on a record of ``_METADATA_RECORDS``
    that the file itself created, with a dict of attributes (or the tuple ``TensorProperties``'s own
    ``__setstate__`` takes)."""

    # typeshed's stub of this private class omits ``stack`` and ``load_build``, and types the
    # opcode table's entries as taking the C ``pickle.Unpickler``
    stack: list[Any]
    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)

    def __init__(self, file):
        super().__init__(file)
        self._records = {_resolve(*r) for r in _METADATA_RECORDS}

    def find_class(self, module: str, name: str):
        if (module, name) not in _METADATA_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")
        return _resolve(module, name)

    def _load_build(self) -> None:
        if len(self.stack) < 2:
            raise pickle.UnpicklingError("BUILD with nothing to build")
        state, kind = self.stack[-1], type(self.stack[-2])
        if kind not in self._records:  # a class, function, enum member, dtype: never given state
            raise pickle.UnpicklingError(f"BUILD on a {kind.__name__} refused: only DCP's metadata records take state")
        if "__setstate__" not in vars(kind) and not (isinstance(state, dict) and all(type(k) is str for k in state)):
            raise pickle.UnpicklingError(f"BUILD of {kind.__name__} refused: its state must be a dict of attributes")
        super().load_build()  # type: ignore[misc]  # not in typeshed's _Unpickler (above)

    dispatch[pickle.BUILD[0]] = _load_build


def read_dcp_metadata(directory: Path):
    """DCP's ``.metadata`` of ``directory``, unpickled with DCP's metadata classes alone and checked:
    tensor entries only, their shard files inside ``directory``. Anything else: a one-line
    ValueError, and nothing of the file has run."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    file = directory / ".metadata"
    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        ok = (
            isinstance(metadata, Metadata)
            and all(isinstance(v, TensorStorageMetadata) for v in metadata.state_dict_metadata.values())
            and all(
                isinstance(s, _StorageInfo)
                and isinstance(s.relative_path, str)
                and _SHARD_FILE.fullmatch(s.relative_path)
                and not getattr(s, "transform_descriptors", None)
                for s in metadata.storage_data.values()
            )
        )
    except Exception:
        ok = False
    if not ok:
        raise ValueError(
            f"checkpoint file {file} cannot be loaded safely (it is not the index of tensor shards "
            f"DCP writes); refusing to unpickle it"
        )
    return metadata


def dcp_reader_and_planner(directory: Path):
    """The reader and planner every DCP load of ``directory`` goes through: the reader reads
    ``.metadata`` with ``read_dcp_metadata`` (never with pickle), the planner refuses non-tensor
    entries (DCP's own would ``torch.load`` them)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeReader(FileSystemReader):
        # No **kwargs: DCP then never falls back to rank-local metadata files, read with pickle.
        def read_metadata(self):
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata = read_dcp_metadata(Path(self.path))
            metadata.storage_meta = metadata.storage_meta or StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class TensorsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:  # DCP's would torch.load(weights_only=False)
            raise ValueError(f"checkpoint {directory}: non-tensor entry {read_item.dest_index.fqn!r} refused")

    return SafeReader(directory), TensorsOnlyPlanner()


@contextmanager
def single_process_quiet():
    """DCP without its noise: the warning it gives each time it runs without a process group (by
    design here), and the traceback its logger prints for a failed write (the caller reports the
    failure in one line)."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if "dcp_logger" in name]
    disabled = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield
    finally:
        for lg, was in zip(loggers, disabled):
            lg.disabled = was


def flat_items(tree: dict, prefix: str = ""):
    """``(name, leaf)`` of a nested state dict, named as DCP names them (keys joined by dots)."""
    for k, v in tree.items():
        yield from flat_items(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]
