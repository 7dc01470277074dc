"""Metrics by declared kind (``rlhfkit/algorithms/metrics.py``): the statistics of the parts of a
batch, merged (micro-batches) or reduced (processes), give the value of the whole batch for every
kind; the update's combination over optimizer steps (``reduce_steps``) by hand."""

import math

import pytest
import torch

from rlhfkit.algorithms import (
    Metric,
    StepMetrics,
    as_metric,
    explained_variance,
    metric_values,
    reduce_steps,
    token_max,
    token_mean,
    token_std,
)
from rlhfkit.algorithms.metrics import reduced

F64 = torch.float64
G = torch.Generator().manual_seed(3)
X = torch.randn(6, 5, generator=G, dtype=F64)
Y = torch.randn(6, 5, generator=G, dtype=F64)
MASK = torch.rand(6, 5, generator=G) > 0.3
PARTS = (slice(0, 1), slice(1, 4), slice(4, 6))  # micro-batches of unequal tokens


def every_kind(rows: slice) -> dict[str, Metric]:
    x, y, m = X[rows], Y[rows], MASK[rows]
    return {
        "mean": token_mean(x, m),
        "std": token_std(1 + 1e-3 * x, m),  # values near 1, as importance weights are: float64 sums keep the spread
        "max": token_max(x, m),
        "explained_variance": explained_variance(x, y, m),
    }


def by_hand(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor) -> dict[str, float]:
    v = x[m]
    near_one = 1 + 1e-3 * v
    return {
        "mean": v.mean().item(),
        "std": near_one.std(unbiased=False).item(),
        "max": v.max().item(),
        "explained_variance": 1 - (v - y[m]).var(unbiased=False).item() / v.var(unbiased=False).item(),
    }


def test_each_kind_by_hand():
    assert metric_values(every_kind(slice(None))) == pytest.approx(by_hand(X, Y, MASK), rel=1e-9)


def test_merged_parts_give_the_whole_and_the_mean_of_the_parts_does_not():
    parts = [every_kind(rows) for rows in PARTS]
    merged = {k: parts[0][k].merge(parts[1][k]).merge(parts[2][k]) for k in parts[0]}
    assert metric_values(merged) == pytest.approx(by_hand(X, Y, MASK), rel=1e-9)
    naive = {k: sum(p[k].value.item() for p in parts) / len(parts) for k in ("mean", "std", "explained_variance")}
    assert all(naive[k] != pytest.approx(by_hand(X, Y, MASK)[k], rel=1e-3) for k in naive)


def test_reduced_over_processes_is_the_whole_in_one_collective_per_reduction():
    """Two "processes" (parts 0-1 on one, part 2 on the other): one sum and one max of every metric
    of every step, each a flat tensor."""
    mine = every_kind(PARTS[0])
    for k, m in every_kind(PARTS[1]).items():
        mine[k] = mine[k].merge(m)
    other = every_kind(PARTS[2])
    calls = []

    def reduce(how, own):
        def op(flat):
            calls.append((how, flat.dim()))
            theirs = torch.cat([other[k].stats for k in sorted(other) if other[k].reduction == how])
            return flat + theirs if how == "sum" else torch.maximum(flat, theirs)

        return op

    got = metric_values(reduced([mine], reduce("sum", mine), reduce("max", mine))[0])
    assert got == pytest.approx(by_hand(X, Y, MASK), rel=1e-9)
    assert calls == [("sum", 1), ("max", 1)]


def test_empty_parts_give_the_declared_empty_values_and_change_nothing_merged():
    none = torch.zeros(2, 3, dtype=torch.bool)
    x = torch.ones(2, 3)
    assert token_mean(x, none).value.item() == 0.0
    assert Metric.mean(torch.tensor(0.0), torch.tensor(0), empty=1.0).value.item() == 1.0
    assert token_max(x, none).value.item() == 0.0 and token_std(x, none).value.item() == 0.0
    m = token_mean(X, MASK)
    assert torch.equal(m.merge(m.nothing()).stats, m.stats)
    assert token_max(X, MASK).merge(token_max(x, none)).value.item() == X[MASK].max().item()


def test_a_plain_tensor_is_a_token_mean_and_kinds_do_not_mix():
    mask = torch.tensor([[True, True, False]])
    assert as_metric(torch.tensor(0.25), mask).stats.tolist() == [0.5, 2.0]
    with pytest.raises(ValueError, match="cannot merge a 'mean' metric with a 'max' one"):
        token_mean(X, MASK).merge(token_max(X, MASK))
    with pytest.raises(ValueError, match="metric kind must be one of"):
        Metric("median", torch.zeros(1))


def test_steps_combine_as_the_update_logs_them():
    """Two optimizer steps: a ``step`` metric is each micro-batch's value times its share, summed over
    the step, averaged over every step; a mean is each step's own, averaged over the steps that ran;
    a maximum is the largest of the steps that ran."""
    steps = []
    for values, shares in (([1.0, 3.0], [0.25, 0.75]), ([5.0], [1.0])):
        step = StepMetrics()
        for v, share in zip(values, shares):
            step.add(
                {"loss": Metric.step(torch.tensor(v)), "mean": Metric.mean(torch.tensor(v), torch.tensor(1))}, share
            )
            step.add({"max": Metric.maximum(torch.tensor(v))})
        step.add({"loss": Metric.step(torch.tensor(9.0)), "max": Metric.maximum(torch.tensor(9.0))}, 0.5, counted=False)
        steps.append(step.metrics)
    out = reduce_steps(steps, [True, True])
    assert out["loss"].item() == pytest.approx(((0.25 + 2.25) + 5.0) / 2)
    assert out["mean"].item() == pytest.approx((2.0 + 5.0) / 2)
    assert out["max"].item() == 5.0
    skipped = reduce_steps(steps, [False, True])
    assert skipped["loss"].item() == out["loss"].item() and skipped["mean"].item() == 5.0
    assert reduce_steps(steps, [False, False]).keys() == {"loss"}
    assert math.isclose(reduce_steps(steps[:1], [True])["mean"].item(), 2.0)
