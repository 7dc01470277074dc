"""The run's record: ``open_run`` creates the run directory once everything has loaded and
``record_run`` writes ``config.yaml`` — the trainer config plus its model, data and rewards, as
the job of the matching command (``config/jobs.py``), so ``rlhfkit <command> --config
<run>/config.yaml`` reruns a run started from Python exactly as one started from the command
line. Every trainer records its run here; the one writer of the record.

``run.json`` (``RUN_FILE``) records the run as an event — when and where it ran: ``record_start``
(from ``open_run``) appends a session (start time, rlhfkit's git commit, the versions of rlhfkit,
torch and transformers, Python, host, device, processes, command line) and ``record_end`` (from
``Run.finish``) gives it its end time and duration. A run resumed inside its directory adds a
session; ``rlhfkit report`` shows them (``report/runs.py:run_metadata``)."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from .. import distributed
from ..config.io import config_values, save_config
from ..config.jobs import JOBS
from ..files import write_text_atomic, writing
from ..models.sources import model_source
from .directory import check_inputs_outside, prepare_run_dir, run_config_path


def open_run(output_dir, args, model, datasets: dict, **sources) -> Path | None:
    """Once the model, data and rewards have loaded (``output_dir``: None on the processes that do
    not write): refuse to clear a directory that holds one of the run's inputs
    (``check_inputs_outside``), create the run directory (``prepare_run_dir``) and record
    the run (``record_run``)."""
    if not output_dir:
        return None
    inputs = {
        "model": model,
        **{name: given for name, (given, _) in datasets.items()},
        "reward_funcs": sources.get("reward_funcs"),
        "ref_model": sources.get("ref_model"),
        "teacher_model": sources.get("teacher_model") or getattr(args, "teacher_model", None),
        "critic_init": getattr(args, "critic_init", None),
    }
    check_inputs_outside(output_dir, args.overwrite, args.resume_from, inputs)
    prepare_run_dir(output_dir, args.overwrite, resume_from=args.resume_from)
    path = record_run(args, model, datasets, args.resume_from, **sources)
    record_start(output_dir, args.resume_from)
    return path


RUN_FILE = "run.json"


def record_start(output_dir, resume_from=None) -> Path | None:
    """Append this session's start to ``<output_dir>/run.json`` (a resumed run keeps the earlier
    sessions): ISO start time, rlhfkit's git commit (and whether its tree had changes), the
    versions of rlhfkit, torch, transformers and Python, the host, the device, the number of
    processes, the command line, ``resume_from``. What cannot be found is ``None``. Returns the
    file, or None when it could not be written (``_write_sessions``)."""
    import torch

    from .. import __version__

    path = Path(output_dir) / RUN_FILE
    sessions = _sessions(path)
    commit, dirty = _git_commit(Path(__file__).resolve().parents[2])
    device = None
    if torch.cuda.is_initialized():  # a run on GPUs has loaded its model there; never start CUDA just to ask
        device = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    sessions.append(
        {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "started_unix": time.time(),
            "ended": None,
            "duration_s": None,
            "git_commit": commit,
            "git_dirty": dirty,
            "rlhfkit": __version__,
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "python": sys.version.split()[0],
            "host": socket.gethostname(),
            "device": device or "cpu",
            "processes": distributed.planned_world(),
            "argv": list(sys.argv),
            "resume_from": None if resume_from is None else str(resume_from),
        }
    )
    return _write_sessions(path, sessions)


def record_end(output_dir) -> Path | None:
    """The end of the session ``record_start`` opened: its end time and duration in ``run.json``
    (nothing when the run has no directory or no record)."""
    if not output_dir:
        return None
    path = Path(output_dir) / RUN_FILE
    sessions = _sessions(path)
    if not sessions:
        return None
    now = time.time()
    sessions[-1]["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now))
    started = sessions[-1].get("started_unix")
    sessions[-1]["duration_s"] = round(now - started, 3) if isinstance(started, (int, float)) else None
    return _write_sessions(path, sessions)


def _write_sessions(path: Path, sessions: list[dict]) -> Path | None:
    """run.json, whole or not at all. It never stops a run: a failed write is a warning naming the
    file, and None (a full disk, silently: the run's next write fails and its one line names it)."""
    try:
        write_text_atomic(path, json.dumps({"sessions": sessions}, indent=1) + "\n")
    except OSError as err:
        import errno
        import warnings

        if err.errno == errno.ENOSPC:  # the run's next write fails too, and its one line names the full disk
            return None
        warnings.warn(
            f"{path}: not written ({err.strerror or err}); the report shows what the run's other files tell",
            stacklevel=3,
        )
        return None
    return path


def _sessions(path: Path) -> list[dict]:
    """The sessions ``run.json`` holds; none when it is missing or not ours (it is then replaced)."""
    try:
        sessions = json.loads(path.read_text(encoding="utf-8")).get("sessions")
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _git_commit(folder: Path) -> tuple[str | None, bool | None]:
    """The commit checked out where rlhfkit's source lies, and whether tracked files differ from it
    (None, None outside a git checkout, e.g. an installed wheel, or without git)."""

    def git(*argv):
        return subprocess.run(["git", "-C", str(folder), *argv], capture_output=True, text=True, timeout=10)

    if not (folder / ".git").exists():  # an installed copy: a repository around it is not rlhfkit's
        return None, None
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None, None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def record_run(args, model, datasets: dict, resume_from=None, **sources) -> Path | None:
    """Write the run's record — the trainer config ``args`` plus its sources, as the job of the
    matching command (``RLJob``, ``SFTJob``, ``RMJob``) — to ``<output_dir>/config.yaml`` (or the
    resume record). The trainers call this; it is the one writer of the record, so a run started
    from Python records its model, data and rewards exactly as ``rlhfkit <command>`` does, and
    ``rlhfkit <command> --config <run>/config.yaml`` or ``rlhfkit eval --model <run>/checkpoint-N``
    work for it.

    ``model`` / ``ref_model``: paths, or model objects (recorded by the local directory they were
    loaded from, or "" when they have none); ``datasets``: name -> (what the user passed, the
    loaded rows) — in-memory data are written to ``<output_dir>/data/<name>.jsonl`` and recorded by
    that path; ``reward_funcs``: recorded by name, import path or directory (``reward_source``);
    ``peft_config``: a LoRA config, recorded as ``lora_r`` / ``lora_alpha`` / ``lora_target_modules``.
    """
    if not args.output_dir:
        return None
    job_cls = next((job for cfg, job in JOBS if isinstance(args, cfg)), None)
    if job_cls is None:
        raise ValueError(f"record_run: no command records a {type(args).__name__}")
    values = config_values(args)
    values["model"] = model_source(model)
    for name, (given, rows) in datasets.items():
        values[name] = _dataset_source(name, given, rows, Path(args.output_dir))
    if "reward_funcs" in sources:
        values["reward_funcs"] = tuple(reward_source(f) for f in sources.pop("reward_funcs"))
    if sources.get("reward_weights") is not None:
        values["reward_weights"] = tuple(float(w) for w in sources.pop("reward_weights"))
    sources.pop("reward_weights", None)
    if "ref_model" in sources:
        ref = sources.pop("ref_model")
        values["ref_model"] = None if ref is None else model_source(ref)
    teacher = sources.pop("teacher_model", None)
    if teacher is not None:  # an object given to the trainer: by the directory it was loaded from
        values["teacher_model"] = model_source(teacher)
    _record_agents(values, sources)
    peft = sources.pop("peft_config", None)
    if peft is not None:
        values.update(_lora_fields(peft))
    if sources:
        raise ValueError(f"record_run: unknown sources {sorted(sources)}")
    target = run_config_path(args.output_dir, resume_from)
    with writing(target):
        return save_config(job_cls(**values), target)


def _record_agents(values: dict, sources: dict) -> None:
    """Record the agents' ``tools`` and ``environment`` in ``values``, popped from ``sources``:
    importable functions / classes by 'module:qualname'."""
    from ..rewards.functions import unrecorded_reward

    tools, environment = sources.pop("tools", None), sources.pop("environment_factory", None)
    if tools:
        values["tools"] = tuple(reward_source(t) for t in tools)
    if environment is not None:
        values["environment"] = (
            reward_source(environment)
            if not isinstance(environment, dict)
            else unrecorded_reward(
                "environment_factory",
                "a dict of environment factories has no import path; the command line takes one class",
            )
        )


def reward_source(spec) -> str:
    """How a reward source is recorded: a name or path as given, a registered function by its name,
    an importable function as ``module:qualname``, a reward model by the directory it came from. A
    function of the script being run (``__main__``) is recorded as ``module:name`` when a rerun
    can import the script (``script_source``); what no import path reaches is recorded as
    ``<not importable: name — why, and what to do>``, which a rerun refuses in one line."""
    from ..rewards.functions import REWARD_FUNCTIONS, unrecorded_reward

    if isinstance(spec, (str, os.PathLike)):
        return str(spec)
    import torch

    if isinstance(spec, torch.nn.Module):  # a reward model: by its directory, if it was loaded as one
        origin = model_source(getattr(spec, "backbone", spec))
        return (
            origin
            if origin and _is_reward_model_dir(origin)
            else unrecorded_reward(
                type(spec).__name__,
                "a model object that was not loaded from a directory; save it and pass its directory",
            )
        )
    for name, fn in REWARD_FUNCTIONS.items():
        if fn is spec:
            return name
    module, qualname = getattr(spec, "__module__", None), getattr(spec, "__qualname__", "")
    name = getattr(spec, "__name__", None) or type(spec).__name__
    if module == "__main__" and qualname == name:
        return script_source(name)
    if module and module != "__main__" and "<" not in qualname and hasattr(spec, "__qualname__"):
        import importlib

        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            obj = None
        if obj is spec:
            return f"{module}:{qualname}"
    why = (
        "a lambda has no import path"
        if name == "<lambda>"
        else "defined inside a function, where no import path reaches"
        if "<locals>" in qualname
        else f"a {type(spec).__name__} object, not a function a module defines"
        if not hasattr(spec, "__qualname__")
        else f"{module}.{qualname} cannot be imported"
    )
    return unrecorded_reward(name, f"{why}; define it at the top of a module and pass 'module:{name}'")


def script_source(name: str) -> str:
    """How ``name``, a function of the script being run (``__main__``), is recorded: ``module:name``
    — the script's path under the current directory as a module (``scripts/train.py`` →
    ``scripts.train``), what a rerun from that directory imports — when importing the script runs
    nothing but imports and definitions (its run is under ``if __name__ == "__main__":``), so the
    rerun does not start the script's own run; else ``<not importable: ...>`` saying why."""
    from ..rewards.functions import unrecorded_reward

    advice = f"; move it into a module (e.g. rewards.py) and pass 'rewards:{name}'"
    file = getattr(sys.modules.get("__main__"), "__file__", None)
    if not file:
        return unrecorded_reward(
            name, "defined in an interactive session, which has no file a rerun can import" + advice
        )
    path, cwd = Path(file).resolve(), Path.cwd().resolve()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError) as err:
        return unrecorded_reward(
            name, f"defined in the script {path}, which cannot be read ({type(err).__name__})" + advice
        )
    runs = next((node.lineno for node in tree.body if not _only_defines(node)), None)
    parts = path.with_suffix("").relative_to(cwd).parts if path.is_relative_to(cwd) else ()
    if runs is not None:
        why = (
            f"defined in the script {path}, which a rerun cannot import: importing it would run its line "
            f'{runs} (guard the run of the script with if __name__ == "__main__":)'
        )
    elif not parts or not all(p.isidentifier() for p in parts):
        why = f"defined in the script {path}, which is not importable from the current directory {cwd}"
    elif not any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name for n in tree.body
    ):
        why = f"not defined at the top of the script {path}"
    else:
        return f"{'.'.join(parts)}:{name}"
    return unrecorded_reward(name, why + advice)


def _only_defines(node: ast.stmt) -> bool:
    """Whether a top-level statement of a script only imports or defines (importing it runs no
    training): imports, ``def`` / ``class``, a docstring, constants, ``if __name__ == "__main__":``."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Pass)):
        return True
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        try:
            node.value is None or ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):  # not a constant: it runs code
            return False
        return True
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _is_reward_model_dir(path: str) -> bool:
    from ..models.heads import META_FILE

    config = Path(path) / "config.json"
    archs = (json.loads(config.read_text()).get("architectures") or []) if config.is_file() else []
    return (Path(path) / META_FILE).is_file() or any(a.endswith("ForSequenceClassification") for a in archs)


def _dataset_source(name: str, given, rows, output_dir: Path) -> str | dict | None:
    """A path (or a reasoning-gym mapping) as given; in-memory rows written to
    ``<output_dir>/data/<name>.jsonl`` (numpy values as plain numbers). Rows JSON cannot hold are
    not recorded (a warning; the run goes on)."""
    if given is None:
        return None
    if isinstance(given, (str, os.PathLike)):
        return str(given)
    if isinstance(given, dict) and "reasoning_gym" in given:  # reasoning-gym tasks: the mapping regenerates them
        return dict(given)
    path = output_dir / "data" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        text = "".join(json.dumps(row, ensure_ascii=False, default=_plain) + "\n" for row in rows)
    except (TypeError, ValueError) as err:
        import warnings

        warnings.warn(f"{name}: the in-memory rows are not recorded in the run directory ({err})", stacklevel=3)
        return f"<not recorded: in-memory {name}>"
    with writing(path):
        path.write_text(text, encoding="utf-8")
    return str(path)


def _plain(value):
    """numpy scalars and arrays (and tensors) as JSON values; anything else is refused."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} values cannot be written as JSON")


def _lora_fields(peft) -> dict:
    if getattr(peft, "r", None) is None or not hasattr(peft, "lora_alpha"):
        import warnings

        warnings.warn(f"{type(peft).__name__} is not recorded in config.yaml (only LoRA settings are)", stacklevel=3)
        return {}
    targets = getattr(peft, "target_modules", None)
    targets = "" if targets is None else targets if isinstance(targets, str) else ",".join(sorted(targets))
    return {
        "lora_r": int(peft.r),
        "lora_alpha": int(peft.lora_alpha),
        "lora_dropout": float(getattr(peft, "lora_dropout", 0.0) or 0.0),
        "lora_target_modules": targets,
    }
