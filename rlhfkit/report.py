"""Plots and the HTML run report, read from a run directory: ``metrics.jsonl`` (required),
``config.yaml``, ``samples.jsonl`` and the step timeline ``trace.json`` (optional). The report is
one self-contained HTML page (plots embedded as base64), so it can be mailed or attached to an issue
as it is; it links the timeline (``run/trace.py``), which stays a file of its own.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import yaml

from .data.prompts import read_jsonl_numbered
from .files import write_text_atomic

# One figure per group: (file stem, title, metrics drawn, metric drawn as a ± band around the first).
PLOT_GROUPS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
    ("reward", "Reward", ("reward/mean",), "reward/std"),
    ("kl", "KL to the reference (k1)", ("kl/k1",), None),
    ("entropy", "Policy entropy", ("policy/entropy",), None),
    ("clip_frac", "Clip fraction", ("policy/clip_frac",), None),
    ("critic_loss", "Critic loss", ("critic/loss",), None),
    ("eval_score", "Held-out score (greedy)", ("eval/score_mean",), None),
    ("response_length", "Response length (tokens)", ("rollout/response_length_mean",), None),
    ("loss", "Loss", ("sft/loss", "rm/loss", "dpo/loss", "eval/loss"), None),
    ("rm_accuracy", "Reward-model accuracy", ("rm/accuracy", "eval/accuracy"), None),
    ("dpo_rewards", "DPO implicit rewards", ("rewards/chosen", "rewards/rejected", "rewards/margins"), None),
    ("dpo_accuracy", "DPO reward accuracy", ("rewards/accuracies", "eval/rewards/accuracies"), None),
)
MAIN_METRICS = tuple(m for _, _, metrics, band in PLOT_GROUPS for m in (*metrics, band) if m)
# Where each step's seconds went: stacked bars of the perf/time_<phase> metrics (the RL loop's timers).
TIME_PLOT, TIME_PREFIX = "time", "perf/time_"
PHASE_ORDER = ("generate", "reward", "wait", "logprobs", "update", "weight_sync")  # the loop's order; others after
SAMPLE_STEPS, SAMPLES_PER_STEP = 4, 4


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


def _series(rows: list[dict], metric: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float))]
    return [s for s, _ in points], [v for _, v in points]


def write_plots(run_dir) -> list[Path]:
    """One PNG per metric group present in ``run_dir/metrics.jsonl``, into ``run_dir/plots/``."""
    run_dir = Path(run_dir)
    return _plot_rows(read_metrics(run_dir), run_dir / "plots")


def _plot_rows(rows: list[dict], out_dir: Path) -> list[Path]:
    # Imported here: matplotlib is needed for reports only. Figure + the Agg canvas, never pyplot,
    # so no global backend is switched and nothing depends on a display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    for stem, title, metrics, band in PLOT_GROUPS:
        present = [m for m in metrics if _series(rows, m)[0]]
        if not present:
            continue
        fig = Figure(figsize=(6.4, 3.6), layout="tight")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for metric in present:
            steps, values = _series(rows, metric)
            # Markers where points are sparse (an eval every N steps, a one-step run) or they vanish.
            ax.plot(steps, values, label=metric, linewidth=1.5, marker="o" if len(steps) <= 20 else None,
                    markersize=3)
        if band and metrics[0] in present:
            _draw_band(ax, rows, metrics[0], band)
        ax.set(title=title, xlabel="step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{stem}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    timed = _time_plot(rows, out_dir)
    return written + ([timed] if timed else [])


def _time_plot(rows: list[dict], out_dir: Path) -> Path | None:
    """``plots/time.png``: each step's ``perf/time_*`` seconds as stacked bars, one colour per phase."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = {k[len(TIME_PREFIX):] for r in rows for k in r if k.startswith(TIME_PREFIX)}
    phases = [p for p in PHASE_ORDER if p in names] + sorted(names - set(PHASE_ORDER))
    timed = [r for r in rows if any(isinstance(r.get(TIME_PREFIX + p), (int, float)) for p in phases)]
    if not timed:
        return None
    fig = Figure(figsize=(6.4, 3.6), layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = [r["step"] for r in timed]
    width = 0.8 * min([b - a for a, b in zip(steps, steps[1:]) if b > a] or [1])
    bottom = [0.0] * len(timed)
    for phase in phases:
        seconds = [float(r.get(TIME_PREFIX + phase) or 0.0) for r in timed]
        ax.bar(steps, seconds, width, bottom=bottom, label=phase, linewidth=0)
        bottom = [b + s for b, s in zip(bottom, seconds)]
    ax.set(title="Time per step by phase", xlabel="step", ylabel="seconds")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize="small")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{TIME_PLOT}.png"
    fig.savefig(path, dpi=100)
    return path


def _draw_band(ax, rows: list[dict], metric: str, band: str) -> None:
    both = [r for r in rows if isinstance(r.get(metric), (int, float)) and isinstance(r.get(band), (int, float))]
    if both:
        steps = [r["step"] for r in both]
        ax.fill_between(steps, [r[metric] - r[band] for r in both], [r[metric] + r[band] for r in both],
                        alpha=0.2, label=f"± {band}")


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


def _config_section(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return _note("No config.yaml in this run directory.")
    try:
        config = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        return _note(f"config.yaml could not be read: {' '.join(str(e).split())}")
    if not isinstance(config, dict):
        return _note("config.yaml is not a mapping of field names to values.")
    from .config import PRESETS

    preset = PRESETS.get(config.get("algorithm"), {})  # unset preset fields (null): show what they were
    return _table(["field", "value"], [[k, f"{preset[k]} ({config['algorithm']} preset)" if v is None and k in preset
                                        else v] for k, v in config.items()])


def _summary_section(rows: list[dict]) -> str:
    table = []
    for metric in MAIN_METRICS:
        steps, values = _series(rows, metric)
        if steps:
            table.append([metric, values[0], steps[0], values[-1], steps[-1], min(values), max(values)])
    if not table:
        return _note("None of the main metrics is in metrics.jsonl.")
    return _table(["metric", "first", "at step", "last", "at step", "min", "max"], table)


def _plots_section(plots: list[Path]) -> str:
    if not plots:
        return _note("No plots: none of the plotted metrics is in metrics.jsonl.")
    imgs = []
    for path in plots:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        imgs.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(path.stem)}">')
    return '<div class="plots">' + "".join(imgs) + "</div>"


def _timeline_section(run_dir: Path) -> str:
    """A link to the step timeline (``trace.json``, next to the report), and how to open it."""
    how = ("Open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing: one row per process "
           "(trainer and generator ranks), each step with its phases nested inside.")
    if (run_dir / "trace.json").is_file():
        return f'<p><a href="trace.json">trace.json</a> — {html.escape(how)}</p>'
    if any((run_dir / "trace").glob("rank-*.jsonl")):
        return _note("The run did not finish: its processes' timelines are in trace/; "
                     "`python -m rlhfkit.run.trace <run_dir>` (or `rlhfkit report`) merges them into trace.json.")
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
        parts.append(f"<h3>Step {html.escape(_fmt(step))}</h3>")
        for s in by_step[step][:SAMPLES_PER_STEP]:
            score = s.get("score")
            parts.append(
                '<div class="sample">'
                f'<div class="score">score {html.escape(_fmt(score)) if score is not None else "–"}</div>'
                f'<pre class="prompt">{html.escape(str(s.get("prompt", "")))}</pre>'
                f'{_completion_html(s.get("completion", ""))}</div>'
            )
    return "".join(parts)


def _completion_html(completion) -> str:
    """A completion: its text, or an agent's conversation turn by turn (assistant text, each
    tool call with its arguments, each tool result)."""
    if not isinstance(completion, list):
        return f'<pre class="completion">{html.escape(str(completion))}</pre>'
    turns = []
    for m in completion:
        role = str(m.get("role", "?")) if isinstance(m, dict) else "?"
        text = str(m.get("content") or "") if isinstance(m, dict) else str(m)
        for call in (m.get("tool_calls") or []) if isinstance(m, dict) else []:
            fn = call.get("function", call)
            text += f"\n→ {fn.get('name')}({json.dumps(fn.get('arguments'))})"
        turns.append(f'<div class="turn {html.escape(role)}"><b>{html.escape(role)}</b>'
                     f'<pre class="completion">{html.escape(text.strip())}</pre></div>')
    return "".join(turns)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }
th { background: #f3f3f3; }
.note { color: #777; font-style: italic; }
.plots img { width: 48%; min-width: 420px; margin: 0.5%; }
.sample { border: 1px solid #ddd; border-radius: 4px; margin: 0.5em 0; padding: 0.4em 0.8em; }
.score { font-size: 0.85em; color: #555; }
pre { white-space: pre-wrap; margin: 0.3em 0; }
pre.prompt { color: #555; }
pre.completion { background: #f7f7f7; padding: 0.3em; }
"""


def write_report(run_dir) -> Path:
    """Regenerate the plots and write ``run_dir/report.html``: summary, plots, a link to the step
    timeline, samples, config. A ``report.html`` there that rlhfkit did not write (its title says
    so) is refused, never replaced."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    path = run_dir / "report.html"
    if path.exists() and (path.is_dir() or "— rlhfkit run</title>" not in path.read_text(errors="replace")[:2000]):
        raise ValueError(f"{path} exists and is not a report rlhfkit wrote: move it away first")
    plots = _plot_rows(rows, run_dir / "plots")
    name = html.escape(run_dir.resolve().name)
    last = _fmt(max(r["step"] for r in rows)) if rows else "–"
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{name} — rlhfkit run</title>'
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>{name}</h1><p>{len(rows)} logged steps, last step {html.escape(last)}.</p>"
        f"<h2>Summary</h2>{_summary_section(rows)}"
        f"<h2>Plots</h2>{_plots_section(plots)}"
        f"<h2>Step timeline</h2>{_timeline_section(run_dir)}"
        f"<h2>Samples</h2>{_samples_section(run_dir)}"
        f"<h2>Config</h2>{_config_section(run_dir)}"
        "</body></html>\n"
    )
    write_text_atomic(path, page)  # whole or not at all
    return path
