"""Checkpoints: trainable weights (safetensors), optimizer, scheduler, RNG states and the loop's
counters, so ``resume_from`` continues a run exactly where it stopped."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.json"


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


def save_checkpoint(path: Path, modules: dict[str, torch.nn.Module], optimizer, scheduler, counters: dict) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    for name, module in modules.items():
        save_file(trainable_state(module), str(path / f"{name}.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
               path / "training_state.pt")
    (path / STATE_FILE).write_text(json.dumps(counters, indent=2))


def load_checkpoint(path, modules: dict[str, torch.nn.Module], optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / STATE_FILE).exists():
        raise ValueError(f"resume_from={str(path)!r} is not a checkpoint directory (no {STATE_FILE})")
    for name, module in modules.items():
        file = path / f"{name}.safetensors"
        if not file.exists():
            raise ValueError(f"checkpoint {path} has no {file.name}")
        load_trainable_state(module, load_file(str(file)), str(file))
    state = torch.load(path / "training_state.pt", weights_only=False)
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
