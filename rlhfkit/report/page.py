"""The HTML report (``write_report``): one self-contained page — no file or network fetched — for
one run or several overlaid: the runs' metadata side by side, the config fields where they differ,
every logged metric as a chart (``charts.py``), and per run its summary, step timeline, samples
(conversations turn by turn) and config."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import yaml

from ..files import write_text_atomic
from .charts import STYLE as CHART_STYLE
from .charts import charts_section, color
from .plots import MAIN_METRICS, write_plots
from .runs import RunData, load_runs, read_jsonl, series

SAMPLE_STEPS, SAMPLES_PER_STEP = 4, 4
TITLE_END = "— rlhfkit run</title>"  # how a report.html rlhfkit wrote is recognised (and may be replaced)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _read_config(run_dir: Path) -> dict | str:
    """``config.yaml`` as a mapping, or the note saying why there is none."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return "No config.yaml in this run directory."
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        return f"config.yaml could not be read: {' '.join(str(e).split())}"
    return config if isinstance(config, dict) else "config.yaml is not a mapping of field names to values."


def _resolved(config: dict) -> dict:
    from ..config import PRESETS

    algorithm = config.get("algorithm")
    preset = PRESETS.get(algorithm, {}) if isinstance(algorithm, str) else {}  # unset fields (null): the preset's
    return {
        k: f"{preset[k]} ({config['algorithm']} preset)" if v is None and k in preset else v for k, v in config.items()
    }


def config_section(run_dir: Path) -> str:
    """``config.yaml`` as a table of fields and values, a preset's unset fields shown as the preset sets them."""
    config = _read_config(Path(run_dir))
    if isinstance(config, str):
        return _note(config)
    return _table(["field", "value"], [[k, v] for k, v in _resolved(config).items()])


def _config_differences(runs: list[RunData]) -> str:
    """The config fields whose values differ between the runs that have them (a field of one kind
    of run only — a PPO field beside an SFT run — is no difference; a run without it shows –)."""
    configs = [_read_config(r.path) for r in runs]
    if not any(isinstance(c, dict) for c in configs):
        return _note("None of the runs has a readable config.yaml.")
    resolved = [_resolved(c) if isinstance(c, dict) else {} for c in configs]
    fields = list(dict.fromkeys(k for c in resolved for k in c))
    rows = [
        [k, *(_fmt(c[k]) if k in c else "–" for c in resolved)]
        for k in fields
        if len({_fmt(c[k]) for c in resolved if k in c}) > 1
    ]
    if not rows:
        return _note("The runs' config.yaml files hold the same values.")
    return _table(["field", *(r.name for r in runs)], rows)


def _runs_table(runs: list[RunData], out_dir: Path) -> str:
    fields = list(dict.fromkeys(k for r in runs for k in r.meta))
    head = "".join(
        f'<th><span class="swatch" style="background:{color(i)}"></span>{html.escape(r.name)}</th>'
        for i, r in enumerate(runs)
    )
    rows = [["directory", *(os.path.relpath(r.path.resolve(), out_dir.resolve()) for r in runs)]]
    rows += [[k, *(r.meta.get(k, "–") for r in runs)] for k in fields]
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="runs"><tr><th></th>{head}</tr>{body}</table>'


def _summary_section(rows: list[dict]) -> str:
    table = []
    for metric in MAIN_METRICS:
        steps, values = series(rows, metric)
        if steps:
            table.append([metric, values[0], steps[0], values[-1], steps[-1], min(values), max(values)])
    if not table:
        return _note("None of the main metrics is in metrics.jsonl.")
    return _table(["metric", "first", "at step", "last", "at step", "min", "max"], table)


def _timeline_section(run_dir: Path, link: str) -> str:
    """A link to the step timeline (``trace.json``, at ``link`` from the report), and how to open it."""
    how = (
        "Open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing: one row per process "
        "(trainer and generator ranks), each step with its phases nested inside."
    )
    if (run_dir / "trace.json").is_file():
        return f'<p><a href="{html.escape(link)}">trace.json</a> — {html.escape(how)}</p>'
    if any((run_dir / "trace").glob("rank-*.jsonl")):
        return _note(
            "The run did not finish: its processes' timelines are in trace/; "
            "`python -m rlhfkit.run.trace <run_dir>` (or `rlhfkit report`) merges them into trace.json."
        )
    return _note("No trace.json in this run directory (a run without output_dir, or from an older rlhfkit).")


def _spread(items: list, k: int) -> list:
    """Up to ``k`` items evenly spread from the first to the last."""
    if len(items) <= k:
        return items
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def _samples_section(run_dir: Path) -> str:
    path = run_dir / "samples.jsonl"
    if not path.is_file():
        return _note("No samples.jsonl in this run directory.")
    by_step: dict = {}
    for row in read_jsonl(path):
        by_step.setdefault(row["step"], []).append(row)
    if not by_step:
        return _note("samples.jsonl is empty.")
    parts = []
    for step in _spread(sorted(by_step), SAMPLE_STEPS):
        parts.append(f"<h4>Step {html.escape(_fmt(step))}</h4>")
        for s in by_step[step][:SAMPLES_PER_STEP]:
            score = s.get("score")
            parts.append(
                '<div class="sample">'
                f'<div class="score">score {html.escape(_fmt(score)) if score is not None else "–"}</div>'
                f"{_text_or_chat(s.get('prompt', ''), 'prompt')}{_text_or_chat(s.get('completion', ''), 'completion')}"
                "</div>"
            )
    return "".join(parts)


def _messages(value) -> list | None:
    """A conversation — a list of ``{"role", "content", ...}`` messages, or such a list written as
    JSON text (how samples.jsonl holds a conversational prompt) — else None."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    return None


def _text_or_chat(value, cls: str) -> str:
    """A prompt or completion: its text, or a conversation turn by turn (each message's role and
    text, each tool call with its arguments, each tool result)."""
    messages = _messages(value)
    if messages is None:
        if isinstance(value, list):  # a list that is no conversation: shown as it is
            value = json.dumps(value)
        return f'<pre class="{cls}">{html.escape(str(value))}</pre>'
    turns = []
    for m in messages:
        role = str(m.get("role"))
        content = m.get("content")
        if isinstance(content, list):  # content parts: their text
            content = "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
        text = str(content or "")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call) if isinstance(call, dict) else {}
            text += f"\n→ {fn.get('name')}({json.dumps(fn.get('arguments'))})"
        turns.append(
            f'<div class="turn {html.escape(role)}"><b>{html.escape(role)}</b>'
            f'<pre class="{cls}">{html.escape(text.strip())}</pre></div>'
        )
    return f'<div class="chat {cls}">' + "".join(turns) + "</div>"


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1120px; color: #222; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; max-width: 100%; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #f3f3f3; }
table.runs td:first-child { color: #555; white-space: nowrap; }
.note { color: #777; font-style: italic; }
details.run { border-top: 1px solid #ddd; margin-top: 1em; }
details.run > summary { font-size: 1.3em; font-weight: 600; padding: 0.4em 0; cursor: pointer; }
.sample { border: 1px solid #ddd; border-radius: 4px; margin: 0.5em 0; padding: 0.4em 0.8em; }
.score { font-size: 0.85em; color: #555; }
pre { white-space: pre-wrap; margin: 0.3em 0; }
pre.prompt { color: #555; }
pre.completion { background: #f7f7f7; padding: 0.3em; }
.turn { margin: 0.2em 0; } .turn > b { font-size: 0.8em; color: #666; }
.turn.user pre, .turn.system pre { background: #eef4fb; padding: 0.3em; color: #222; }
.turn.tool pre { background: #f4f4e8; padding: 0.3em; }
"""


def _run_section(run: RunData, index: int, out_dir: Path, alone: bool) -> str:
    last = _fmt(max(r["step"] for r in run.rows)) if run.rows else "–"
    link = os.path.relpath((run.path / "trace.json").resolve(), out_dir.resolve())
    return (
        f'<details class="run"{" open" if alone else ""}><summary><span class="swatch" '
        f'style="background:{color(index)}"></span>{html.escape(run.name)}</summary>'
        f"<p>{len(run.rows)} logged steps, last step {html.escape(last)}.</p>"
        f"<h3>Summary</h3>{_summary_section(run.rows)}"
        f"<h3>Step timeline</h3>{_timeline_section(run.path, link)}"
        f"<h3>Samples</h3>{_samples_section(run.path)}"
        f"<h3>Config</h3>{config_section(run.path)}</details>"
    )


def report_path(dirs) -> Path:
    """Where the report of ``dirs`` goes: ``report.html`` in the one folder given, or in the
    folder the several given share."""
    dirs = [dirs] if isinstance(dirs, (str, os.PathLike)) else list(dirs)
    folder = Path(dirs[0]) if len(dirs) == 1 else Path(os.path.commonpath([Path(d).resolve() for d in dirs]))
    return folder / "report.html"


def write_report(dirs) -> Path:
    """Write ``report.html`` (``report_path``) for the runs in ``dirs`` — one run directory, a
    folder of runs (every folder below it holding a ``metrics.jsonl``), or several of either — and
    return its path. One run's report also regenerates its PNG ``plots/``. A ``report.html``
    there that rlhfkit did not write (its title says so) is refused, never replaced."""
    runs = load_runs(dirs)
    path = report_path(dirs)
    if path.exists() and (path.is_dir() or TITLE_END not in path.read_text(errors="replace")[:2000]):
        raise ValueError(f"{path} exists and is not a report rlhfkit wrote: move it away first")
    alone = len(runs) == 1
    if alone:
        write_plots(runs[0].path)
    title = runs[0].name if alone else f"{len(runs)} runs: " + ", ".join(r.name for r in runs)
    compared = "" if alone else f"<h2>Config differences</h2>{_config_differences(runs)}"
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width"><title>{html.escape(title)} {TITLE_END}'
        f"<style>{_STYLE}{CHART_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"<h2>{'Run' if alone else 'Runs'}</h2>{_runs_table(runs, path.parent)}"
        f"<h2>Metrics</h2>{charts_section(runs)}{compared}"
        + "".join(_run_section(r, i, path.parent, alone) for i, r in enumerate(runs))
        + "</body></html>\n"
    )
    write_text_atomic(path, page)  # whole or not at all
    return path
