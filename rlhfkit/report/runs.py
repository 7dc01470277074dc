"""The runs a report shows: found under the folders given (``find_runs``), their logged rows
(``read_metrics``) and what is known of when and where each ran (``run_metadata``: ``run.json``,
written by ``run/record.py``; for a run from before it, what its files' times tell)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..data.prompts import read_jsonl_numbered

RUN_FILE = "run.json"  # run/record.py:RUN_FILE (the report may not import the run layer)


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL log, each a JSON object with a numeric ``step``; a ``ValueError`` names the
    file (and line) when it is missing or a row is malformed."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such file")
    rows = []
    for lineno, row in read_jsonl_numbered(Path(path)):
        if not isinstance(row.get("step"), (int, float)):
            raise ValueError(f"{path}: line {lineno}: expected a JSON object with a numeric 'step'")
        rows.append(row)
    return rows


def read_metrics(run_dir) -> list[dict]:
    """``run_dir/metrics.jsonl`` as one row per step, sorted. Rows of the same step are merged, later
    values winning: a resumed run logs again the steps after its checkpoint, and some trainers log
    a step's metrics in two lines (e.g. an eval loss at step 0)."""
    merged: dict = {}
    for row in read_jsonl(Path(run_dir) / "metrics.jsonl"):
        merged.setdefault(row["step"], {}).update(row)
    return [merged[step] for step in sorted(merged)]


def series(rows: list[dict], metric: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``metric``: the rows holding a finite number for it."""
    points = [
        (r["step"], r[metric])
        for r in rows
        if isinstance(r.get(metric), (int, float)) and not isinstance(r.get(metric), bool) and math.isfinite(r[metric])
    ]
    return [s for s, _ in points], [v for _, v in points]


def metric_names(rows: list[dict]) -> list[str]:
    """Every metric logged as a number in ``rows`` (not ``step``), in first-logged order."""
    names: dict = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                names.setdefault(key, None)
    return list(names)


@dataclass
class RunData:
    """One run: its directory, its name in the report (unique), its merged rows, its metadata."""

    path: Path
    name: str = ""
    rows: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def find_runs(dirs) -> list[Path]:
    """The run directories (holding a ``metrics.jsonl``) given or found under the folders given, in
    the order given, each folder's by start time; a run is never searched for runs inside it. One
    line naming the folder when it is missing or holds no run."""
    dirs = [dirs] if isinstance(dirs, (str, os.PathLike)) else list(dirs)
    if not dirs:
        raise ValueError("no run directory given")
    found: dict = {}
    for given in map(Path, dirs):
        if not given.is_dir():
            raise ValueError(f"{given}: no such directory" if not given.exists() else f"{given}: not a directory")
        if (given / "metrics.jsonl").is_file():
            runs = [given]
        else:
            runs = []
            for root, folders, files in os.walk(given):
                if "metrics.jsonl" in files:
                    runs.append(Path(root))
                    folders.clear()  # a run's checkpoints and data are not runs
                else:
                    folders.sort()
            if not runs:
                raise ValueError(
                    f"{given / 'metrics.jsonl'}: no such file, nor a run (a folder with a metrics.jsonl) "
                    f"anywhere under {given}"
                )
            runs.sort(key=lambda p: (_started(p), str(p)))
        for run in runs:
            found.setdefault(run.resolve(), run)
    return list(found.values())


def load_runs(dirs) -> list[RunData]:
    """``find_runs`` read: rows, metadata, and names unique in the report (each run's path below
    the folder all of them share; a lone run by its folder's name)."""
    paths = find_runs(dirs)
    resolved = [p.resolve() for p in paths]
    common = Path(os.path.commonpath(resolved)) if len(paths) > 1 else resolved[0].parent
    runs = []
    for path, full in zip(paths, resolved):
        rows = read_metrics(path)
        name = str(full.relative_to(common)) if full != common else full.name
        runs.append(RunData(path, name or full.name, rows, run_metadata(path, rows)))
    return runs


def _started(path: Path) -> float:
    meta = _sessions(path)
    first = meta[0].get("started_unix") if meta else None
    return first if isinstance(first, (int, float)) else _mtime(path / "config.yaml") or _mtime(path / "metrics.jsonl")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _sessions(path: Path) -> list[dict]:
    try:
        sessions = json.loads((path / RUN_FILE).read_text(encoding="utf-8")).get("sessions")
    except (OSError, ValueError, AttributeError):
        return []
    return [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def duration_text(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "–"
    seconds = int(round(seconds))
    h, m, s = seconds // 3600, seconds // 60 % 60, seconds % 60
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{s}s"


def run_metadata(path: Path, rows: list[dict]) -> dict:
    """What the report's run table shows — started, duration, status, steps, git commit, versions,
    host, device — from ``run.json``; a run without it (an older rlhfkit) gets its start and last
    write from its files' times, marked ``~``, and ``–`` where nothing is known. A run resumed in
    its directory has several sessions: its duration sums them; differing values are all listed."""
    sessions = _sessions(path)
    steps = f"{len(rows)} (last {rows[-1]['step']:g})" if rows else "0"
    if not sessions:
        start, last_write = _mtime(path / "config.yaml"), _mtime(path / "metrics.jsonl")
        return {
            "started": f"~{_when(start)}" if start else "–",
            "duration": f"~{duration_text(last_write - start)}" if start and last_write >= start else "–",
            "status": "no run.json (an older rlhfkit): times from its files",
            "steps": steps,
        }

    def values(key):
        seen = [str(s[key]) for s in sessions if s.get(key) not in (None, "")]
        return ", ".join(dict.fromkeys(seen)) or "–"

    durations = [s.get("duration_s") for s in sessions]
    last = sessions[-1]
    if last.get("ended"):
        status = "finished" + (f" (resumed {len(sessions) - 1}×)" if len(sessions) > 1 else "")
    else:  # still running, interrupted or failed: its last write says when it was last heard of
        status = f"did not finish (last write {_when(_mtime(path / 'metrics.jsonl'))})"
        if isinstance(last.get("started_unix"), (int, float)):
            durations[-1] = max(0.0, _mtime(path / "metrics.jsonl") - last["started_unix"])
    known = [d for d in durations if isinstance(d, (int, float))]
    commits = [
        (s.get("git_commit") or "")[:10] + ("+changes" if s.get("git_dirty") else "")
        for s in sessions
        if s.get("git_commit")
    ]
    return {
        "started": str(sessions[0].get("started") or "–").replace("T", " "),
        "duration": duration_text(sum(known)) if known else "–",
        "status": status,
        "steps": steps,
        "git commit": ", ".join(dict.fromkeys(commits)) or "–",
        **{key: values(key) for key in ("rlhfkit", "torch", "transformers", "python", "host", "device", "processes")},
        "command": " ".join(map(str, last.get("argv") or [])) or "–",
    }
