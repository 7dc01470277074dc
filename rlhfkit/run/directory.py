"""Run directories: when a trainer may write into ``output_dir``, what ``--overwrite`` removes, and
how rlhfkit tells its own outputs from a user's look-alike files.

Every run directory rlhfkit creates or records a run in holds a small marker file, ``.rlhfkit-run``
(``MARKER``). ``--overwrite`` clears only a directory carrying it, and there only what an rlhfkit run
writes (``run_outputs``); a directory without it that holds files — the user's own, or a run of a
version before the marker — is refused in one line, and nothing in it is touched. A run directory
whose run never completed a step (it failed to resume, or its reward failed at step 1) holds
nothing but rlhfkit's record of it: the corrected rerun reuses it without ``--overwrite``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..files import writing
from .checkpoint import DCP_DIR, META_FILE, STATE_FILE, complete_checkpoints
from .trace import RANK_DIR, TRACE_FILE

MARKER = ".rlhfkit-run"

# What an rlhfkit run writes in its directory, and nothing else is removed by --overwrite.
_RUN_FILES = ("metrics.jsonl", "samples.jsonl", "report.html", "config.yaml", "run.json", TRACE_FILE)
_RUN_GLOBS = (
    "config-resume-*.yaml",
    f"{RANK_DIR}/rank-*.jsonl",
    "data/train_dataset.jsonl",
    "data/eval_dataset.jsonl",
    "data/center_dataset.jsonl",
    "runs/*/events.out.tfevents.*",
    "wandb/offline-run-*",
    "wandb/run-*",
    "wandb/latest-run",
    "wandb/debug.log",
    "wandb/debug-internal.log",
)
_MODEL_MARKS = ("config.json", "adapter_config.json", STATE_FILE, DCP_DIR, META_FILE)


def check_run_dir(output_dir: str | None, overwrite: bool = False, resume_from: str | None = None) -> None:
    """The refusals of ``prepare_run_dir``, writing nothing: trainers check first, load the model,
    data and rewards, and only then write to the run directory (a run that fails to load leaves
    nothing behind that would block the corrected rerun)."""
    if not output_dir:
        return
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output_dir {str(path)!r} exists and is not a directory")
    if not path.is_dir() or not any(path.iterdir()) or _resuming_inside(path, resume_from):
        return
    reusable = unstarted_run(path)
    if not (overwrite or reusable):
        hint = f" (resume_from={resume_from!r} is not inside it)" if resume_from else ""
        raise ValueError(
            f"output_dir {str(path)!r} already exists and is not empty{hint}: choose another, "
            "set overwrite=true, or resume_from one of its checkpoints"
        )
    if not (path / MARKER).is_file():
        raise ValueError(
            f"output_dir {str(path)!r} holds files but no {MARKER} marker, so it is not a run directory "
            "rlhfkit created (or one of a version before the marker) and overwrite=true would not know "
            "which files are its own: choose another output_dir, or empty it yourself"
        )


def check_inputs_outside(output_dir: str | None, overwrite: bool, resume_from: str | None, inputs: dict) -> None:
    """Before ``prepare_run_dir`` clears ``output_dir`` (``overwrite``, or the reuse of a run that
    never completed a step): none of the run's ``inputs`` (field name -> path, list of paths, or
    model object: the directory it was loaded from) lies inside it — one line naming the field."""
    path = Path(output_dir) if output_dir else None
    if path is None or not path.is_dir() or not any(path.iterdir()) or _resuming_inside(path, resume_from):
        return  # nothing is cleared
    why = "overwrite=true would clear" if overwrite else "this run would clear (its run never completed a step)"
    for field, source in _paths(inputs, resume_from):
        resolved = Path(source).resolve()
        if resolved == path.resolve() or path.resolve() in resolved.parents:
            raise ValueError(
                f"{field}={str(source)!r} lies inside output_dir {str(path)!r}, which {why}: "
                "choose another output_dir, or move it out first"
            )


def _paths(inputs: dict, resume_from):
    """``(field, path)`` for every input that is an existing local path (a model object: the
    directory it was loaded from)."""
    from ..models.sources import model_source

    for field, value in {**inputs, "resume_from": resume_from}.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None or isinstance(item, (bool, int, float)):
                continue
            source = item if isinstance(item, (str, os.PathLike)) else model_source(item)
            if source and Path(source).exists():
                yield field, source


def prepare_run_dir(
    output_dir: str | None, overwrite: bool = False, resume_from: str | None = None, config=None
) -> Path | None:
    """Create the run directory, mark it as rlhfkit's (``MARKER``) and write ``config`` as
    ``config.yaml`` when given.

    A directory that already holds files is refused — an earlier run is never overwritten
    silently — unless ``overwrite`` (then what an earlier rlhfkit run wrote there is removed:
    ``remove_previous_run``; only in a directory carrying the marker), it holds only the record of
    a run that never completed a step (``unstarted_run``: replaced the same way), or ``resume_from``
    is a checkpoint *inside* it (the run continues: the logs keep the rows up to the checkpoint's
    step, and the config of the resumed run goes to ``config-resume-<name>.yaml``)."""
    check_run_dir(output_dir, overwrite, resume_from)
    if not output_dir:
        return None
    path = Path(output_dir)
    if resume_from is not None and _resuming_inside(path, resume_from):
        _truncate_logs(path, resume_from)
    elif path.is_dir() and any(path.iterdir()):  # check_run_dir allowed it: a marked run to replace
        remove_previous_run(path)
    mark_run_dir(path)
    if config is not None:
        from ..config.io import save_config

        target = run_config_path(path, resume_from)
        with writing(target):
            save_config(config, target)
    return path


def mark_run_dir(path: Path) -> None:
    """Create ``path`` if need be and mark it as an rlhfkit run directory (``MARKER``). The drop-in
    TRL trainers (``rlhfkit/trl/output_dir.py``) also mark a directory of the user's own files that
    holds none of ``run_outputs``, so that the run writes beside them, as TRL does."""
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    if not marker.is_file():
        from .. import __version__

        with writing(marker):
            marker.write_text(json.dumps({"rlhfkit": __version__}) + "\n")


def run_outputs(path: Path) -> list[Path]:
    """What an rlhfkit run writes in ``path`` (whether or not it exists): its logs and record, its
    step timeline (``trace.json``, the ranks' ``trace/rank-*.jsonl``), its plots (the PNG files of
    ``report.PLOT_GROUPS`` and ``report.TIME_PLOT``), tracker files, recorded data, and its
    ``checkpoint-<step>/`` and ``final/`` directories (those holding a model or checkpoint)."""
    from ..report import PLOT_GROUPS, TIME_PLOT

    outputs = [path / name for name in _RUN_FILES]
    outputs += [p for pattern in _RUN_GLOBS for p in path.glob(pattern)]
    outputs += [path / "plots" / f"{stem}.png" for stem in [*(g[0] for g in PLOT_GROUPS), TIME_PLOT]]
    outputs += [
        p
        for p in [*path.glob("checkpoint-*"), path / "final"]
        if p.is_dir() and any((p / mark).exists() for mark in _MODEL_MARKS)
    ]
    return outputs


def remove_previous_run(path: Path) -> list[Path]:
    """Remove exactly what an earlier rlhfkit run wrote in ``path`` (``run_outputs``) and never
    another file; directories left empty go too. Returns what was removed."""
    removed = []
    for target in run_outputs(path):
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        else:
            continue
        removed.append(target)
    runs = [str(p.relative_to(path)) for p in path.glob("runs/*")]
    for folder in ("plots", "data", RANK_DIR, "wandb", *runs, "runs"):
        try:
            (path / folder).rmdir()  # only when empty
        except OSError:
            pass
    return removed


def unstarted_run(path) -> bool:
    """Whether ``path`` carries rlhfkit's marker and holds nothing but rlhfkit's record of a run
    that never completed a step — its config, recorded data, tracker start-up files, at most the
    step-0 evaluation in ``metrics.jsonl`` — and no checkpoint, ``final/``, sample or user file."""
    path = Path(path)
    if not (path / MARKER).is_file():
        return False
    outputs = [p for p in run_outputs(path) if p.exists() or p.is_symlink()]
    if any(p.parent == path and (p.name == "final" or p.name.startswith("checkpoint-")) for p in outputs):
        return False
    if _logged_steps(path / "samples.jsonl", any_row=True) or _logged_steps(path / "metrics.jsonl"):
        return False
    covered = [*outputs, path / MARKER]
    for file in path.rglob("*"):
        if file.is_dir() and not file.is_symlink():
            continue
        if not any(file == c or c in file.parents for c in covered):
            return False
    return True


def _logged_steps(file: Path, any_row: bool = False) -> bool:
    """Whether ``file`` holds a row of a completed step (``step`` >= 1; ``any_row``: any line)."""
    if not file.is_file():
        return False
    for line in file.read_text(errors="replace").splitlines():
        try:
            if any_row or int(json.loads(line).get("step", 0)) > 0:
                return True
        except (ValueError, TypeError, AttributeError):
            return True  # not ours to judge: keep the directory
    return False


def _truncate_logs(output_dir: Path, resume_from: str) -> None:
    """Resumed inside its run: ``metrics.jsonl`` and ``samples.jsonl`` keep only the rows up to the
    checkpoint's step (the resumed run writes the later ones again, so none appears twice)."""
    state = Path(resume_from) / STATE_FILE
    try:
        step = int(json.loads(state.read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a complete checkpoint: load_checkpoint says so in one line
    for name in ("metrics.jsonl", "samples.jsonl"):
        file = output_dir / name
        if not file.is_file():
            continue
        kept = []
        for line in file.read_text().splitlines(keepends=True):
            try:
                if int(json.loads(line).get("step", 0)) > step:
                    continue
            except (ValueError, TypeError, AttributeError):
                pass  # a line that is not ours to judge stays
            kept.append(line)
        tmp = file.with_name(file.name + ".tmp")
        with writing(tmp):
            tmp.write_text("".join(kept))
        tmp.replace(file)


def latest_checkpoint(output_dir) -> str:
    """``resume_from='latest'``: the newest of ``output_dir``'s ``complete_checkpoints``; one line
    when there is none."""
    found = complete_checkpoints(output_dir) if output_dir else []
    if not found:
        raise ValueError(f"resume_from='latest': no complete checkpoint-<step> directory in output_dir={output_dir!r}")
    return str(found[-1])


def _resuming_inside(output_dir: Path, resume_from: str | None) -> bool:
    return resume_from is not None and Path(output_dir).resolve() in Path(resume_from).resolve().parents


def run_config_path(output_dir, resume_from: str | None = None) -> Path:
    """Where a run records its config: ``config.yaml``, or ``config-resume-<checkpoint>.yaml`` for a
    run resumed from one of its own checkpoints (the first run's record is kept)."""
    path = Path(output_dir)
    return path / (
        f"config-resume-{Path(resume_from).name}.yaml"
        if resume_from is not None and _resuming_inside(path, resume_from)
        else "config.yaml"
    )


def finish_run(output_dir: str | None) -> None:
    """PNG plots of the main curves into ``output_dir/plots`` (``rlhfkit report`` adds the HTML)."""
    if output_dir and (Path(output_dir) / "metrics.jsonl").exists():  # a max_steps=0 run logged nothing
        from ..report import write_plots

        with writing(Path(output_dir) / "plots"):
            write_plots(output_dir)
