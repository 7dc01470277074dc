"""Metrics: one JSON line per step in the run directory, a short progress line on stdout, and the
experiment trackers the config asks for (``report_to``: ``trackers.py``)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import torch


def to_floats(metrics: dict) -> dict[str, float]:
    """Tensors → Python floats in one pass (one device synchronisation per step, not per metric)."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    values = torch.stack([metrics[k].detach().float().reshape(()) for k in keys]).tolist() if keys else []
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    out.update(zip(keys, values))
    return out


class MetricsLogger:
    """Appends ``{"step": n, ...metrics}`` to ``metrics.jsonl`` and prints every ``log_every`` steps."""

    def __init__(self, output_dir: str | None, log_every: int = 1, main_metric: str = "reward/mean",
                 progress_bar: bool = True, total_steps: int | None = None, initial_step: int = 0, config=None):
        """``config``: the run's config; its ``report_to`` trackers (``trackers.py``) get every row,
        its ``run_name`` and its values. Pass it on the main process only."""
        self.trackers = None
        if config is not None and getattr(config, "report_to", ()):
            from .trackers import Trackers

            self.trackers = Trackers(config, output_dir)
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir else None
        self.log_every, self.main_metric = log_every, main_metric
        self.bar = None
        if progress_bar and log_every and total_steps and sys.stdout.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=initial_step, dynamic_ncols=True)
        self.history: list[dict] = []
        self.start = time.perf_counter()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, metrics: dict, total_steps: int) -> dict:
        row = {"step": step, **to_floats(metrics)}
        self.history.append(row)
        if self.path:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if self.trackers is not None:
            self.trackers.log(step, {k: v for k, v in row.items() if k != "step"})
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if self.main_metric in row:
                self.bar.set_postfix({self.main_metric: f"{row[self.main_metric]:.3f}"})
            if step == total_steps:
                self.bar.close()
        elif self.log_every and (step % self.log_every == 0 or step == total_steps):
            elapsed = time.perf_counter() - self.start
            shown = [self.main_metric, "kl/k1", "policy/entropy", "rollout/response_length_mean", "eval/score_mean"]
            parts = " ".join(f"{k.split('/')[-1]}={row[k]:.3f}" for k in shown if k in row)
            eta = elapsed / max(1, len(self.history)) * (total_steps - step)
            print(f"step {step}/{total_steps} {parts} ({elapsed:.0f}s, eta {eta:.0f}s)", flush=True)
        return row


    def close(self) -> None:
        """End the trackers' runs (idempotent); metrics.jsonl needs no closing."""
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None


def check_run_dir(output_dir: str | None, overwrite: bool = False, resume_from: str | None = None) -> None:
    """The refusals of ``prepare_run_dir``, writing nothing: trainers check first, load the model,
    data and rewards, and only then write to the run directory (a run that fails to load leaves
    nothing behind that would block the corrected rerun)."""
    if not output_dir:
        return
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output_dir {str(path)!r} exists and is not a directory")
    if path.exists() and any(path.iterdir()) and not (overwrite or _resuming_inside(path, resume_from)):
        hint = (f" (resume_from={resume_from!r} is not inside it)" if resume_from else "")
        raise ValueError(f"output_dir {str(path)!r} already exists and is not empty{hint}: choose another, "
                         "set overwrite=true, or resume_from one of its checkpoints")


def prepare_run_dir(output_dir: str | None, overwrite: bool = False, resume_from: str | None = None,
                    config=None) -> Path | None:
    """Create the run directory (and write ``config`` as ``config.yaml`` when given).

    A directory that already holds files is refused — an earlier run is never overwritten
    silently — unless ``overwrite`` (then what an earlier rlhfkit run wrote there is removed:
    ``remove_previous_run``) or ``resume_from`` is a checkpoint *inside* it (the run continues: the
    logs keep the rows up to the checkpoint's step, and the config of the resumed run goes to
    ``config-resume-<name>.yaml``)."""
    check_run_dir(output_dir, overwrite, resume_from)
    if not output_dir:
        return None
    path = Path(output_dir)
    resuming = _resuming_inside(path, resume_from)
    if resuming:
        _truncate_logs(path, resume_from)
    elif overwrite and path.is_dir():
        remove_previous_run(path)
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        from .config_io import save_config

        save_config(config, run_config_path(path, resume_from))
    return path


# What an rlhfkit run writes in its directory, and nothing else is removed by --overwrite.
_RUN_FILES = ("metrics.jsonl", "samples.jsonl", "report.html", "config.yaml")
_RUN_GLOBS = ("config-resume-*.yaml", "data/train_dataset.jsonl", "data/eval_dataset.jsonl",
              "data/center_dataset.jsonl", "runs/*/events.out.tfevents.*", "wandb/offline-run-*", "wandb/run-*",
              "wandb/latest-run", "wandb/debug.log", "wandb/debug-internal.log")
_MODEL_MARKS = ("config.json", "adapter_config.json", "trainer_state.json", "dcp", "training_state.json")


def remove_previous_run(path: Path) -> list[Path]:
    """Remove exactly what an earlier rlhfkit run wrote in ``path`` — its logs and record, its
    plots (the PNG files of ``report.PLOT_GROUPS``), tracker files, recorded data, and its
    ``checkpoint-<step>/`` and ``final/`` directories (those holding a model or checkpoint) — and
    never another file; directories left empty go too. Returns what was removed."""
    from .report import PLOT_GROUPS

    doomed = [path / name for name in _RUN_FILES]
    doomed += [p for pattern in _RUN_GLOBS for p in path.glob(pattern)]
    doomed += [path / "plots" / f"{stem}.png" for stem, *_ in PLOT_GROUPS]
    doomed += [p for p in [*path.glob("checkpoint-*"), path / "final"]
               if p.is_dir() and any((p / mark).exists() for mark in _MODEL_MARKS)]
    removed = []
    for target in doomed:
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        else:
            continue
        removed.append(target)
    for folder in ("plots", "data", "wandb", *(str(p.relative_to(path)) for p in path.glob("runs/*")), "runs"):
        try:
            (path / folder).rmdir()  # only when empty
        except OSError:
            pass
    return removed


def _truncate_logs(output_dir: Path, resume_from: str) -> None:
    """Resumed inside its run: ``metrics.jsonl`` and ``samples.jsonl`` keep only the rows up to the
    checkpoint's step (the resumed run writes the later ones again, so none appears twice)."""
    state = Path(resume_from) / "trainer_state.json"
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
        tmp.write_text("".join(kept))
        tmp.replace(file)


def latest_checkpoint(output_dir) -> str:
    """``resume_from='latest'``: the newest complete ``checkpoint-<step>`` (one holding
    ``trainer_state.json``, written last) of ``output_dir``; one line when there is none."""
    found = [p for p in Path(output_dir or ".").glob("checkpoint-*")
             if p.name.split("-", 1)[1].isdigit() and (p / "trainer_state.json").is_file()] if output_dir else []
    if not found:
        raise ValueError(f"resume_from='latest': no complete checkpoint-<step> directory in output_dir={output_dir!r}")
    return str(max(found, key=lambda p: int(p.name.split("-", 1)[1])))


def _resuming_inside(output_dir: Path, resume_from: str | None) -> bool:
    return resume_from is not None and Path(output_dir).resolve() in Path(resume_from).resolve().parents


def run_config_path(output_dir, resume_from: str | None = None) -> Path:
    """Where a run records its config: ``config.yaml``, or ``config-resume-<checkpoint>.yaml`` for a
    run resumed from one of its own checkpoints (the first run's record is kept)."""
    path = Path(output_dir)
    return path / (f"config-resume-{Path(resume_from).name}.yaml" if _resuming_inside(path, resume_from)
                   else "config.yaml")


def finish_run(output_dir: str | None) -> None:
    """PNG plots of the main curves into ``output_dir/plots`` (``rlhfkit report`` adds the HTML)."""
    if output_dir and (Path(output_dir) / "metrics.jsonl").exists():  # a max_steps=0 run logged nothing
        from .report import write_plots

        write_plots(output_dir)


def write_samples(output_dir: str | None, step: int, prompts, completions, scores, limit: int) -> None:
    """Append up to ``limit`` ``{"step", "prompt", "completion", "score"}`` lines to samples.jsonl."""
    if not output_dir or limit <= 0:
        return
    with (Path(output_dir) / "samples.jsonl").open("a") as f:
        for p, c, s in list(zip(prompts, completions, scores))[:limit]:
            f.write(json.dumps({"step": step, "prompt": p if isinstance(p, str) else json.dumps(p),
                                "completion": c, "score": float(s)}) + "\n")
