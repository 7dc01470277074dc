"""``make_scheduler``'s transformers-style schedules (``hf_*``, what the TRL drop-ins select):
the learning rate of each optimizer step, computed by hand from transformers' formulas (warmup
factor ``s / w`` for ``s < w``, so the first update runs at 0)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.run.training import make_scheduler

PEAK = 1.0


def _rates(kind: str, warmup: int, total: int) -> list[float]:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    scheduler = make_scheduler(optimizer, kind, warmup, total)
    rates = []
    for _ in range(total):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize(
    "kind,warmup,total,expected",
    [
        # warmup 0/2, 1/2; then (T - s) / (T - w) = 4/4, 3/4, 2/4, 1/4
        ("hf_linear", 2, 6, [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]),
        # warmup 0/2, 1/2; then 0.5 (1 + cos(pi (s - w) / (T - w))) at p = 0, 1/4, 2/4, 3/4
        ("hf_cosine", 2, 6, [0.0, 0.5, 1.0, 0.5 + 0.5 * 2**-0.5, 0.5, 0.5 - 0.5 * 2**-0.5]),
        ("hf_constant", 2, 4, [0.0, 0.5, 1.0, 1.0]),
        ("hf_constant", 0, 3, [1.0, 1.0, 1.0]),
        ("hf_linear", 1, 2, [0.0, 1.0]),  # TRL's SFT with warmup_steps=1 and 2 steps
        ("hf_linear", 0, 4, [1.0, 0.75, 0.5, 0.25]),
        ("hf_linear", 3, 3, [0.0, 1 / 3, 2 / 3]),  # warmup fills the run: max(1, T - w) never divides by 0
    ],
)
def test_transformers_style_learning_rates(kind, warmup, total, expected):
    assert _rates(kind, warmup, total) == pytest.approx(expected, abs=1e-12)


def test_rlhfkit_style_is_unchanged():
    """The native schedules keep their ``(s+1)/(w+1)`` warmup (weight hashes depend on it)."""
    assert _rates("linear", 1, 3) == pytest.approx([0.5, 1.0, 0.5])
    assert _rates("constant", 3, 4) == pytest.approx([0.25, 0.5, 0.75, 1.0])
