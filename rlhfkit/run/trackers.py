"""Experiment trackers (``report_to``, TRL's name): TensorBoard, Weights & Biases, MLflow and
Trackio get every logged metric, the run name and the config, besides ``metrics.jsonl``, which is
always written. Each is an optional extra, imported only when asked for; one asked for but not
installed is one line naming the extra, raised before training starts.

Where each writes: TensorBoard event files in ``<output_dir>/runs/<run_name>``; W&B its run
directory under ``output_dir`` (``WANDB_MODE=offline`` keeps it local), project ``WANDB_PROJECT``
(default ``rlhfkit``); MLflow the tracking URI it is configured with (``MLFLOW_TRACKING_URI``),
experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``rlhfkit``); Trackio its local database
(``TRACKIO_DIR``), project ``TRACKIO_PROJECT`` (default ``rlhfkit``).

A tracker that fails while logging (a full disk, a lost server) is dropped with one warning:
training and ``metrics.jsonl`` go on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

# tracker -> (the module that must be importable, the extra that installs it)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "trackio": ("trackio", "trackio"),
}


def check_installed(names) -> None:
    """One line for the first tracker in ``names`` whose library is missing."""
    for name in names:
        module, extra = PACKAGES[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, or a broken install
            found = False
        if not found:
            raise ValueError(f"report_to: {name!r} is not installed; pip install 'rlhfkit[{extra}]'")


class Tracker(Protocol):
    """One tracker's run: each row sent, then closed."""

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def _plain(config: dict) -> dict:
    """The config as JSON values (tuples as lists, anything else as its string)."""
    return json.loads(json.dumps(config, default=str))


class _TensorBoard:
    def __init__(self, output_dir, run_name, config):
        if not output_dir:
            raise ValueError("report_to: 'tensorboard' writes event files into output_dir; set output_dir")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(output_dir) / "runs" / run_name))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, step, metrics):
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self):
        self.writer.close()


class _WandB:
    def __init__(self, output_dir, run_name, config):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rlhfkit"),
            name=run_name,
            config=config,
            reinit="create_new",
            dir=str(output_dir) if output_dir else None,  # None: wandb's default
        )

    def log(self, step, metrics):
        self.run.log(metrics, step=step)

    def close(self):
        self.run.finish()


class _MLflow:
    def __init__(self, output_dir, run_name, config):
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME", "rlhfkit"))
        self.run = mlflow.start_run(run_name=run_name)
        # MLflow caps a parameter's value at 6000 characters
        mlflow.log_params({k: (v if isinstance(v, str) else json.dumps(v))[:6000] for k, v in config.items()})

    def log(self, step, metrics):
        self.mlflow.log_metrics(metrics, step=step, run_id=self.run.info.run_id)

    def close(self):
        self.mlflow.end_run()


class _Trackio:
    def __init__(self, output_dir, run_name, config):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "rlhfkit"), name=run_name, config=config)

    def log(self, step, metrics):
        self.trackio.log(metrics, step=step)

    def close(self):
        self.trackio.finish()


_CLASSES: dict[str, Callable[[str | None, str, dict], Tracker]] = {
    "tensorboard": _TensorBoard,
    "wandb": _WandB,
    "mlflow": _MLflow,
    "trackio": _Trackio,
}


class Trackers:
    """The trackers of one run: ``Trackers(config, output_dir)`` opens them (run name:
    ``config.run_name``, else the output directory's name, else 'rlhfkit'), ``log(step, metrics)``
    sends each row, ``close()`` ends their runs (idempotent)."""

    def __init__(self, config, output_dir):
        from ..config.io import config_values

        names = tuple(getattr(config, "report_to", ()) or ())
        check_installed(names)
        run_name = getattr(config, "run_name", None) or (Path(output_dir).name if output_dir else "rlhfkit")
        values = _plain({"config_class": type(config).__name__, **config_values(config)})
        self.active: dict[str, Tracker] = {}
        for name in names:
            try:
                self.active[name] = _CLASSES[name](output_dir, run_name, values)
            except Exception as err:
                self.close()
                if isinstance(err, ValueError) and str(err).startswith("report_to:"):
                    raise
                first = (str(err).strip().splitlines() or [""])[0]
                raise ValueError(f"report_to: {name} could not start ({type(err).__name__}: {first})") from None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, tracker in list(self.active.items()):
            try:
                tracker.log(step, metrics)
            except Exception as err:  # a tracker's failure never stops training
                warnings.warn(
                    f"report_to: {name} failed to log step {step} ({type(err).__name__}: {err}); "
                    f"it is dropped for the rest of the run (metrics.jsonl is complete)",
                    stacklevel=2,
                )
                self._close_one(name)

    def close(self) -> None:
        for name in list(self.active):
            self._close_one(name)

    def _close_one(self, name: str) -> None:
        tracker = self.active.pop(name)
        try:
            tracker.close()
        except Exception as err:
            warnings.warn(f"report_to: closing {name} failed ({type(err).__name__}: {err})", stacklevel=3)
