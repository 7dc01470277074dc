"""Metrics: one JSON line per step in the run directory, a short progress line on stdout, and the
experiment trackers the config asks for (``report_to``: ``run/trackers.py``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from ..files import writing


def to_floats(metrics: dict) -> dict[str, float]:
    """Tensors → Python floats in one pass per device (one synchronisation per step, not per metric)."""
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    by_device: dict[torch.device, list[str]] = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(k)
    for keys in by_device.values():  # a step's metrics may mix CUDA tensors with CPU ones
        out.update(zip(keys, torch.stack([metrics[k].detach().float().reshape(()) for k in keys]).tolist()))
    return out


class MetricsLogger:
    """Appends ``{"step": n, ...metrics}`` to ``metrics.jsonl`` and prints every ``log_every`` steps."""

    def __init__(
        self,
        output_dir: str | None,
        log_every: int = 1,
        main_metric: str = "reward/mean",
        progress_bar: bool = True,
        total_steps: int | None = None,
        initial_step: int = 0,
        config=None,
    ):
        """``config``: the run's config; its ``report_to`` trackers (``trackers.py``) get every row,
        its ``run_name`` and its values. Pass it on the main process only."""
        self.trackers = None
        if config is not None and getattr(config, "report_to", None):
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
            with writing(self.path), self.path.open("a") as f:
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


def write_samples(
    output_dir: str | None, step: int, prompts, completions, scores, extra: dict | None = None, *, limit: int
) -> None:
    """Append up to ``limit`` ``{"step", "prompt", "completion", "score"}`` lines to samples.jsonl,
    each with its values of the ``extra`` columns (column -> one value per sample: what the reward
    functions passed to ``log_extra``; a value JSON cannot hold is written as its ``str``)."""
    if not output_dir or limit <= 0:
        return
    extra = extra or {}
    file = Path(output_dir) / "samples.jsonl"
    with writing(file), file.open("a") as f:
        for i, (p, c, s) in enumerate(list(zip(prompts, completions, scores))[:limit]):
            row = {
                "step": step,
                "prompt": p if isinstance(p, str) else json.dumps(p),
                "completion": c,
                "score": float(s),
                **{column: values[i] for column, values in extra.items()},
            }
            f.write(json.dumps(row, default=str) + "\n")
