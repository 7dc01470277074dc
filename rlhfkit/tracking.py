"""Metrics: one JSON line per step in the run directory, and a short progress line on stdout."""

from __future__ import annotations

import json
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

    def __init__(self, output_dir: str | None, log_every: int = 1, main_metric: str = "reward/mean"):
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir else None
        self.log_every, self.main_metric = log_every, main_metric
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
        if self.log_every and (step % self.log_every == 0 or step == total_steps):
            elapsed = time.perf_counter() - self.start
            shown = [self.main_metric, "kl/k1", "policy/entropy", "rollout/response_length_mean"]
            parts = " ".join(f"{k.split('/')[-1]}={row[k]:.3f}" for k in shown if k in row)
            print(f"step {step}/{total_steps} {parts} ({elapsed:.0f}s)", flush=True)
        return row
