"""The report as a user sees it: opened in a real headless browser (Debian's ``chromium``;
``apt-get install -y chromium``), screenshotted, its DOM dumped after its script ran — and the
script's smoothing, zoom and hover driven as a pointer would drive them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from rlhfkit.report import write_report

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install -y chromium)"
)
RUN_COLORS = {"#1f77b4": (0x1F, 0x77, 0xB4), "#d62728": (0xD6, 0x27, 0x28), "#2ca02c": (0x2C, 0xA0, 0x2C)}


def _chromium(*args, timeout=90) -> str:
    # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1280,1400",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture()
def report(tmp_path, make_run):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    samples = [{"step": 1, "prompt": json.dumps(chat), "completion": "4", "score": 1.0}]
    for i, name in enumerate(("sft", "ppo", "grpo")):
        make_run(tmp_path / "runs" / name, steps=40, offset=0.5 * i, started=float(i), samples=samples)
    return write_report(tmp_path / "runs")


@needs_chromium
def test_the_report_renders_one_line_per_run_in_a_real_browser(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", report.as_uri())
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1400)
    colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) > 50  # text, tables, lines: not a blank page
    pixels = {rgb for _, rgb in colors}
    for name, rgb in RUN_COLORS.items():  # each run's smoothed line is on screen
        assert any(sum(abs(a - b) for a, b in zip(p, rgb)) < 12 for p in pixels), name
    dom = _chromium("--dump-dom", report.as_uri())
    charts = re.findall(r'<svg class="chart" data-i="(\d+)"[^>]*>(.*?)</svg>', dom, flags=re.S)
    assert len(charts) == 3  # reward/mean, perf/lr, perf/grad_norm
    for _, body in charts:
        assert "<clippath" in body.lower()  # redrawn by the page's script: it ran without an error
        assert re.findall(r'class="smooth" data-run="(\d)"', body) == ["0", "1", "2"]
        assert re.findall(r'class="raw" data-run="(\d)"', body) == ["0", "1", "2"]
    assert '<div class="turn user"><b>user</b><pre class="prompt">2+2?</pre></div>' in dom


DRIVE = """<script>
(function () {
  const svg = document.querySelector('.plot[data-metric="perf/lr"] svg'), r = svg.getBoundingClientRect();
  const at = (type, fx) => svg.dispatchEvent(new MouseEvent(type, {bubbles: true, clientX: r.left + fx * r.width,
                                                                    clientY: r.top + r.height / 2}));
  const xl = () => [...svg.querySelectorAll('text.xl')].map(t => +t.textContent);
  const out = {before: xl()};
  at('mousemove', 0.5); out.tip = document.getElementById('tip').textContent;
  at('mousedown', 0.3); at('mousemove', 0.55); at('mouseup', 0.55); out.zoomed = xl();
  svg.dispatchEvent(new MouseEvent('dblclick', {bubbles: true})); out.reset = xl();
  const slider = document.getElementById('smoothing'); slider.value = 0;
  slider.dispatchEvent(new Event('input'));
  const d = c => svg.querySelector('path.' + c + '[data-run="1"]').getAttribute('d');
  out.unsmoothed = d('raw') === d('smooth');
  document.body.setAttribute('data-driven', JSON.stringify(out));
})();
</script></body>"""


@needs_chromium
def test_hover_zoom_and_smoothing_work_in_a_real_browser(report, tmp_path):
    driven = tmp_path / "driven.html"
    driven.write_text(report.read_text(encoding="utf-8").replace("</body>", DRIVE))
    dom = _chromium("--dump-dom", driven.as_uri())
    out = json.loads(re.search(r"data-driven=\"([^\"]*)\"", dom).group(1).replace("&quot;", '"'))
    assert out["before"] == [10, 20, 30, 40]  # steps 1..40
    assert "perf/lr" in out["tip"] and all(f"{run}: step" in out["tip"] for run in ("sft", "ppo", "grpo"))
    low, high = out["zoomed"][0], out["zoomed"][-1]
    assert 8.9 <= low and high <= 20.4 and len(out["zoomed"]) >= 3  # steps ~8.9..20.4 dragged across, only
    assert out["reset"] == out["before"]
    assert out["unsmoothed"]  # smoothing 0: the smoothed line is the raw one
