"""The single-process parts of a checkpoint (``checkpoint.py``): a module's trainable weights
(``trainable_state``, ``load_trainable_state``), a process's RNG states (``rng_state``,
``set_rng_state``), and the pickled ``training_state.pt`` of earlier versions, read with only
tensors, builtins and numpy's RNG key allowed (``load_legacy_training_state``)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:  # numpy >= 2 moved numpy.core to numpy._core
    from numpy._core.multiarray import _reconstruct
except ImportError:
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

# What an old ``training_state.pt`` legitimately holds beyond tensors and builtins: numpy's RNG key,
# a uint32 ndarray. It was pickled under either numpy module name, whichever numpy wrote it.
_LEGACY_GLOBALS: list[Any] = [
    np.ndarray,
    np.dtype,
    type(np.dtype(np.uint32)),
    (_reconstruct, "numpy._core.multiarray._reconstruct"),
    (_reconstruct, "numpy.core.multiarray._reconstruct"),
]


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


def load_legacy_training_state(file: Path) -> dict:
    """An old-format ``training_state.pt``, unpickled with only tensors, builtins and numpy's RNG
    key allowed: anything else (a crafted file's code-running globals) makes it refuse."""
    try:
        with torch.serialization.safe_globals(_LEGACY_GLOBALS):
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception:  # torch's message is many lines of advice to load unsafely: not ours to give
        raise ValueError(
            f"checkpoint file {file} cannot be loaded safely (it holds more than tensors and "
            f"RNG state); refusing to unpickle it"
        ) from None
    if not (isinstance(state, dict) and {"optimizer", "scheduler", "rng"} <= set(state)):
        raise ValueError(f"checkpoint file {file} is not a training state (no optimizer/scheduler/rng)")
    return state
