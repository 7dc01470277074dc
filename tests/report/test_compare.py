"""Several runs in one report: every run found under a folder, several folders, each run's line in
every chart it logged, the runs' metadata side by side, the config fields that differ."""

from __future__ import annotations

import os
import re

import pytest

from rlhfkit.cli import main
from rlhfkit.report import find_runs, write_report


def _chart(page: str, metric: str) -> str:
    return page.split(f'data-metric="{metric}"')[1].split("</svg>")[0]


def _runs_in(chart: str, cls: str = "smooth") -> list[str]:
    return re.findall(rf'<path class="{cls}" data-run="(\d+)"', chart)


def test_a_folder_of_runs_is_overlaid_one_line_per_run_in_every_chart(tmp_path, make_run):
    folder = tmp_path / "quickstart-1"
    make_run(folder / "sft", metrics=("sft/loss", "perf/lr", "perf/grad_norm"), started=100.0)
    make_run(folder / "ppo", metrics=("reward/mean", "perf/lr", "perf/grad_norm"), started=300.0)
    make_run(folder / "grpo", metrics=("reward/mean", "perf/lr", "perf/grad_norm"), started=200.0, offset=1)
    make_run(folder / "ppo" / "checkpoint-2", steps=2)  # inside a run: not a run of its own
    (folder / "notes").mkdir()  # a folder without a run is passed over
    path = write_report(folder)
    assert path == folder / "report.html"
    page = path.read_text(encoding="utf-8")
    assert "<h1>3 runs: sft, grpo, ppo</h1>" in page  # in the order they started
    assert _runs_in(_chart(page, "perf/lr")) == ["0", "1", "2"] == _runs_in(_chart(page, "perf/lr"), "raw")
    assert _runs_in(_chart(page, "perf/grad_norm")) == ["0", "1", "2"]
    assert _runs_in(_chart(page, "reward/mean")) == ["1", "2"] and _runs_in(_chart(page, "sft/loss")) == ["0"]
    assert 'stroke="#1f77b4"' in _chart(page, "sft/loss") and 'stroke="#d62728"' in _chart(page, "reward/mean")
    assert re.findall(r'<label class="run"><input type="checkbox" checked data-run="(\d)">', page) == ["0", "1", "2"]
    assert page.count('<details class="run">') == 3  # each run's summary, samples and config, folded


def test_several_folders_share_one_report_in_their_common_folder(tmp_path, make_run):
    a = make_run(tmp_path / "exp" / "a" / "run", offset=0)
    b = make_run(tmp_path / "exp" / "b" / "run", offset=1)
    path = write_report([a, b])
    assert path == tmp_path / "exp" / "report.html"
    page = path.read_text(encoding="utf-8")
    assert "<h1>2 runs: a/run, b/run</h1>" in page  # same folder name: told apart by their paths
    assert "<td>directory</td><td>a/run</td><td>b/run</td>" in page
    assert _runs_in(_chart(page, "reward/mean")) == ["0", "1"]
    assert write_report([a, a]) == a / "report.html"  # the same run twice is one run


def test_the_command_takes_several_directories(tmp_path, make_run, capsys):
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    assert main(["report", str(a), str(b)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "report.html")
    assert _runs_in(_chart((tmp_path / "report.html").read_text(), "perf/lr")) == ["0", "1"]


def test_a_folder_without_runs_or_a_missing_one_is_one_line_naming_it(tmp_path, make_run, capsys):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"empty/metrics\.jsonl: no such file, nor a run .* under .*empty$"):
        find_runs(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"nowhere: no such directory$"):
        write_report([make_run(tmp_path / "a"), tmp_path / "nowhere"])
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "empty") in err


def test_the_runs_metadata_side_by_side_and_what_is_known_of_an_older_run(tmp_path, make_run):
    new = make_run(tmp_path / "runs" / "new", started=100.0)
    old = make_run(tmp_path / "runs" / "old", config="learning_rate: 0.1\n")  # before run.json: file times
    os.utime(old / "config.yaml", (1_000_000, 1_000_000))  # written when it started,
    os.utime(old / "metrics.jsonl", (1_000_075, 1_000_075))  # last written 75 s later
    page = write_report(tmp_path / "runs").read_text(encoding="utf-8")
    table = page.split('<table class="runs">')[1].split("</table>")[0]
    for row in (
        "<td>duration</td><td>1m 30s</td><td>~1m 15s</td>",
        "<td>git commit</td><td>abcdef1234</td><td>–</td>",
        "<td>torch</td><td>2.13.0</td><td>–</td>",
        "<td>transformers</td><td>5.24.0</td><td>–</td>",
        "<td>host</td><td>box-&lt;1&gt;</td><td>–</td>",
        "<td>steps</td><td>6 (last 6)</td><td>6 (last 6)</td>",
        "<td>status</td><td>finished</td><td>no run.json (an older rlhfkit): times from its files</td>",
    ):
        assert row in table, row
    assert re.search(r"<td>started</td><td>2026-01-02 10:00:00\+0000</td><td>~\d{4}-\d\d-\d\d \d\d:\d\d</td>", table)
    assert new.name in page and old.name in page


def test_an_unfinished_run_says_so(tmp_path, make_run):
    import json

    run = make_run(tmp_path / "run", started=100.0)
    record = json.loads((run / "run.json").read_text())
    record["sessions"][0].update(ended=None, duration_s=None)
    (run / "run.json").write_text(json.dumps(record))
    page = write_report(run).read_text(encoding="utf-8")
    assert "<td>status</td><td>did not finish (last write " in page


def test_the_config_fields_that_differ_between_runs(tmp_path, make_run):
    make_run(tmp_path / "a", config="learning_rate: 0.1\nseed: 1\nkl_coef: 0.05\n", started=1.0)
    make_run(tmp_path / "b", config="learning_rate: 0.2\nseed: 1\n", started=2.0)
    make_run(tmp_path / "c", config="learning_rate: 0.2\nseed: 1\n", started=3.0)
    page = write_report(tmp_path).read_text(encoding="utf-8")
    section = page.split("<h2>Config differences</h2>")[1].split("</table>")[0]
    assert "<td>learning_rate</td><td>0.1</td><td>0.2</td><td>0.2</td>" in section
    assert "seed" not in section and "kl_coef" not in section  # equal, or one run's field only


def test_non_finite_values_are_left_out_and_an_empty_log_is_no_error(tmp_path, make_run):
    run = tmp_path / "runs" / "nan"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "loss": NaN, "lr": 0.1}\n{"step": 2, "loss": NaN, "lr": Infinity}\n'
        '{"step": 3, "loss": NaN, "lr": 0.3}\n'
    )
    (tmp_path / "runs" / "empty").mkdir()
    (tmp_path / "runs" / "empty" / "metrics.jsonl").write_text("")
    page = write_report(tmp_path / "runs").read_text(encoding="utf-8")
    assert 'data-metric="loss"' not in page  # nothing finite to draw
    assert len(re.findall(r"<circle class=\"dot\"", _chart(page, "lr"))) == 2  # steps 1 and 3
    assert "NaN" not in page.split('id="report-data">')[1].split("</script>")[0]
    assert (
        "<td>steps</td><td>3 (last 3)</td><td>0</td>" in page or "<td>steps</td><td>0</td><td>3 (last 3)</td>" in page
    )
