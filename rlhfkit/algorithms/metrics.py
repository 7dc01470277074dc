"""Metrics by declared kind: what a loss reports is not a number but the *sufficient statistics* of
one, so the number of a whole batch can be read from those of its parts — whatever the split into
micro-batches and processes.

A ``Metric`` holds its ``kind`` and ``stats`` (a 1-d tensor, detached). The kinds (``KINDS``) say how
the statistics of two parts merge and how the value is read from them:

- ``mean``: ``(Σx, n)``, summed; the value ``Σx / n`` (``empty`` when ``n = 0``). A token mean is
  ``token_mean(x, mask)``; a mean over rows, ``Metric.mean(row_sum, rows)``.
- ``std``: ``(Σx, Σx², n)``, summed; the population standard deviation
  ``sqrt(Σx²/n − (Σx/n)²)`` (0 when ``n = 0``).
- ``max``: ``(max,)``, merged by ``max``; the value itself (``empty`` when nothing was seen).
- ``explained_variance``: ``(n, ΣR, ΣR², Σe, Σe²)`` of the returns ``R`` and the errors
  ``e = R − V``, summed; ``1 − Var(e) / Var(R)`` (population variances; 0 where ``Var(R) <= 1e-8``).
- ``step``: a value of the whole optimizer step (the TRL-compatible ``policy/loss``, ``critic/loss``,
  ``policy/total_loss``, ``perf/grad_norm``): each part's ``(x,)`` is multiplied by its share of the
  step (``StepMetrics.add``) and summed.

The update (``rl/update.py``) merges each optimizer step's micro-batches (``StepMetrics``), reduces
the steps over processes in one collective per reduction (``reduce_steps``), and logs each metric's
value averaged over the optimizer steps (the maximum for ``max``). Everything here is tensor math
on detached values: no ``.item()``; the caller decides when to synchronise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ._checks import masked_sum

Reduction = Callable[[torch.Tensor], torch.Tensor]


def _mean(stats: torch.Tensor, empty: float) -> torch.Tensor:
    total, n = stats[0], stats[1]
    return torch.where(n > 0, total / n.clamp(min=1), torch.full_like(total, empty))


def _variance(total: torch.Tensor, squares: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """The population variance ``Σx²/n − (Σx/n)²`` of ``n`` values from their sums (``n`` clamped to 1)."""
    n = n.clamp(min=1)
    return (squares / n - (total / n) ** 2).clamp(min=0)


def _std(stats: torch.Tensor, empty: float) -> torch.Tensor:
    return _variance(stats[0], stats[1], stats[2]).sqrt()


def _max(stats: torch.Tensor, empty: float) -> torch.Tensor:
    return torch.where(stats[0] > -torch.inf, stats[0], torch.full_like(stats[0], empty))


def _explained_variance(stats: torch.Tensor, empty: float) -> torch.Tensor:
    var_returns, var_errors = _variance(stats[1], stats[2], stats[0]), _variance(stats[3], stats[4], stats[0])
    # Constant returns leave nothing to explain: 0 rather than a huge negative number.
    return torch.where(
        var_returns > 1e-8, 1.0 - var_errors / var_returns.clamp(min=1e-8), torch.zeros_like(var_returns)
    )


def _step(stats: torch.Tensor, empty: float) -> torch.Tensor:
    return stats[0]


# kind -> (how two parts' statistics merge: "sum" or "max", the value of the statistics)
KINDS: dict[str, tuple[str, Callable[[torch.Tensor, float], torch.Tensor]]] = {
    "mean": ("sum", _mean),
    "std": ("sum", _std),
    "max": ("max", _max),
    "explained_variance": ("sum", _explained_variance),
    "step": ("sum", _step),
}


@dataclass(frozen=True)
class Metric:
    """One metric of one part of a batch, as sufficient statistics (see the module's docstring):
    ``kind`` one of ``KINDS``, ``stats`` a detached 1-d tensor, ``empty`` the value of a mean or a
    maximum over nothing. Build one with the constructors below; read it with ``value``."""

    kind: str
    stats: torch.Tensor
    empty: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"metric kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def mean(cls, total: torch.Tensor, count: torch.Tensor, empty: float = 0.0) -> Metric:
        """The mean of values whose sum is ``total`` and number ``count`` (``empty`` when 0)."""
        return cls("mean", _stack(total, count), empty)

    @classmethod
    def std(cls, total: torch.Tensor, squares: torch.Tensor, count: torch.Tensor) -> Metric:
        """The population standard deviation of ``count`` values of sum ``total`` and sum of squares ``squares``."""
        return cls("std", _stack(total, squares, count))

    @classmethod
    def maximum(cls, value: torch.Tensor, empty: float = 0.0) -> Metric:
        """The largest of the values seen (``value``: the largest of this part's)."""
        return cls("max", _stack(value), empty)

    @classmethod
    def step(cls, value: torch.Tensor | float) -> Metric:
        """A value of the optimizer step: this part's contribution, before its share (``StepMetrics.add``)."""
        return cls("step", _stack(torch.as_tensor(value)))

    @property
    def value(self) -> torch.Tensor:
        """The metric's value over what its statistics saw (a 0-d tensor)."""
        return KINDS[self.kind][1](self.stats, self.empty)

    @property
    def reduction(self) -> str:
        """How two parts' statistics merge: "sum" or "max"."""
        return KINDS[self.kind][0]

    def merge(self, other: Metric) -> Metric:
        """The metric of both parts together (the same kind)."""
        if other.kind != self.kind:
            raise ValueError(f"cannot merge a {self.kind!r} metric with a {other.kind!r} one")
        other_stats = other.stats.to(self.stats.device)
        stats = self.stats + other_stats if self.reduction == "sum" else torch.maximum(self.stats, other_stats)
        return Metric(self.kind, stats, self.empty)

    def nothing(self) -> Metric:
        """The statistics of an empty part: merged with any part, they change nothing."""
        fill = 0.0 if self.reduction == "sum" else -torch.inf
        return Metric(self.kind, torch.full_like(self.stats, fill), self.empty)

    def scaled(self, share: torch.Tensor | float) -> Metric:
        """A ``step`` metric times ``share`` (its part's share of the step); any other kind as it is."""
        return Metric(self.kind, self.stats * share, self.empty) if self.kind == "step" else self


def _stack(*values) -> torch.Tensor:
    """The values as one 1-d tensor on the first one's device, in the widest of their dtypes (float32 at least)."""
    tensors = [torch.as_tensor(v).detach() for v in values]
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return torch.stack([t.to(device=tensors[0].device, dtype=dtype).reshape(()) for t in tensors])


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 for the sums of squares of a spread (float32's ``Σx²/n − (Σx/n)²`` loses
    the spread of values near 1, as importance weights are), float32 where the device has no float64 (MPS)."""
    return x.to(torch.float32 if x.device.type == "mps" else torch.float64)


def token_mean(x: torch.Tensor, mask: torch.Tensor, empty: float = 0.0) -> Metric:
    """The mean of ``x`` over the tokens of ``mask`` (bool, the shape of ``x``)."""
    return Metric.mean(masked_sum(x.detach(), mask), mask.sum(), empty)


def token_std(x: torch.Tensor, mask: torch.Tensor) -> Metric:
    """The population standard deviation of ``x`` over the tokens of ``mask`` (sums in float64:
    ``_wide``)."""
    x = _wide(x.detach())
    return Metric.std(masked_sum(x, mask), masked_sum(x * x, mask), mask.sum())


def token_max(x: torch.Tensor, mask: torch.Tensor, empty: float = 0.0) -> Metric:
    """The largest ``x`` over the tokens of ``mask`` (``empty`` when there are none)."""
    x = x.detach()
    low = torch.full((), -torch.inf, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
    return Metric.maximum(torch.where(mask, x, low).max() if x.numel() else low, empty)


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> Metric:
    """``1 − Var(R − V) / Var(R)`` over the tokens of ``mask``: how much of the returns' spread the
    values explain (1 perfectly, 0 not at all, or for constant returns)."""
    returns, errors = _wide(returns.detach()), _wide((returns - values).detach())
    sums = [masked_sum(t, mask) for t in (returns, returns * returns, errors, errors * errors)]
    return Metric("explained_variance", _stack(mask.sum(), *sums))


def as_metric(value, mask: torch.Tensor) -> Metric:
    """A loss's metric: a ``Metric`` as it is; a plain 0-d tensor (a loss that declares no kind) is
    read as a token mean over the tokens of ``mask`` (its micro-batch weighs by its tokens)."""
    if isinstance(value, Metric):
        return value
    n = mask.sum()
    return Metric.mean(torch.as_tensor(value).detach() * n, n)


def metric_values(metrics: Mapping[str, Metric]) -> dict[str, torch.Tensor]:
    """Each metric's value."""
    return {k: m.value for k, m in metrics.items()}


class StepMetrics:
    """The metrics of one optimizer step on one process: each name's statistics merged over the
    step's micro-batches (``add``), ``metrics[name]``."""

    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}

    def add(self, metrics: Mapping[str, Metric], share: torch.Tensor | float = 1.0, *, counted: bool = True) -> None:
        """Merge one micro-batch's ``metrics``: a ``step`` metric times ``share``, its share of the
        step; ``counted`` False (a zero-weight filler pass) adds the names with empty statistics, so
        every process holds the same names."""
        for name, metric in metrics.items():
            metric = metric.scaled(share) if counted else metric.nothing()
            self.metrics[name] = self.metrics[name].merge(metric) if name in self.metrics else metric


def reduced(
    parts: Sequence[Mapping[str, Metric]], reduce_sum: Reduction | None, reduce_max: Reduction | None
) -> list[dict[str, Metric]]:
    """``parts`` (each a name -> ``Metric`` mapping, the same names on every process) with each
    metric's statistics reduced over the processes: one ``reduce_sum`` and one ``reduce_max``
    (``distributed.reduce_sum``, ``reduce_tensor_max``; None: this process alone) for all of them."""
    out: list[dict[str, Metric]] = [dict(p) for p in parts]
    for how, reduce in (("sum", reduce_sum), ("max", reduce_max)):
        keys = [(i, k) for i, p in enumerate(out) for k in sorted(p) if p[k].reduction == how]
        if reduce is None or not keys:
            continue
        stats = [out[i][k].stats for i, k in keys]
        dtype, device = stats[0].dtype, stats[0].device
        for s in stats[1:]:
            dtype = torch.promote_types(dtype, s.dtype)
        flat = reduce(torch.cat([s.to(device=device, dtype=dtype) for s in stats]))
        for (i, k), s, chunk in zip(keys, stats, flat.split([len(s) for s in stats])):
            out[i][k] = Metric(out[i][k].kind, chunk.to(s.dtype), out[i][k].empty)
    return out


def global_values(
    metrics: Mapping[str, Metric], reduce_sum: Reduction | None, reduce_max: Reduction | None
) -> dict[str, torch.Tensor]:
    """Each metric's value over every process (``reduced``)."""
    return metric_values(reduced([metrics], reduce_sum, reduce_max)[0])


def reduce_steps(
    steps: Sequence[Mapping[str, Metric]],
    ran: Sequence[bool],
    reduce_sum: Reduction | None = None,
    reduce_max: Reduction | None = None,
) -> dict[str, torch.Tensor]:
    """The logged metrics of an update's optimizer steps (``steps``: each step's ``StepMetrics.metrics``,
    reduced over the processes here): a ``step`` metric averaged over every step; any other the mean
    of its per-step values over the steps that ran rows (``ran``; the maximum for ``max``), left out
    when none did."""
    per_step = [metric_values(m) for m in reduced(steps, reduce_sum, reduce_max)]
    out: dict[str, torch.Tensor] = {}
    for name in sorted({k for m in steps for k in m}):
        kind = next(m[name].kind for m in steps if name in m)
        if kind == "step":
            out[name] = sum((v[name] for v in per_step if name in v), torch.zeros(())) / len(steps)
            continue
        seen = [v[name] for v, r in zip(per_step, ran) if r and name in v]
        if seen:
            out[name] = torch.stack(seen).max() if kind == "max" else sum(seen[1:], seen[0]) / len(seen)
    return out
