"""Checkpoints: trainable weights, optimizer, scheduler, RNG states and the loop's counters, so
``resume_from`` continues a run exactly where it stopped — on the same or a different number of
processes (DESIGN.md, "Scale-out"). Every process takes part in saving and loading; a single
process writes the same format. A checkpoint directory holds

- ``dcp/``: a ``torch.distributed.checkpoint`` (DCP) of the trainable weights (``<module>.<fqn>``,
  e.g. ``policy.model.embed_tokens.weight``; persistent buffers too, frozen parameters never) and
  the optimizer's tensors (``optimizer.state.<module>.<fqn>.<exp_avg|exp_avg_sq|step>``). Each
  process writes its own shards (``__<rank>_0.distcp``) and rank 0 the index (``.metadata``); DCP
  reshards on loading, so a run saved on N processes resumes on M.
- ``training_state.json`` (rank 0): the format, the number of processes that saved, the
  scheduler's state and the optimizer's param groups (learning rates, betas, parameter names);
- ``rng-<rank>.json`` + ``rng-<rank>.safetensors``: the torch / numpy / Python (and current CUDA
  device's) RNG states of each process. Resumed on more processes, a rank the saved run did not
  have starts from ``fresh_seed`` (the trainer passes the seed a fresh run gives that rank,
  ``seed + 1_000_003 * rank``); on fewer, the extra ranks' states are unused.
- ``trainer_state.json`` (``STATE_FILE``): the loop's counters, written last, once every process
  has finished writing, so its presence marks a complete checkpoint.

A checkpoint may come from anywhere (``resume_from`` is a user-supplied path), and unpickling a
crafted file runs arbitrary code. Our own files are JSON and safetensors. DCP's are not: in torch
2.13 ``FileSystemReader.read_metadata`` reads ``.metadata`` with a plain ``pickle.load``, and
``DefaultLoadPlanner.load_bytes`` reads every non-tensor entry with ``torch.load(weights_only=False)``
(only the tensor payloads use ``torch.load(weights_only=True)``). So ``.metadata`` is read here by
an unpickler that knows DCP's few metadata classes, torch dtypes, ``torch.Size`` and paths and
nothing else, checked (tensor entries only, shard files inside ``dcp/``), and handed to DCP
through a reader that never unpickles it again and a planner that refuses non-tensor entries; we
never save any. A crafted checkpoint is refused before anything is loaded.

Checkpoints of earlier versions (single process: ``<module>.safetensors``, the state in
``training_state.json`` format 1 or an old ``training_state.pt`` pickle, read with
``torch.load(weights_only=True)`` and only numpy's RNG globals allowed) still resume on one process.
"""

from __future__ import annotations

import importlib
import io
import json
import pickle
import random
import re
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from .. import distributed
from ..models.loading import check_finite_weights

STATE_FILE = "trainer_state.json"
DCP_DIR = "dcp"
TENSORS_FILE = "training_state.safetensors"
META_FILE = "training_state.json"
LEGACY_FILE = "training_state.pt"
FORMAT = 2  # training_state.json's "format": 1 = single-process safetensors, 2 = DCP

try:  # numpy >= 2 moved numpy.core to numpy._core
    from numpy._core.multiarray import _reconstruct
except ImportError:
    from numpy.core.multiarray import _reconstruct

# What an old ``training_state.pt`` legitimately holds beyond tensors and builtins: numpy's RNG key,
# a uint32 ndarray. It was pickled under either numpy module name, whichever numpy wrote it.
_LEGACY_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)),
                   (_reconstruct, "numpy._core.multiarray._reconstruct"),
                   (_reconstruct, "numpy.core.multiarray._reconstruct")]


def trainable_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Trainable parameters by name (tied weights appear once, as ``named_parameters`` lists them)."""
    return {n: p.detach().contiguous().cpu() for n, p in module.named_parameters() if p.requires_grad}


def load_trainable_state(module: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    expected = {n for n, p in module.named_parameters() if p.requires_grad}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state))[:5], sorted(set(state) - expected)[:5]
        raise ValueError(f"checkpoint {where} does not match the model: missing {missing}, unexpected {extra}")
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():  # sampling on a GPU draws from this process's device's generator
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]  # earlier versions saved every device's state (a list)
        torch.cuda.set_rng_state_all(cuda) if isinstance(cuda, (list, tuple)) else torch.cuda.set_rng_state(cuda)


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
    (tag, value), = obj.items()
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


def _save_tree(path: Path, stem: str, state: dict, **header) -> None:
    """``state`` as ``<stem>.json`` (with ``header``'s entries beside it) and, when it holds
    tensors, ``<stem>.safetensors``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors)
    if tensors:
        save_file(tensors, str(path / f"{stem}.safetensors"))
    (path / f"{stem}.json").write_text(json.dumps({**header, "state": tree}))


def _load_tree(path: Path, stem: str, format: int) -> tuple[dict, dict]:
    """``(header, state)`` of ``_save_tree``'s files, whose header must say ``format``."""
    from safetensors.torch import load_file

    meta = json.loads((path / f"{stem}.json").read_text())
    if meta.get("format") != format:
        raise ValueError(f"checkpoint {path}: unknown {stem}.json format {meta.get('format')!r}")
    file = path / f"{stem}.safetensors"
    try:
        return meta, _unflatten(meta["state"], load_file(str(file)) if file.exists() else {})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: {stem}.json and {file.name} do not match ({e!r})") from None


# --- DCP metadata, read without unpickling anything but DCP's own index --------------------------
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_METADATA_GLOBALS = {
    *((_DCP_METADATA, n) for n in ("Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                                   "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    *((m, c) for m in ("pathlib", "pathlib._local") for c in ("Path", "PosixPath", "WindowsPath")),
    *(("torch", n) for n, v in vars(torch).items() if isinstance(v, torch.dtype)),
}
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _METADATA_GLOBALS:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")
        return getattr(importlib.import_module(module), name)


def _read_metadata(directory: Path):
    """DCP's ``.metadata`` of ``directory``, unpickled with DCP's metadata classes alone and checked:
    tensor entries only, their shard files inside ``directory``. Anything else: a one-line
    ValueError, and nothing of the file has run."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    file = directory / ".metadata"
    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        ok = (isinstance(metadata, Metadata)
              and all(isinstance(v, TensorStorageMetadata) for v in metadata.state_dict_metadata.values())
              and all(isinstance(s, _StorageInfo) and isinstance(s.relative_path, str)
                      and _SHARD_FILE.fullmatch(s.relative_path) and not getattr(s, "transform_descriptors", None)
                      for s in metadata.storage_data.values()))
    except Exception:
        ok = False
    if not ok:
        raise ValueError(f"checkpoint file {file} cannot be loaded safely (it is not the index of tensor shards "
                         f"DCP writes); refusing to unpickle it")
    return metadata


def _dcp_reader_and_planner(directory: Path):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafeReader(FileSystemReader):
        # No **kwargs: DCP then never falls back to rank-local metadata files, read with pickle.
        def read_metadata(self):
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata = _read_metadata(Path(self.path))
            metadata.storage_meta = metadata.storage_meta or StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class TensorsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:  # DCP's would torch.load(weights_only=False)
            raise ValueError(f"checkpoint {directory}: non-tensor entry {read_item.dest_index.fqn!r} refused")

    return SafeReader(directory), TensorsOnlyPlanner()


@contextmanager
def _single_process_quiet():
    with warnings.catch_warnings():  # DCP warns each time it runs without a process group: by design here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _flat_items(tree: dict, prefix: str = ""):
    """``(name, leaf)`` of a nested state dict, named as DCP names them (keys joined by dots)."""
    for k, v in tree.items():
        yield from _flat_items(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]


# --- save and load -----------------------------------------------------------------------------------
_OPTIONS = dict(ignore_frozen_params=True)


def _live_state(modules: dict[str, torch.nn.Module], optimizer, init: bool):
    """``(container, tensors, param_groups)``: a ``ModuleDict`` of ``modules`` (so parameter names are
    ``<module>.<fqn>``), the DCP state dict of its trainable weights and the optimizer's tensors
    (sharded DTensors under FSDP2), and the optimizer's param groups. An optimizer that has not
    stepped yet gets its state tensors to load into when ``init``, else stays without state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    container = torch.nn.ModuleDict(modules)
    fresh = not optimizer.state
    model_sd, optim_sd = get_state_dict(container, optimizer, options=StateDictOptions(**_OPTIONS))
    # ignore_frozen_params misses a frozen weight tied to another (a LoRA base's lm_head): drop it too
    frozen = {f"{name}.{n}" for name, m in modules.items()
              for n, p in m.named_parameters(remove_duplicate=False) if not p.requires_grad}
    model_sd = {k: v for k, v in model_sd.items() if k not in frozen}
    if fresh and not init:  # get_state_dict filled it by a zero step: undo, a fresh AdamW stays fresh
        optimizer.state.clear()
        optim_sd["state"] = {}
    return container, {**model_sd, "optimizer": {"state": optim_sd["state"]}}, optim_sd["param_groups"]


def _clear(path: Path, modules) -> None:
    """Remove what an earlier checkpoint left in ``path``, the mark of a complete one first."""
    (path / STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(path / DCP_DIR, ignore_errors=True)
    stale = [*path.glob("rng-*.json"), *path.glob("rng-*.safetensors"), path / META_FILE, path / TENSORS_FILE,
             path / LEGACY_FILE, *(path / f"{name}.safetensors" for name in modules)]
    for file in stale:
        file.unlink(missing_ok=True)


def save_checkpoint(path, modules: dict[str, torch.nn.Module], optimizer, scheduler, counters: dict) -> None:
    """Every process calls this: each writes its shards and its RNG state; rank 0 the rest, and
    ``counters`` last. Returns when the checkpoint is complete."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    check_finite_weights(modules, f"checkpoint {path}")  # before anything is written
    _, tensors, param_groups = _live_state(modules, optimizer, init=False)
    leaves = [k for k, v in _flat_items(tensors) if not isinstance(v, torch.Tensor)]
    if leaves:
        raise TypeError(f"cannot checkpoint non-tensor state {leaves[:5]}: DCP would pickle it")
    if distributed.is_main() and path.exists():
        _clear(path, modules)
    distributed.barrier()
    path.mkdir(parents=True, exist_ok=True)
    with _single_process_quiet():
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(path / DCP_DIR))
    _save_tree(path, f"rng-{distributed.rank()}", rng_state(), format=FORMAT)
    if distributed.is_main():
        _save_tree(path, "training_state", {"scheduler": scheduler.state_dict(), "param_groups": param_groups},
                   format=FORMAT, world_size=distributed.world())
    distributed.barrier()
    if distributed.is_main():
        (path / STATE_FILE).write_text(json.dumps(counters, indent=2))
    distributed.barrier()


def load_checkpoint(path, modules: dict[str, torch.nn.Module], optimizer, scheduler,
                    fresh_seed: int | None = None) -> dict:
    """Restore a checkpoint into ``modules``, ``optimizer`` and ``scheduler`` (every process calls
    this, with any number of processes) and return its counters. A rank the saved run did not have
    is seeded with ``fresh_seed`` (None: such a rank is an error)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise ValueError(f"resume_from={str(path)!r} is not a checkpoint directory (no {STATE_FILE})")
    if not (path / DCP_DIR).is_dir():
        return _load_single_process_format(path, modules, optimizer, scheduler)
    for file in (META_FILE, f"{DCP_DIR}/.metadata"):
        if not (path / file).is_file():
            raise ValueError(f"checkpoint {path} has no {file}")
    _, state = _load_tree(path, "training_state", FORMAT)
    metadata = _read_metadata(path / DCP_DIR)
    rng_file = path / f"rng-{distributed.rank()}.json"
    if not rng_file.exists() and fresh_seed is None:
        raise ValueError(f"checkpoint {path} has no {rng_file.name}")
    rng = _load_tree(path, rng_file.stem, FORMAT)[1] if rng_file.exists() else None
    configured = _configured_hyperparameters(optimizer)
    stepped = any(k.startswith("optimizer.") for k in metadata.state_dict_metadata)  # else saved before any step
    container, tensors, param_groups = _live_state(modules, optimizer, init=stepped)
    _check_matches(path, tensors, param_groups, metadata, state["param_groups"])
    reader, planner = _dcp_reader_and_planner(path / DCP_DIR)
    with _single_process_quiet():
        dcp.load(tensors, storage_reader=reader, planner=planner)
    optim_state = {"state": tensors.pop("optimizer")["state"], "param_groups": state["param_groups"]}
    set_state_dict(container, optimizer, model_state_dict=tensors, optim_state_dict=optim_state,
                   options=StateDictOptions(**_OPTIONS, strict=False))  # the names were checked above
    scheduler.load_state_dict(state["scheduler"])
    _apply_configured_hyperparameters(optimizer, scheduler, configured)
    if rng is not None:
        set_rng_state(rng)
    else:
        from .common import seed_everything

        seed_everything(fresh_seed)
    return json.loads((path / STATE_FILE).read_text())


_HYPERPARAMETERS = ("initial_lr", "weight_decay")


def _configured_hyperparameters(optimizer) -> list[dict]:
    """The learning rate (``initial_lr``, the schedule's base) and weight decay of each param group
    as the resumed run's config set them."""
    return [{k: g[k] for k in _HYPERPARAMETERS if k in g} for g in optimizer.param_groups]


def _apply_configured_hyperparameters(optimizer, scheduler, configured: list[dict]) -> None:
    """A resumed run's learning rate and weight decay take effect (never the checkpoint's silently):
    the schedule's base rates become the configured ones and the current rate is recomputed at the
    restored step (``LambdaLR``: base × factor(step)). Weights, AdamW's moments, the step count and
    RNG come from the checkpoint."""
    for group, values in zip(optimizer.param_groups, configured):
        group.update(values)
    if configured and all("initial_lr" in c for c in configured):
        scheduler.base_lrs = [c["initial_lr"] for c in configured]
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if lambdas is not None:
            for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, lambdas):
                group["lr"] = base * factor(scheduler.last_epoch)
            scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def _check_matches(path: Path, tensors: dict, param_groups: list, metadata, saved_groups: list) -> None:
    """Before anything is loaded: the checkpoint holds exactly these tensors, in these shapes (global
    ones: a DTensor's ``shape``), and the optimizer's groups hold the same parameters."""
    _check_tensors(path, "the model", dict(_flat_items(tensors)), metadata.state_dict_metadata)
    if [g.get("params") for g in saved_groups] != [g["params"] for g in param_groups]:
        raise ValueError(f"checkpoint {path}: the optimizer's parameter groups do not match the model's")


def _check_tensors(path: Path, what: str, tensors: dict, saved: dict) -> None:
    missing, extra = sorted(set(tensors) - set(saved))[:5], sorted(set(saved) - set(tensors))[:5]
    shapes = sorted(k for k in set(tensors) & set(saved) if tuple(saved[k].size) != tuple(tensors[k].shape))[:5]
    if missing or extra or shapes:
        raise ValueError(f"checkpoint {path} does not match {what}: missing {missing}, unexpected {extra}, "
                         f"other shapes {shapes}")


def _load_single_process_format(path: Path, modules, optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    if distributed.world() > 1:
        raise ValueError(f"checkpoint {path} is in the single-process format of an earlier version: resume it on "
                         "one process (its next checkpoints can then resume on any number)")
    if (path / META_FILE).exists() and (path / TENSORS_FILE).exists():
        state = _load_tree(path, "training_state", 1)[1]
    elif (path / LEGACY_FILE).exists():
        state = _load_legacy_training_state(path / LEGACY_FILE)
    else:
        raise ValueError(f"checkpoint {path} has no {DCP_DIR}/ (nor an older {META_FILE} + {TENSORS_FILE} "
                         f"or {LEGACY_FILE})")
    for name, module in modules.items():
        file = path / f"{name}.safetensors"
        if not file.exists():
            raise ValueError(f"checkpoint {path} has no {file.name}")
        load_trainable_state(module, load_file(str(file)), str(file))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return json.loads((path / STATE_FILE).read_text())


def _load_legacy_training_state(file: Path) -> dict:
    """An old-format ``training_state.pt``, unpickled with only tensors, builtins and numpy's RNG
    key allowed: anything else (a crafted file's code-running globals) makes it refuse."""
    try:
        with torch.serialization.safe_globals(_LEGACY_GLOBALS):
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception:  # torch's message is many lines of advice to load unsafely: not ours to give
        raise ValueError(f"checkpoint file {file} cannot be loaded safely (it holds more than tensors and "
                         f"RNG state); refusing to unpickle it") from None
    if not (isinstance(state, dict) and {"optimizer", "scheduler", "rng"} <= set(state)):
        raise ValueError(f"checkpoint file {file} is not a training state (no optimizer/scheduler/rng)")
    return state


def has_module_weights(path, name: str) -> bool:
    """Whether checkpoint directory ``path`` holds weights for module ``name`` (any format)."""
    path = Path(path)
    return (path / DCP_DIR / ".metadata").is_file() or (path / f"{name}.safetensors").is_file()


def load_module_weights(path, name: str, module: torch.nn.Module) -> None:
    """The weights checkpoint ``path`` holds for module ``name`` ('policy', 'critic') loaded into
    ``module``, an unsharded model built as the run built it (LoRA adapter included), by this process
    alone — ``rlhfkit eval --model <run>/checkpoint-N``. Reads any format."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / DCP_DIR).is_dir():
        load_trainable_state(module, load_file(str(path / f"{name}.safetensors")), str(path))
        return
    prefix = f"{name}."
    saved = {k: v for k, v in _read_metadata(path / DCP_DIR).state_dict_metadata.items() if k.startswith(prefix)}
    if not saved:
        raise ValueError(f"checkpoint {path} holds no {name} weights")
    live = {prefix + k: v for k, v in module.state_dict().items()}
    # the checkpoint's tensors of this module, which must include every trainable parameter
    trainable = {prefix + n for n, p in module.named_parameters() if p.requires_grad}
    tensors = {k: v for k, v in live.items() if k in saved or k in trainable}
    _check_tensors(path, f"the {name} model", tensors, saved)
    reader, planner = _dcp_reader_and_planner(path / DCP_DIR)
    with _single_process_quiet():
        dcp.load(tensors, storage_reader=reader, planner=planner, no_dist=True)
    module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()}, strict=False)


def prune_checkpoints(output_dir, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` ``checkpoint-<step>`` directories this trainer wrote in
    ``output_dir`` (those holding a ``STATE_FILE``); anything else is left alone. Returns
    the deleted paths. The main process alone calls it."""
    ours = [p for p in Path(output_dir).glob("checkpoint-*")
            if p.name.split("-", 1)[1].isdigit() and (p / STATE_FILE).is_file()]
    ours.sort(key=lambda p: int(p.name.split("-", 1)[1]))
    doomed = ours[: max(0, len(ours) - keep)]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
