"""Checkpoints: trainable weights, optimizer, scheduler, RNG states and the loop's counters, so
``resume_from`` continues a run exactly where it stopped — on the same or a different number of
processes (docs/architecture.md, "Checkpoint format"). Every process takes part in saving and loading; a single
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

import json
import shutil
from pathlib import Path

import torch

from .. import distributed
from ..models.fingerprint import fingerprint_change
from ..models.loading import check_finite_weights
from . import signals
from .checkpoint_format import (  # noqa: F401  (read_dcp_metadata: also read through this module)
    dcp_reader_and_planner,
    flat_items,
    load_tree,
    read_dcp_metadata,
    read_json,
    save_tree,
    single_process_quiet,
)
from .checkpoint_state import (  # noqa: F401  (trainable_state, rng_state: also read through this module)
    load_legacy_training_state,
    load_trainable_state,
    rng_state,
    set_rng_state,
    trainable_state,
)

STATE_FILE = "trainer_state.json"
DCP_DIR = "dcp"
TENSORS_FILE = "training_state.safetensors"
META_FILE = "training_state.json"
LEGACY_FILE = "training_state.pt"
FORMAT = 2  # training_state.json's "format": 1 = single-process safetensors, 2 = DCP
NEWEST: list[Path] = []  # the newest complete checkpoint this process saved (rank 0) or resumed from: interrupts.py


# --- save and load -----------------------------------------------------------------------------------
def _live_state(modules: dict[str, torch.nn.Module], optimizer, init: bool):
    """``(container, tensors, param_groups)``: a ``ModuleDict`` of ``modules`` (so parameter names are
    ``<module>.<fqn>``), the DCP state dict of its trainable weights and the optimizer's tensors
    (sharded DTensors under FSDP2), and the optimizer's param groups. An optimizer that has not
    stepped yet gets its state tensors to load into when ``init``, else stays without state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    container = torch.nn.ModuleDict(modules)
    fresh = not optimizer.state
    model_sd, optim_sd = get_state_dict(container, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    # ignore_frozen_params misses a frozen weight tied to another (a LoRA base's lm_head): drop it too
    frozen = {
        f"{name}.{n}"
        for name, m in modules.items()
        for n, p in m.named_parameters(remove_duplicate=False)
        if not p.requires_grad
    }
    model_sd = {k: v for k, v in model_sd.items() if k not in frozen}
    if fresh and not init:  # get_state_dict filled it by a zero step: undo, a fresh AdamW stays fresh
        optimizer.state.clear()
        optim_sd["state"] = {}
    return container, {**model_sd, "optimizer": {"state": optim_sd["state"]}}, optim_sd["param_groups"]


def save_checkpoint(
    path, modules: dict[str, torch.nn.Module], optimizer, scheduler, counters: dict, settings: dict | None = None
) -> None:
    """Every process calls this: each writes its shards and its RNG state; rank 0 the rest, and
    ``counters`` last. Returns when the checkpoint is complete."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    check_finite_weights(modules, f"checkpoint {path}")  # before anything is written
    ours = (STATE_FILE, DCP_DIR, META_FILE, LEGACY_FILE)
    if path.is_dir() and any(path.iterdir()) and not any((path / name).exists() for name in ours):
        raise ValueError(f"cannot write checkpoint {path}: it exists, holds files and is not a checkpoint")
    _, tensors, param_groups = _live_state(modules, optimizer, init=False)
    leaves = [k for k, v in flat_items(tensors) if not isinstance(v, torch.Tensor)]
    if leaves:
        raise TypeError(f"cannot checkpoint non-tensor state {leaves[:5]}: DCP would pickle it")
    # Written into <path>.partial, renamed to <path> once complete: a crash or a full disk leaves the
    # previous checkpoints intact and no half-written checkpoint-N (a .partial is never resumed from).
    partial = path.with_name(path.name + ".partial")
    failed = 0
    try:
        if distributed.is_main():
            shutil.rmtree(partial, ignore_errors=True)
        distributed.role_barrier()
        partial.mkdir(parents=True, exist_ok=True)
        with single_process_quiet(), signals.deferred():  # a signal waits for the shards (see deferred)
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(partial / DCP_DIR), **distributed.dcp_options())
        save_tree(partial, f"rng-{distributed.role_rank()}", rng_state(), format=FORMAT)
        if distributed.is_main():
            save_tree(
                partial,
                "training_state",
                {"scheduler": scheduler.state_dict(), "param_groups": param_groups},
                format=FORMAT,
                world_size=distributed.role_size(),
            )
    except (OSError, RuntimeError, CheckpointException) as err:  # DCP wraps a rank's OSError in its own
        failed, error = 1, err
    if distributed.reduce_max(failed):
        if distributed.is_main():
            shutil.rmtree(partial, ignore_errors=True)
        reason = _first_line(error) if failed else "another process could not write its part"
        raise ValueError(f"cannot write checkpoint {path}: {reason}; the previous checkpoints are intact")
    distributed.role_barrier()
    if distributed.is_main():
        _complete(path, partial, {**counters, "settings": settings} if settings else counters)
    distributed.role_barrier()


def _complete(path: Path, partial: Path, record: dict) -> None:
    """Rank 0 completes the checkpoint: ``record`` written last into ``partial``, renamed to ``path``."""
    try:
        (partial / STATE_FILE).write_text(json.dumps(record, indent=2))
    except OSError as err:  # a full disk at the last file: still no half-written checkpoint
        shutil.rmtree(partial, ignore_errors=True)
        raise ValueError(
            f"cannot write checkpoint {path}: {_first_line(err)}; the previous checkpoints are intact"
        ) from None
    if path.exists() or path.is_symlink():  # an earlier checkpoint of this step, or an empty directory
        _remove_checkpoint(path)
    partial.rename(path)
    NEWEST[:] = [path]


def _read_counters(path: Path) -> dict:  # trainer_state.json: the counters, an integer step; else one line
    counters = read_json(path / STATE_FILE)
    if not isinstance(counters.get("step"), int):
        raise ValueError(f"checkpoint file {path / STATE_FILE} is damaged: no integer 'step'")
    return counters


def _first_line(err: BaseException) -> str:
    """An exception as one line: an OSError's message and path, else its first line."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    failures = getattr(err, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return _first_line(first[0] if isinstance(first, tuple) else first)
    cause = err.__cause__ or err.__context__
    while cause is not None:  # the OSError under DCP's wrapper
        if isinstance(cause, OSError) and cause.strerror:
            return _first_line(cause)
        cause = cause.__cause__ or cause.__context__
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]


def load_checkpoint(
    path,
    modules: dict[str, torch.nn.Module],
    optimizer,
    scheduler,
    fresh_seed: int | None = None,
    settings: dict | None = None,
) -> dict:
    """Restore a checkpoint into ``modules``, ``optimizer`` and ``scheduler`` (every process calls
    this, with any number of processes) and return its counters. A rank the saved run did not have
    is seeded with ``fresh_seed`` (None: such a rank is an error)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    path = Path(path)
    if not path.exists():
        raise ValueError(f"resume_from={str(path)!r} does not exist")
    if not (path / STATE_FILE).exists():
        raise ValueError(f"resume_from={str(path)!r} is not a checkpoint directory (no {STATE_FILE})")
    if not (path / DCP_DIR).is_dir():
        return _load_single_process_format(path, modules, optimizer, scheduler)
    counters = _read_counters(path)  # damaged: one line, before anything is loaded
    _check_settings(path, counters.get("settings") or {}, dict(settings or {}))
    for file in (META_FILE, f"{DCP_DIR}/.metadata"):
        if not (path / file).is_file():
            raise ValueError(f"checkpoint {path} has no {file}")
    _, state = load_tree(path, "training_state", FORMAT)
    metadata = read_dcp_metadata(path / DCP_DIR)
    rng_file = path / f"rng-{distributed.role_rank()}.json"
    if not rng_file.exists() and fresh_seed is None:
        raise ValueError(f"checkpoint {path} has no {rng_file.name}")
    rng = load_tree(path, rng_file.stem, FORMAT)[1] if rng_file.exists() else None
    configured = _configured_hyperparameters(optimizer)
    stepped = any(k.startswith("optimizer.") for k in metadata.state_dict_metadata)  # else saved before any step
    container, tensors, param_groups = _live_state(modules, optimizer, init=stepped)
    _check_matches(path, tensors, param_groups, metadata, state["param_groups"])
    reader, planner = dcp_reader_and_planner(path / DCP_DIR)
    try:
        with single_process_quiet():
            dcp.load(tensors, storage_reader=reader, planner=planner, **distributed.dcp_options())
    except (OSError, RuntimeError, CheckpointException) as err:  # a truncated or missing shard file
        raise ValueError(f"checkpoint {path / DCP_DIR} is damaged: {_first_line(err)}") from None
    optim_state = {"state": tensors.pop("optimizer")["state"], "param_groups": state["param_groups"]}
    set_state_dict(
        container,
        optimizer,
        model_state_dict=tensors,
        optim_state_dict=optim_state,
        options=StateDictOptions(ignore_frozen_params=True, strict=False),
    )  # the names were checked above
    scheduler.load_state_dict(state["scheduler"])
    _apply_configured_hyperparameters(optimizer, scheduler, configured)
    if rng is not None:
        set_rng_state(rng)
    else:
        from .training import seed_everything

        assert fresh_seed is not None  # a rank without its RNG file was refused above otherwise
        seed_everything(fresh_seed)
    return _read_counters(path)


def _check_settings(path: Path, saved: dict, settings: dict) -> None:
    """Settings whose change a resumed run cannot honour: refused, never silently ignored."""
    base = settings.pop("base_model", None)  # models.fingerprint: compared within float tolerance
    problem = fingerprint_change(saved["base_model"], base) if base and saved.get("base_model") else None
    if problem:
        raise ValueError(f"resume_from={str(path)!r}: {problem}")
    changed = [f"{k}={saved[k]!r} (now {v!r})" for k, v in settings.items() if k in saved and saved[k] != v]
    if changed:
        raise ValueError(
            f"resume_from={str(path)!r}: the checkpoint was saved with {', '.join(changed)}; its RNG "
            "states and data order follow that value, so resume with it (or start a new run)"
        )


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
    _check_tensors(path, "the model", dict(flat_items(tensors)), metadata.state_dict_metadata)
    if [g.get("params") for g in saved_groups] != [g["params"] for g in param_groups]:
        raise ValueError(f"checkpoint {path}: the optimizer's parameter groups do not match the model's")


def _check_tensors(path: Path, what: str, tensors: dict, saved: dict) -> None:
    missing, extra = sorted(set(tensors) - set(saved))[:5], sorted(set(saved) - set(tensors))[:5]
    shapes = sorted(k for k in set(tensors) & set(saved) if tuple(saved[k].size) != tuple(tensors[k].shape))[:5]
    if missing or extra or shapes:
        raise ValueError(
            f"checkpoint {path} does not match {what}: missing {missing}, unexpected {extra}, other shapes {shapes}"
        )


def _load_single_process_format(path: Path, modules, optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    if distributed.role_size() > 1:
        raise ValueError(
            f"checkpoint {path} is in the single-process format of an earlier version: resume it on "
            "one process (its next checkpoints can then resume on any number)"
        )
    if (path / META_FILE).exists() and (path / TENSORS_FILE).exists():
        state = load_tree(path, "training_state", 1)[1]
    elif (path / LEGACY_FILE).exists():
        state = load_legacy_training_state(path / LEGACY_FILE)
    else:
        raise ValueError(
            f"checkpoint {path} has no {DCP_DIR}/ (nor an older {META_FILE} + {TENSORS_FILE} or {LEGACY_FILE})"
        )
    for name, module in modules.items():
        file = path / f"{name}.safetensors"
        if not file.exists():
            raise ValueError(f"checkpoint {path} has no {file.name}")
        load_trainable_state(module, load_file(str(file)), str(file))
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return _read_counters(path)


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
    saved = {k: v for k, v in read_dcp_metadata(path / DCP_DIR).state_dict_metadata.items() if k.startswith(prefix)}
    if not saved:
        raise ValueError(f"checkpoint {path} holds no {name} weights")
    live = {prefix + k: v for k, v in module.state_dict().items()}
    # the checkpoint's tensors of this module, which must include every trainable parameter
    trainable = {prefix + n for n, p in module.named_parameters() if p.requires_grad}
    tensors = {k: v for k, v in live.items() if k in saved or k in trainable}
    _check_tensors(path, f"the {name} model", tensors, saved)
    reader, planner = dcp_reader_and_planner(path / DCP_DIR)
    with single_process_quiet():
        dcp.load(tensors, storage_reader=reader, planner=planner, no_dist=True)
    module.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items()}, strict=False)


def complete_checkpoints(output_dir) -> list[Path]:
    """The complete ``checkpoint-<step>`` directories of ``output_dir`` — those holding
    ``STATE_FILE``, written last —, oldest step first."""
    found = [
        p
        for p in Path(output_dir).glob("checkpoint-*")
        if p.name.split("-", 1)[1].isdigit() and (p / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda p: int(p.name.split("-", 1)[1]))


def prune_checkpoints(output_dir, keep: int, newest_step: int | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (directories, never a symbolic link) in
    ``output_dir`` up to ``newest_step`` (the step just saved: later ones are of a continuation abandoned
    by resuming from an earlier one, replaced as the run reaches them); nothing else (main process)."""
    ours = [
        p
        for p in complete_checkpoints(output_dir)
        if not p.is_symlink() and (newest_step is None or int(p.name.split("-", 1)[1]) <= newest_step)
    ]
    doomed = ours[: max(0, len(ours) - keep)]
    for path in doomed:
        _remove_checkpoint(path)
    return doomed


def _remove_checkpoint(path: Path) -> None:
    """Never half-removed yet complete-looking: ``STATE_FILE`` first; a symbolic link: unlinked only."""
    if path.is_symlink():
        path.unlink()
        return
    (path / STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(path)
