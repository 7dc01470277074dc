"""Plots and the HTML report of runs, read from their directories: ``metrics.jsonl`` (required),
``run.json`` (when and where it ran), ``config.yaml``, ``samples.jsonl`` and the step timeline
``trace.json`` (optional). ``write_report`` overlays one run or several in one self-contained HTML
page (inline SVG and script, nothing fetched), so it can be mailed or attached to an issue as it
is; it links the timelines (``run/trace.py``), which stay files of their own. ``write_plots``:
the PNGs a run leaves in ``plots/`` when it finishes.

Modules: ``runs`` (finding and reading runs, their metadata), ``charts`` (the SVG charts and their
script), ``page`` (the page), ``plots`` (the PNGs)."""

from .page import config_section, report_path, write_report
from .plots import MAIN_METRICS, PLOT_GROUPS, TIME_PLOT, write_plots
from .runs import find_runs, load_runs, read_jsonl, read_metrics

__all__ = [
    "MAIN_METRICS",
    "PLOT_GROUPS",
    "TIME_PLOT",
    "config_section",
    "find_runs",
    "load_runs",
    "read_jsonl",
    "read_metrics",
    "report_path",
    "write_plots",
    "write_report",
]
_config_section = config_section  # its name before the report became a package (tests/test_run_record.py)
