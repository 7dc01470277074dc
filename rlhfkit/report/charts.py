"""The report's plots: one inline SVG chart per logged metric, a line per run — the smoothed line
(TensorBoard's debiased exponential moving average) over the raw one drawn faint — grouped by the
metric's prefix. The page works without its script (the SVGs are drawn here, at the default
smoothing); the inline script (``SCRIPT``, no network) redraws them for the smoothing slider, the
runs shown, a drag-selected step range (double-click: the whole run), and shows the values under
the pointer."""

from __future__ import annotations

import html
import json
import math

from .runs import RunData, metric_names, series

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
SMOOTHING = 0.6  # TensorBoard's default
DOTS = 25  # a line of at most this many points also shows them as dots
W, H, LEFT, RIGHT, TOP, BOTTOM = 440, 230, 56, 10, 10, 22  # the SVG's viewBox and plot margins
GROUP_ORDER = ("reward", "eval", "policy", "kl", "critic", "rollout", "sft", "rm", "dpo", "rewards", "agent", "perf")


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average, debiased so that it starts at the
    first value rather than at 0."""
    out, last = [], 0.0
    for n, v in enumerate(values, start=1):
        last = last * weight + (1 - weight) * v
        out.append(last / (1 - weight**n))
    return out


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values from ``lo`` to ``hi``."""
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first / step + i) * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _num(v: float) -> str:
    return f"{v:.4g}"


def _extent(lo: float, hi: float) -> tuple[float, float]:
    if hi > lo:
        return lo, hi
    pad = abs(lo) * 0.1 or 1.0
    return lo - pad, hi + pad


def chart_data(runs: list[RunData]) -> list[dict]:
    """Every metric any run logged: ``{"m": name, "s": [[run index, steps, values], ...]}``, in
    group order (``GROUP_ORDER``, then the others by name), each group's by first logging."""
    names: dict = {}
    for run in runs:
        names.update(dict.fromkeys(metric_names(run.rows)))
    groups: dict = {}
    for name in names:
        groups.setdefault(name.split("/")[0] if "/" in name else "other", []).append(name)
    order = [g for g in GROUP_ORDER if g in groups] + sorted(g for g in groups if g not in GROUP_ORDER)
    charts = []
    for group in order:
        for name in groups[group]:
            lines = []
            for i, run in enumerate(runs):
                steps, values = series(run.rows, name)
                if steps:
                    lines.append([i, steps, [float(f"{v:.6g}") for v in values]])
            if lines:  # a metric never finite (NaN every step) has nothing to draw
                charts.append({"m": name, "g": group, "s": lines})
    return charts


def svg(index: int, chart: dict, weight: float = SMOOTHING) -> str:
    """The chart as an SVG (what the script's ``draw`` draws too): grid, axes' values, and per run
    the raw line (class ``raw``) and the smoothed one (class ``smooth``), ``data-run`` its index."""
    lines = chart["s"]
    x0, x1 = _extent(min(min(s[1]) for s in lines), max(max(s[1]) for s in lines))
    y0, y1 = _extent(min(min(s[2]) for s in lines), max(max(s[2]) for s in lines))
    pad = (y1 - y0) * 0.05
    y0, y1 = y0 - pad, y1 + pad

    def sx(x):
        return LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def sy(y):
        return H - BOTTOM - (y - y0) / (y1 - y0) * (H - TOP - BOTTOM)

    parts = [f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}"/>']
    for t in ticks(y0, y1):
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
            f'<text class="yl" x="{LEFT - 4}" y="{sy(t) + 3:.1f}">{_num(t)}</text>'
        )
    for t in ticks(x0, x1):
        parts.append(f'<text class="xl" x="{sx(t):.1f}" y="{H - 6}">{_num(t)}</text>')
    for i, xs, ys in lines:
        for cls, vals in (("raw", ys), ("smooth", ema(ys, weight))):
            d = "M" + "L".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(xs, vals))
            parts.append(f'<path class="{cls}" data-run="{i}" stroke="{color(i)}" d="{d}"/>')
        if len(xs) <= DOTS:  # sparse points (an evaluation every N steps, a short run) drawn as dots
            parts += [
                f'<circle class="dot" data-run="{i}" fill="{color(i)}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"/>'
                for x, y in zip(xs, ys)
            ]
    label = html.escape(chart["m"])
    return (
        f'<svg class="chart" data-i="{index}" viewBox="0 0 {W} {H}" role="img" aria-label="{label}">'
        + "".join(parts)
        + "</svg>"
    )


def charts_section(runs: list[RunData]) -> str:
    """The controls, every chart in its group, and the data the script redraws them from."""
    charts = chart_data(runs)
    if not charts:
        return '<p class="note">No metric is logged as a number in metrics.jsonl.</p>'
    legend = "".join(
        f'<label class="run"><input type="checkbox" checked data-run="{i}">'
        f'<span class="swatch" style="background:{color(i)}"></span>{html.escape(r.name)}</label>'
        for i, r in enumerate(runs)
    )
    parts = [
        '<div class="controls">'
        f'<label>smoothing <input id="smoothing" type="range" min="0" max="0.99" step="0.01" value="{SMOOTHING}">'
        f' <output id="smoothing-value">{SMOOTHING}</output></label>'
        '<label>filter <input id="filter" type="search" placeholder="metric name or regex"></label>'
        f'<span class="legend">{legend}</span>'
        '<span class="hint">drag across a plot to zoom into those steps, double-click to see them all</span>'
        "</div>"
    ]
    group = None
    for index, chart in enumerate(charts):
        if chart["g"] != group:
            if group is not None:
                parts.append("</div>")
            group = chart["g"]
            parts.append(f'<h3 class="group">{html.escape(group)}</h3><div class="charts">')
        parts.append(
            f'<div class="plot" data-metric="{html.escape(chart["m"])}"><div class="title">'
            f"{html.escape(chart['m'])}</div>{svg(index, chart)}</div>"
        )
    parts.append("</div>")
    data = json.dumps({"charts": charts, "runs": [r.name for r in runs]}, separators=(",", ":"))
    data = data.replace("</", "<\\/")  # inside <script>: no "</script>" can end it early
    parts.append(
        f'<div id="tip" hidden></div><script type="application/json" id="report-data">{data}</script>'
        f"<script>{SCRIPT}</script>"
    )
    return "".join(parts)


STYLE = """
[hidden] { display: none !important; }
.controls { position: sticky; top: 0; background: #fff; border-bottom: 1px solid #ddd; padding: 0.4em 0;
  z-index: 2; display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; align-items: center; font-size: 0.9em; }
.legend label.run { margin-right: 0.8em; white-space: nowrap; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 2px; margin: 0 0.3em;
  vertical-align: -0.1em; }
.hint { color: #777; font-size: 0.9em; }
h3.group { margin: 1em 0 0.2em; text-transform: none; }
.charts { display: flex; flex-wrap: wrap; gap: 6px; }
.plot { width: 350px; border: 1px solid #e3e3e3; border-radius: 4px; padding: 2px 4px; }
.plot .title { font-size: 0.8em; font-weight: 600; overflow-wrap: anywhere; }
svg.chart { width: 100%; height: auto; display: block; user-select: none; cursor: crosshair; }
svg.chart .frame { fill: none; stroke: #bbb; }
svg.chart .grid { stroke: #eee; }
svg.chart text { font-size: 10px; fill: #555; font-family: system-ui, sans-serif; }
svg.chart .yl { text-anchor: end; } svg.chart .xl { text-anchor: middle; }
svg.chart path { fill: none; stroke-linejoin: round; stroke-linecap: round; }
svg.chart path.raw { stroke-width: 1; opacity: 0.25; } svg.chart path.smooth { stroke-width: 1.6; }
svg.chart .cursor { stroke: #999; stroke-dasharray: 3 3; } svg.chart .sel { fill: #4a90d9; opacity: 0.15; }
#tip { position: fixed; pointer-events: none; background: rgba(255,255,255,0.95); border: 1px solid #bbb;
  border-radius: 4px; padding: 0.3em 0.5em; font-size: 0.8em; z-index: 3; white-space: nowrap; }
"""

# The script: redraws the charts (as svg() draws them) for the smoothing, the runs shown and a step
# range; the values under the pointer; the filter. Plain DOM, no library, nothing fetched.
SCRIPT = r"""
(function () {
  const D = JSON.parse(document.getElementById('report-data').textContent);
  const DOTS = %(DOTS)s, W = %(W)s, H = %(H)s, L = %(L)s, R = %(R)s, T = %(T)s, B = %(B)s, PAL = %(PAL)s;
  const slider = document.getElementById('smoothing'), tip = document.getElementById('tip');
  const hidden = {};
  const num = v => String(+v.toPrecision(4));
  const esc = t => String(t).replace(/[&<>"]/g, ch => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'})[ch]);
  function ema(ys, w) {
    const out = []; let last = 0;
    ys.forEach((v, n) => { last = last * w + (1 - w) * v; out.push(last / (1 - Math.pow(w, n + 1))); });
    return out;
  }
  function extent(lo, hi) { if (hi > lo) return [lo, hi]; const p = Math.abs(lo) * 0.1 || 1; return [lo - p, hi + p]; }
  function ticks(lo, hi) {
    const raw = (hi - lo) / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw * 0.999);
    const out = []; for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) out.push(k * step);
    return out;
  }
  function draw(svg) {
    const c = D.charts[+svg.dataset.i], w = +slider.value;
    const lines = c.s.filter(s => !hidden[s[0]]), z = svg.zoom;
    const inX = x => !z || (x >= z[0] && x <= z[1]);
    let xs = [], ys = [];
    lines.forEach(s => s[1].forEach((x, k) => { if (inX(x)) { xs.push(x); ys.push(s[2][k]); } }));
    if (!xs.length) { svg.innerHTML = ''; svg.sc = null; return; }
    let [x0, x1] = z ? z : extent(Math.min(...xs), Math.max(...xs));
    let [y0, y1] = extent(Math.min(...ys), Math.max(...ys)); const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => H - B - (y - y0) / (y1 - y0) * (H - T - B);
    let out = `<rect class="frame" x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}"/>`;
    ticks(y0, y1).forEach(t => {
      const y = sy(t).toFixed(1);
      out += `<line class="grid" x1="${L}" x2="${W - R}" y1="${y}" y2="${y}"/>` +
             `<text class="yl" x="${L - 4}" y="${(sy(t) + 3).toFixed(1)}">${num(t)}</text>`;
    });
    ticks(x0, x1).forEach(t => { out += `<text class="xl" x="${sx(t).toFixed(1)}" y="${H - 6}">${num(t)}</text>`; });
    out += `<clipPath id="clip${svg.dataset.i}"><rect x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}"/>` +
           `</clipPath><g clip-path="url(#clip${svg.dataset.i})">`;
    lines.forEach(([i, xv, yv]) => {
      [['raw', yv], ['smooth', ema(yv, w)]].forEach(([cls, vals]) => {
        const d = 'M' + xv.map((x, k) => sx(x).toFixed(1) + ',' + sy(vals[k]).toFixed(1)).join('L');
        out += `<path class="${cls}" data-run="${i}" stroke="${PAL[i %% PAL.length]}" d="${d}"/>`;
      });
      if (xv.length <= DOTS) xv.forEach((x, k) => {
        out += `<circle class="dot" data-run="${i}" fill="${PAL[i %% PAL.length]}" cx="${sx(x).toFixed(1)}" ` +
               `cy="${sy(yv[k]).toFixed(1)}" r="2.5"/>`;
      });
    });
    out += `</g><line class="cursor" y1="${T}" y2="${H - B}" visibility="hidden"/>` +
           `<rect class="sel" y="${T}" height="${H - T - B}" width="0"/>`;
    svg.innerHTML = out; svg.sc = {x0, x1, sx, w};
  }
  const all = () => document.querySelectorAll('svg.chart').forEach(draw);
  function dataX(svg, e) {
    const r = svg.getBoundingClientRect(), vx = (e.clientX - r.left) * W / r.width;
    return [vx, svg.sc.x0 + (vx - L) / (W - L - R) * (svg.sc.x1 - svg.sc.x0)];
  }
  function nearest(xs, x) {
    let lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }
  document.querySelectorAll('svg.chart').forEach(svg => {
    svg.addEventListener('mousemove', e => {
      if (!svg.sc) return;
      const [vx, x] = dataX(svg, e), c = D.charts[+svg.dataset.i], cur = svg.querySelector('.cursor');
      if (svg.drag !== undefined) {
        const sel = svg.querySelector('.sel');
        sel.setAttribute('x', Math.min(vx, svg.drag)); sel.setAttribute('width', Math.abs(vx - svg.drag));
      }
      let rows = '';
      c.s.filter(s => !hidden[s[0]]).forEach(([i, xv, yv]) => {
        const k = nearest(xv, x), sm = ema(yv.slice(0, k + 1), svg.sc.w)[k];
        rows += `<div><span class="swatch" style="background:${PAL[i %% PAL.length]}"></span>${esc(D.runs[i])}: ` +
                `step ${num(xv[k])}: <b>${num(sm)}</b> (raw ${num(yv[k])})</div>`;
      });
      cur.setAttribute('x1', vx); cur.setAttribute('x2', vx); cur.setAttribute('visibility', 'visible');
      tip.innerHTML = `<b>${esc(c.m)}</b>` + rows; tip.hidden = false;
      tip.style.left = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + 'px';
      tip.style.top = (e.clientY + 14) + 'px';
    });
    svg.addEventListener('mouseleave', () => { tip.hidden = true; svg.drag = undefined; draw(svg); });
    svg.addEventListener('mousedown', e => { if (svg.sc) { svg.drag = dataX(svg, e)[0]; e.preventDefault(); } });
    svg.addEventListener('mouseup', e => {
      if (svg.drag === undefined) return;
      const [vx] = dataX(svg, e), a = svg.drag; svg.drag = undefined;
      if (Math.abs(vx - a) > 4) {
        const x = v => svg.sc.x0 + (v - L) / (W - L - R) * (svg.sc.x1 - svg.sc.x0);
        svg.zoom = [x(Math.min(a, vx)), x(Math.max(a, vx))];
      }
      draw(svg);
    });
    svg.addEventListener('dblclick', () => { svg.zoom = null; draw(svg); });
  });
  slider.addEventListener('input', () => {
    document.getElementById('smoothing-value').textContent = slider.value; all();
  });
  document.querySelectorAll('.legend input').forEach(box => box.addEventListener('change', () => {
    hidden[box.dataset.run] = !box.checked; all();
  }));
  document.getElementById('filter').addEventListener('input', e => {
    let re; try { re = new RegExp(e.target.value, 'i'); } catch (err) { re = null; }
    document.querySelectorAll('.plot').forEach(p => {
      const m = p.dataset.metric; p.hidden = !(re ? re.test(m) : m.includes(e.target.value));
    });
    document.querySelectorAll('.charts').forEach(g => {
      const none = [...g.children].every(p => p.hidden); g.hidden = none; g.previousElementSibling.hidden = none;
    });
  });
  all();
})();
""" % {"DOTS": DOTS, "W": W, "H": H, "L": LEFT, "R": RIGHT, "T": TOP, "B": BOTTOM, "PAL": json.dumps(PALETTE)}  # noqa: UP031 (JS braces)
