"""The PNG plots of a run's main curves (``plots/``), written when a run finishes
(``run/directory.py:finish_run``) with matplotlib; the HTML report draws its own (``charts.py``)."""

from __future__ import annotations

from pathlib import Path

from .runs import read_metrics, series

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


def write_plots(run_dir) -> list[Path]:
    """One PNG per metric group present in ``run_dir/metrics.jsonl``, into ``run_dir/plots/``
    (written at the end of every run; the HTML report draws its own plots)."""
    run_dir = Path(run_dir)
    return _plot_rows(read_metrics(run_dir), run_dir / "plots")


def _plot_rows(rows: list[dict], out_dir: Path) -> list[Path]:
    # Imported here: matplotlib is needed for reports only. Figure + the Agg canvas, never pyplot,
    # so no global backend is switched and nothing depends on a display.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    written = []
    for stem, title, metrics, band in PLOT_GROUPS:
        present = [m for m in metrics if series(rows, m)[0]]
        if not present:
            continue
        fig = Figure(figsize=(6.4, 3.6), layout="tight")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for metric in present:
            steps, values = series(rows, metric)
            # Markers where points are sparse (an eval every N steps, a one-step run) or they vanish.
            ax.plot(steps, values, label=metric, linewidth=1.5, marker="o" if len(steps) <= 20 else None, markersize=3)
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
    from matplotlib.ticker import MaxNLocator

    names = {k[len(TIME_PREFIX) :] for r in rows for k in r if k.startswith(TIME_PREFIX)}
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
    locator = ax.xaxis.get_major_locator()
    if isinstance(locator, MaxNLocator):  # the default, AutoLocator, is one
        locator.set_params(integer=True)
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
        ax.fill_between(
            steps,
            [r[metric] - r[band] for r in both],
            [r[metric] + r[band] for r in both],
            alpha=0.2,
            label=f"± {band}",
        )
