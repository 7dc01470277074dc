"""The tables of ``benchmarks/scale.py``: medians per run, the ratios rlhfkit / TRL, and the
activation memory per layer per 1k tokens from two depths (``scale.py``'s docstring defines them).

    python benchmarks/scale_summary.py scale.jsonl [more.jsonl ...]   # the tables of JSON lines already written

Rows are grouped by depth (``layers``), part, L, dtype and checkpointing (with the memory budget when
one was set); a side's label is ``trl``, ``rlhfkit`` or ``rlhfkit[key=value ...]`` for a run with
``--rlhfkit-set``, each compared with TRL's row of the same group.

**Per layer** (``per_layer``): for each side and part, L, dtype and checkpointing measured at two or more
depths, between the shallowest (a) and the deepest (b):
``mb_per_layer_per_1k_tokens`` = (A(b) - A(a)) x 1000 / (b - a) / (tokens / 1000), each A the median over
rounds of the activation memory: on the CPU ``activations_gb``, the peak of what autograd kept for backward
(``scale_child.SavedActivations``, the same count on both sides; the peak RSS is too coarse for one layer's
share), on CUDA (peak - floor). The floor holds the parameters' share (weights, gradients, AdamW's
moments, 16 bytes per float32 parameter), which grows with depth, so the difference is what one more layer
adds beyond its parameters: its activations (and its share of the KV cache, allocator slack). ``measure``
names which was used. Likewise
``step_s_per_layer`` = (step_s(b) - step_s(a)) / (b - a). A side whose model checkpointed at one depth and
not at the other (``auto``) is marked ``mixed``: its slope mixes two settings.
"""

from __future__ import annotations

import json
import statistics
import sys

METRICS = ("peak_gb", "step_s", "above_floor_gb", "mb_per_1k_tokens", "floor_gb")


def label(r: dict) -> str:
    return r["side"] + (f"[{r['variant']}]" if r.get("variant") else "")


def setting(r: dict) -> str:
    budget = r.get("memory_budget_gb")
    return r["checkpointing"] + (f", {budget:g} GB" if budget else "")


def used(r: dict) -> str:
    """What the model did: on / off, or the share of its passes checkpointed (rlhfkit's ``auto``)."""
    frac = r.get("checkpointed_frac")
    if frac is not None and 0 < frac < 1:
        return f"{frac:.0%} on"
    return "on" if r["gradient_checkpointing"] else "off"


def config_key(r: dict) -> tuple:
    """What a run measured, depth aside: part, L, dtype, checkpointing (and budget)."""
    return (r["part"], r["length"], r["dtype"], setting(r))


def medians(ok: list[dict]) -> dict:
    """{(config_key, layers, label): {metric: median, 'ckpt': 'on'|'off'|'on/off', 'tokens': n}}, in run order."""
    groups: dict = {}
    for r in ok:
        groups.setdefault((config_key(r), r.get("layers"), label(r)), []).append(r)
    out = {}
    for k, runs in groups.items():
        out[k] = {m: statistics.median(r[m] for r in runs) for m in METRICS}
        if all("activations_gb" in r for r in runs):  # the CPU's count of what autograd kept (scale_child)
            out[k]["activations_gb"] = statistics.median(r["activations_gb"] for r in runs)
        out[k]["ckpt"] = "/".join(sorted({used(r) for r in runs}))
        out[k]["tokens"] = runs[0]["tokens"]
    return out


def per_layer(results: list[dict]) -> list[dict]:
    """Per side and configuration measured at two or more depths: the slopes between the shallowest and the
    deepest (module docstring), with the ratio to TRL's of the same configuration."""
    med = medians([r for r in results if "error" not in r and r.get("layers")])
    depths: dict = {}
    for ck, layers, side in med:
        depths.setdefault((ck, side), set()).add(layers)
    out = []
    for (ck, side), ds in depths.items():
        if len(ds) < 2:
            continue
        a, b = min(ds), max(ds)
        lo, hi = med[(ck, a, side)], med[(ck, b, side)]
        measure = "activations_gb" if "activations_gb" in lo and "activations_gb" in hi else "above_floor_gb"
        tokens, rise_gb = hi["tokens"], hi[measure] - lo[measure]  # the parameters: in the floors
        out.append(
            {
                "part": ck[0],
                "length": ck[1],
                "dtype": ck[2],
                "checkpointing": ck[3],
                "side": side,
                "depths": [a, b],
                "tokens": tokens,
                "ckpt": lo["ckpt"] if lo["ckpt"] == hi["ckpt"] else "mixed",
                "measure": "kept for backward" if measure == "activations_gb" else "peak - floor",
                "mb_per_layer_per_1k_tokens": rise_gb * 1000 / (b - a) / (tokens / 1000),
                "step_s_per_layer": (hi["step_s"] - lo["step_s"]) / (b - a),
                "step_s_deepest": hi["step_s"],
            }
        )
    trl = {(x["part"], x["length"], x["dtype"], x["checkpointing"]): x for x in out if x["side"] == "trl"}
    for x in out:
        t = trl.get((x["part"], x["length"], x["dtype"], x["checkpointing"]))
        if t and x["side"] != "trl":
            x["vs_trl"] = {
                "mb_per_layer_per_1k_tokens": ratio(x["mb_per_layer_per_1k_tokens"], t["mb_per_layer_per_1k_tokens"]),
                "step_s_deepest": ratio(x["step_s_deepest"], t["step_s_deepest"]),
            }
    return out


def ratio(x: float, y: float) -> float:
    return x / y if y else float("nan")


def run_tables(med: dict) -> list[str]:
    lines = [
        "| layers | part | L | dtype | checkpointing | side | peak GB | step s | above floor GB | MB / 1k tokens "
        "| floor GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = [
        "| layers | part | L | dtype | checkpointing | side | peak / TRL | step time / TRL | above floor / TRL |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (ck, layers, side), m in med.items():
        lines.append(
            f"| {layers} | {ck[0]} | {ck[1]} | {ck[2]} | {ck[3]} ({m['ckpt']}) | {side} | {m['peak_gb']:.2f} | "
            f"{m['step_s']:.2f} | {m['above_floor_gb']:.2f} | {m['mb_per_1k_tokens']:.0f} | {m['floor_gb']:.2f} |"
        )
        t = med.get((ck, layers, "trl"))
        if t and side != "trl":
            r = {k: ratio(m[k], t[k]) for k in ("peak_gb", "step_s", "above_floor_gb")}
            ratios.append(
                f"| {layers} | {ck[0]} | {ck[1]} | {ck[2]} | {ck[3]} | {side} | {r['peak_gb']:.2f}x | "
                f"{r['step_s']:.2f}x | {r['above_floor_gb']:.2f}x |"
            )
    return [*lines, "", *(ratios if len(ratios) > 2 else [])]


def layer_table(rows: list[dict]) -> list[str]:
    """One line per configuration and rlhfkit label (TRL's alone where no rlhfkit side ran): both sides' MB per
    layer per 1k tokens and step seconds per layer, the ratios rlhfkit / TRL."""
    if not rows:
        return []
    lines = [
        "Activation memory per layer per 1k tokens: the slope between the depths of what autograd kept for backward "
        "(CPU) or of peak - floor (CUDA), the floor holding the parameters' share (ratios: rlhfkit / TRL; the "
        "step-time ratio at the deepest depth):",
        "",
        "| part | L | dtype | checkpointing | depths | side | MB/layer/1k: TRL | side | ratio "
        "| step s/layer: TRL | side | step time ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    trl = {(x["part"], x["length"], x["dtype"], x["checkpointing"]): x for x in rows if x["side"] == "trl"}
    others = [x for x in rows if x["side"] != "trl"]
    alone = [
        t
        for k, t in trl.items()
        if not any(k == (x["part"], x["length"], x["dtype"], x["checkpointing"]) for x in others)
    ]
    for x in [*others, *alone]:
        t = trl.get((x["part"], x["length"], x["dtype"], x["checkpointing"]))
        mine = x if x["side"] != "trl" else None
        vs = x.get("vs_trl", {})
        cells = [
            f"{t['mb_per_layer_per_1k_tokens']:.1f} ({t['ckpt']})" if t else "—",
            f"{mine['mb_per_layer_per_1k_tokens']:.1f} ({mine['ckpt']})" if mine else "—",
            f"{vs['mb_per_layer_per_1k_tokens']:.2f}x" if vs else "—",
            f"{t['step_s_per_layer']:.3f}" if t else "—",
            f"{mine['step_s_per_layer']:.3f}" if mine else "—",
            f"{vs['step_s_deepest']:.2f}x" if vs else "—",
        ]
        lines.append(
            f"| {x['part']} | {x['length']} | {x['dtype']} | {x['checkpointing']} | {x['depths'][0]}→{x['depths'][1]} "
            f"| {mine['side'] if mine else '—'} | " + " | ".join(cells) + " |"
        )
    return ["", *lines]


def failures(results: list[dict]) -> list[str]:
    out = []
    for r in results:
        if "error" in r:
            last = r["error"].strip().splitlines()[-1] if r["error"].strip() else "?"
            out.append(
                f"- FAILED {label(r)} {r['part']} layers={r.get('layers')} L={r['length']} {r['dtype']} "
                f"{setting(r)}: {last}"
            )
    return out


def summary(results: list[dict]) -> str:
    med = medians([r for r in results if "error" not in r])
    return "\n".join(["", *run_tables(med), *layer_table(per_layer(results)), *failures(results)])


def load(paths: list[str]) -> list[dict]:
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [json.loads(x) for x in f if x.startswith('{"part"')]
    return rows


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print(summary(load(sys.argv[1:])))
