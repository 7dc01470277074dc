"""Plots and the HTML run report (rlhfkit/report/) on synthetic run directories: one run; several
overlaid (tests/report/test_compare.py); in a real browser (tests/report/test_browser.py, slow)."""

from __future__ import annotations

import json
import re

import pytest

from rlhfkit.config import RLConfig, save_config
from rlhfkit.report import read_metrics, write_plots, write_report
from rlhfkit.report.charts import ema

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _run_dir(tmp_path, steps=10, samples=True, config=True):
    run = tmp_path / "my-run"
    run.mkdir()
    rows = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward/mean": step / steps,
            "reward/std": 0.1,
            "kl/k1": 0.01 * step,
            "policy/entropy": 2.0 - 0.1 * step,
            "perf/step_time": 0.5,
        }
        if step % 5 == 0:
            row["eval/loss"] = 1.0 / step  # logged only every few steps
        rows.append(row)
    _write_jsonl(run / "metrics.jsonl", rows)
    if samples:
        _write_jsonl(
            run / "samples.jsonl",
            [
                {
                    "step": step,
                    "prompt": f"prompt <{step}> & {i}",
                    "completion": f"<b>answer {step}.{i}</b>",
                    "score": step / 10,
                }
                for step in range(1, steps + 1)
                for i in range(5)
            ],
        )
    if config:
        save_config(RLConfig(algorithm="ppo", kl_coef=0.1), run / "config.yaml")
    return run


def test_write_plots_one_png_per_present_group(tmp_path):
    run = _run_dir(tmp_path)
    paths = write_plots(run)
    assert sorted(p.name for p in paths) == ["entropy.png", "kl.png", "loss.png", "reward.png"]
    for path in paths:
        assert path.parent == run / "plots" and path.read_bytes().startswith(PNG_MAGIC)
    assert not (run / "plots" / "critic_loss.png").exists()  # absent metrics are skipped


def test_write_plots_with_no_plotted_metric(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [{"step": 1, "perf/step_time": 1.0}])
    assert write_plots(run) == []


def test_missing_metrics_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"metrics\.jsonl: no such file"):
        write_plots(tmp_path)
    with pytest.raises(ValueError, match=r"metrics\.jsonl"):
        write_report(tmp_path)


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]", '{"reward/mean": 1.0}'])
def test_bad_metrics_line_is_named(tmp_path, bad):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n\n' + bad + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 3: "):
        write_plots(tmp_path)


def test_report_is_self_contained_and_escaped(tmp_path):
    run = _run_dir(tmp_path)
    path = write_report(run)
    assert path == run / "report.html"
    page = path.read_text(encoding="utf-8")
    assert "<h1>my-run</h1>" in page
    # one inline SVG chart per logged metric (perf/* too), nothing fetched: no file, no network
    charts = re.findall(
        r'<div class="plot" data-metric="([^"]+)"><div class="title">[^<]*</div><svg class="chart"', page
    )
    assert sorted(charts) == ["eval/loss", "kl/k1", "perf/step_time", "policy/entropy", "reward/mean", "reward/std"]
    assert not re.search(
        r"""(src|href)=["']?(https?:|//|plots/)|<link|@import|url\((?!#)""", page
    )  # url(#clip): in the page
    assert page.count("<script") == 2 and '<script type="application/json" id="report-data">' in page
    # samples: escaped, never raw
    assert "&lt;b&gt;answer 10.0&lt;/b&gt;" in page and "<b>answer" not in page
    assert "prompt &lt;1&gt; &amp; 0" in page
    # config as a table, resolved values
    assert "<td>kl_coef</td><td>0.1</td>" in page and "<td>advantage_estimator</td><td>gae (ppo preset)</td>" in page
    # summary: first and last value of the main metrics
    assert "<td>reward/mean</td><td>0.1</td><td>1</td><td>1</td><td>10</td>" in page
    assert "perf/step_time</td>" not in page
    assert "No samples.jsonl" not in page and "No config.yaml" not in page


def test_a_chart_draws_the_raw_line_faint_and_the_smoothed_line_over_it(tmp_path):
    run = _run_dir(tmp_path)
    page = write_report(run).read_text(encoding="utf-8")
    chart = page.split('data-metric="reward/mean"')[1].split("</svg>")[0]
    raw = re.findall(r'<path class="raw" data-run="0" stroke="#1f77b4" d="M([^"]+)"', chart)
    smooth = re.findall(r'<path class="smooth" data-run="0" stroke="#1f77b4" d="M([^"]+)"', chart)
    assert len(raw) == len(smooth) == 1 and raw[0].count("L") == smooth[0].count("L") == 9  # 10 points
    assert raw[0] != smooth[0] and raw[0].split("L")[0] == smooth[0].split("L")[0]  # debiased: same first point
    assert len(re.findall(r'<circle class="dot"', chart)) == 10  # a short line shows its points
    sparse = page.split('data-metric="eval/loss"')[1].split("</svg>")[0]
    assert len(re.findall(r'<circle class="dot"', sparse)) == 2  # logged every 5 steps: both points visible


def test_ema_is_tensorboards_debiased_moving_average():
    assert ema([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased: no pull towards 0
    assert ema([0.0, 1.0], 0.5) == pytest.approx([0.0, 0.5 / 0.75])  # (0.5·0 + 0.5·1) / (1 - 0.5²)
    assert ema([3.0, 5.0], 0.0) == [3.0, 5.0]


def test_report_samples_spread_over_the_run(tmp_path):
    page = write_report(_run_dir(tmp_path)).read_text(encoding="utf-8")
    steps = [int(s) for s in re.findall(r"<h4>Step (\d+)</h4>", page)]
    assert steps == [1, 4, 7, 10]  # at most 4 steps, first and last included
    assert page.count('<div class="sample">') == 4 * 4  # a few samples per step, not all 5
    assert "score 1" in page


def test_report_with_few_sample_steps(tmp_path):
    page = write_report(_run_dir(tmp_path, steps=2)).read_text(encoding="utf-8")
    assert re.findall(r"<h4>Step (\d+)</h4>", page) == ["1", "2"]


def test_report_notes_missing_optional_files(tmp_path):
    run = _run_dir(tmp_path, samples=False, config=False)
    page = write_report(run).read_text(encoding="utf-8")
    assert "No samples.jsonl in this run directory." in page
    assert "No config.yaml in this run directory." in page
    assert (run / "plots" / "reward.png").is_file()


def test_report_notes_unreadable_config_and_bad_samples(tmp_path):
    run = _run_dir(tmp_path, samples=False, config=False)
    (run / "config.yaml").write_text("a: [1\n")
    page = write_report(run).read_text(encoding="utf-8")
    assert "config.yaml could not be read" in page
    (run / "samples.jsonl").write_text("oops\n")
    with pytest.raises(ValueError, match=r"samples\.jsonl: line 1: "):
        write_report(run)


def test_report_without_plottable_metrics(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [{"step": 1, "perf/step_time": 1.0}])
    page = write_report(run).read_text(encoding="utf-8")
    assert "None of the main metrics" in page and 'data-metric="perf/step_time"' in page


def test_report_for_sft_and_reward_model_runs(tmp_path):
    run = tmp_path / "sft"
    run.mkdir()
    _write_jsonl(
        run / "metrics.jsonl", [{"step": s, "sft/loss": 3.0 / s, "rm/accuracy": 0.5 + 0.04 * s} for s in range(1, 6)]
    )
    names = sorted(p.name for p in write_plots(run))
    assert names == ["loss.png", "rm_accuracy.png"]
    page = write_report(run).read_text(encoding="utf-8")
    assert sorted(re.findall(r'data-metric="([^"]+)"', page)) == ["rm/accuracy", "sft/loss"]


def test_repeated_steps_are_merged_later_values_winning(tmp_path):
    # A run resumed from checkpoint-2 logs steps 3 and 4 again; step 0 logs an eval loss on its own line.
    _write_jsonl(
        tmp_path / "metrics.jsonl",
        [
            {"step": 0, "eval/loss": 2.0},
            {"step": 0, "sft/loss": 3.0},
            *({"step": s, "sft/loss": 9.0} for s in (1, 2, 3, 4)),
            *({"step": s, "sft/loss": 1.0 / s} for s in (3, 4, 5)),
        ],
    )
    assert read_metrics(tmp_path) == [
        {"step": 0, "eval/loss": 2.0, "sft/loss": 3.0},
        {"step": 1, "sft/loss": 9.0},
        {"step": 2, "sft/loss": 9.0},
        {"step": 3, "sft/loss": 1 / 3},
        {"step": 4, "sft/loss": 0.25},
        {"step": 5, "sft/loss": 0.2},
    ]
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "6 logged steps, last step 5." in page
    assert "<td>sft/loss</td><td>3</td><td>0</td><td>0.2</td><td>5</td>" in page


def test_report_shows_an_agent_conversation_with_tool_calls_and_results(tmp_path):
    run = _run_dir(tmp_path, steps=2, samples=False)
    conversation = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 12, "b": 7}}}],
        },
        {"role": "tool", "name": "add", "content": "19"},
        {"role": "assistant", "content": "<b>19</b>"},
    ]
    _write_jsonl(run / "samples.jsonl", [{"step": 1, "prompt": "12+7?", "completion": conversation, "score": 1.0}])
    page = write_report(run).read_text()
    assert (
        '<div class="turn assistant"><b>assistant</b>'
        '<pre class="completion">→ add({&quot;a&quot;: 12, &quot;b&quot;: 7})</pre>' in page
    )
    assert '<div class="turn tool"><b>tool</b><pre class="completion">19</pre>' in page
    assert "&lt;b&gt;19&lt;/b&gt;" in page  # escaped


def test_a_conversational_prompt_shows_as_chat_turns_not_json(tmp_path):
    from rlhfkit.run.metrics import write_samples

    run = _run_dir(tmp_path, steps=2, samples=False)
    prompt = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is <2+2>?"}]
    write_samples(str(run), 1, [prompt], ["4"], [1.0], limit=1)  # as the RL loop writes it: JSON text
    page = write_report(run).read_text()
    assert (
        '<div class="chat prompt"><div class="turn system"><b>system</b><pre class="prompt">Answer briefly.</pre>'
        '</div><div class="turn user"><b>user</b><pre class="prompt">What is &lt;2+2&gt;?</pre></div></div>'
    ) in page
    assert "&quot;role&quot;" not in page and '<pre class="completion">4</pre>' in page
