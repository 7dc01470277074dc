"""Checkpoints: trainable weights, optimizer, scheduler, RNG states and the loop's counters, so
``resume_from`` continues a run exactly where it stopped.

Nothing is pickled: a checkpoint may come from anywhere (``resume_from`` is a user-supplied path),
and unpickling a crafted file runs arbitrary code. A checkpoint directory holds

- ``<module>.safetensors``: each module's trainable weights;
- ``training_state.safetensors``: every tensor of the optimizer state and RNG states;
- ``training_state.json``: everything else (param groups, scheduler state, Python/numpy RNG
  scalars), with ``{"tensor": name}`` markers pointing into the safetensors file;
- ``trainer_state.json`` (``STATE_FILE``): the loop's counters, written last, so its presence
  marks a complete checkpoint.

Checkpoints from older versions (``training_state.pt``, a ``torch.save`` pickle) are still read,
with ``torch.load(weights_only=True)`` and only the numpy globals their RNG state needs allowed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.json"
TENSORS_FILE = "training_state.safetensors"
META_FILE = "training_state.json"
LEGACY_FILE = "training_state.pt"

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
    if torch.cuda.is_available():  # sampling on a GPU draws from the CUDA generators
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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
        raise ValueError(f"unexpected object in {META_FILE}: keys {sorted(obj)[:5]}")
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
    raise ValueError(f"unexpected tag {tag!r} in {META_FILE}")


def _save_training_state(path: Path, state: dict) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors)
    save_file(tensors, str(path / TENSORS_FILE))
    (path / META_FILE).write_text(json.dumps({"format": 1, "state": tree}))


def _load_training_state(path: Path) -> dict:
    from safetensors.torch import load_file

    meta = json.loads((path / META_FILE).read_text())
    if meta.get("format") != 1:
        raise ValueError(f"checkpoint {path}: unknown {META_FILE} format {meta.get('format')!r}")
    try:
        return _unflatten(meta["state"], load_file(str(path / TENSORS_FILE)))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {path}: {META_FILE} and {TENSORS_FILE} do not match ({e!r})") from None


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


def save_checkpoint(path: Path, modules: dict[str, torch.nn.Module], optimizer, scheduler, counters: dict) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    for name, module in modules.items():
        save_file(trainable_state(module), str(path / f"{name}.safetensors"))
    _save_training_state(path, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                "rng": rng_state()})
    (path / LEGACY_FILE).unlink(missing_ok=True)  # a stale pickle must not outlive a rewrite
    (path / STATE_FILE).write_text(json.dumps(counters, indent=2))


def load_checkpoint(path, modules: dict[str, torch.nn.Module], optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise ValueError(f"resume_from={str(path)!r} is not a checkpoint directory (no {STATE_FILE})")
    if (path / META_FILE).exists() and (path / TENSORS_FILE).exists():
        state = _load_training_state(path)
    elif (path / LEGACY_FILE).exists():
        state = _load_legacy_training_state(path / LEGACY_FILE)
    else:
        raise ValueError(f"checkpoint {path} has no {META_FILE} + {TENSORS_FILE} (nor an old {LEGACY_FILE})")
    for name, module in modules.items():
        file = path / f"{name}.safetensors"
        if not file.exists():
            raise ValueError(f"checkpoint {path} has no {file.name}")
        load_trainable_state(module, load_file(str(file)), str(file))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return json.loads((path / STATE_FILE).read_text())


def prune_checkpoints(output_dir, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` ``checkpoint-<step>`` directories this trainer wrote in
    ``output_dir`` (those holding a ``STATE_FILE``); anything else is left alone. Returns
    the deleted paths."""
    import shutil

    ours = [p for p in Path(output_dir).glob("checkpoint-*")
            if p.name.split("-", 1)[1].isdigit() and (p / STATE_FILE).is_file()]
    ours.sort(key=lambda p: int(p.name.split("-", 1)[1]))
    doomed = ours[: max(0, len(ours) - keep)]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
