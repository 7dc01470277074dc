"""The one interface of the policy losses (``POLICY_LOSSES``): a loss takes one ``LossInputs`` and
its own hyperparameters as keyword arguments, and returns one ``LossOutputs``::

    @POLICY_LOSSES.register(
        "mine", importance_sampling_levels=("token",), zero_at_zero_advantage=True,
        hyperparameters=(Hyperparameter("tau", 1.0, "temperature of the advantage weight", "> 0"),),
    )
    def mine(inputs: LossInputs, *, tau: float) -> LossOutputs:
        ...
        return LossOutputs(loss_mat, metrics)  # the per-token loss (B, T)

The loss returns its per-token loss: ``POLICY_LOSSES`` multiplies it by the rollout correction's
weights and aggregates it (``losses.corrected_loss``), so no loss can leave the correction out; only
a loss registered with ``applies_correction=True`` sees ``inputs.weights`` and returns the scalar.

``Hyperparameter`` declares a knob: its name, default, one-line doc and allowed values. A knob
that is an ``RLConfig`` field (``config_field=True``: the built-in losses' ``clip_low``,
``clip_high``, ``dual_clip``, under their TRL-facing names) is read from that field; any other is
read from the config field ``loss_options`` (a mapping), its default where absent. The config
check (``registry.check_loss_options``) validates both against the selected loss's declarations.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .metrics import Metric


@dataclass(frozen=True)
class LossInputs:
    """What every policy loss receives from the RL loop (one micro-batch).

    ``logprobs`` (B, T) with gradient, ``old_logprobs`` (B, T), ``advantages`` (B, T) or (B,),
    ``response_mask`` (B, T); ``agg`` / ``horizon``: the aggregation (``losses.aggregate``; ``agg``
    None: the loss's declared default); ``weights`` (B, T) or None: the rollout importance-sampling
    weights (``rollout_is_weights``), which ``POLICY_LOSSES`` multiplies into the per-token loss the
    loss returns — the loss itself is called with None, unless it is registered with
    ``applies_correction=True``; ``importance_sampling_level``: whose ratio the loss uses ("token", or
    GSPO's "sequence" / "sequence_token"; ``importance_ratio``).
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    agg: str | None = None
    horizon: int | None = None
    weights: torch.Tensor | None = None
    importance_sampling_level: str = "token"


@dataclass(frozen=True)
class LossOutputs:
    """What every policy loss returns: ``loss`` (a negated objective, for descent), per token (B, T) —
    ``POLICY_LOSSES`` weighs it by the rollout correction and aggregates it, and its entry returns the
    scalar — or the scalar itself from a loss registered with ``applies_correction=True``; and
    ``metrics``, each a ``Metric`` of a declared kind (``metrics.py``: a token mean, a maximum, a
    standard deviation, as sufficient statistics; no ``.item()``), so the update logs the value of the
    whole batch whatever its micro-batches and processes. A plain detached 0-d tensor is read as a
    token mean over the micro-batch's response tokens (``metrics.as_metric``)."""

    loss: torch.Tensor
    metrics: Mapping[str, Metric | torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class Hyperparameter:
    """A knob a registered policy loss reads, passed to it as the keyword argument ``name``.

    ``default``: its value when unset (a ``loss_options`` knob) or when the loss is called alone;
    ``doc``: one line; ``range``: the allowed values in ``config.RANGES``' notation ("(0, 1)",
    "> -1", "[0, 1e6] or None", "finite"; None: any value of ``type``); ``type``: ``float`` (an
    int is accepted), ``int``, ``bool`` or ``str``; None is accepted where ``range`` ends in
    "or None" or the default is None. ``config_field``: the knob is the ``RLConfig`` field of that
    name (read from it, refused in ``loss_options``), else a ``loss_options`` key."""

    name: str
    default: Any
    doc: str
    range: str | None = None
    type: type = float
    config_field: bool = False

    def __post_init__(self):
        if self.type not in (float, int, bool, str):
            raise ValueError(f"hyperparameter {self.name!r}: type must be float, int, bool or str, got {self.type!r}")
        try:
            in_range(0.0, (self.range or "finite").removesuffix(" or None"))
        except (ValueError, KeyError, IndexError):
            raise ValueError(
                f"hyperparameter {self.name!r}: range {self.range!r} is not in config.RANGES' notation "
                "('(0, 1)', '[0, 1e6] or None', '> -1', '>= 0', 'finite')"
            ) from None

    def expected(self) -> str:
        """What the knob accepts, in words ("a float > 0", "a float in (0, 1) or None")."""
        spec = self.range or ""
        none = spec.endswith(" or None") or (self.default is None and spec)
        spec = spec.removesuffix(" or None")
        where = "" if not spec or spec == "finite" else (f" in {spec}" if spec[0] in "([" else f" {spec}")
        return f"a{'n' if self.type is int else ''} {self.type.__name__}{where}{' or None' if none else ''}"

    def accepts(self, value) -> bool:
        """Whether ``value`` has the knob's type and lies in its range (NaN and infinities never)."""
        if value is None:
            return self.default is None or (self.range or "").endswith(" or None")
        if self.type is bool or isinstance(value, bool):
            return self.type is bool and isinstance(value, bool)
        if self.type in (int, float):
            kind = numbers.Integral if self.type is int else numbers.Real
            return isinstance(value, kind) and in_range(value, (self.range or "finite").removesuffix(" or None"))
        return isinstance(value, self.type)


def in_range(value, spec: str) -> bool:
    """Whether the number ``value`` satisfies ``spec``: "(a, b)" open, "[a, b]" closed (mixed
    brackets too), "> a", ">= a", "< a", "<= a", "finite" (NaN and ±inf never satisfy any)."""
    if not math.isfinite(value):
        return False
    if spec == "finite":
        return True
    if spec[0] in "([":
        low, high = (float(x) for x in spec[1:-1].split(","))
        return (value > low if spec[0] == "(" else value >= low) and (
            value < high if spec[-1] == ")" else value <= high
        )
    op, bound = spec.split()
    return {
        ">": value > float(bound),
        ">=": value >= float(bound),
        "<": value < float(bound),
        "<=": value <= float(bound),
    }[op]


def resolve_hyperparameters(
    loss: str,
    declared: tuple[Hyperparameter, ...],
    field_value: Callable[[str], Any],
    options: Mapping,
    owner: str = "RLConfig",
    elsewhere: Mapping[str, str] | None = None,
) -> dict:
    """The keyword arguments of the policy loss ``loss`` (``declared``: its registration's knobs):
    a config-field knob from ``field_value(name)``, any other from ``options`` (``loss_options``) or
    its default. Every failure is one ``ValueError`` line naming ``owner``, the field (and key) and
    the loss: a non-mapping ``options``, a key the loss does not declare (its knobs are listed), a
    key that is a config field, a value of the wrong type or out of range (``elsewhere``: config
    field -> what other losses accept there, appended to its error)."""
    if not isinstance(options, Mapping):
        raise ValueError(
            f"{owner}: config field 'loss_options' must be a mapping of knob names to values, got {options!r}"
        )
    knobs = {h.name: h for h in declared}
    for key in options:
        if key not in knobs:
            listed = ", ".join(f"{h.name} ({'config field' if h.config_field else 'loss_options'})" for h in declared)
            raise ValueError(
                f"{owner}: config field 'loss_options' has the key {key!r}, which the {loss!r} policy loss does not "
                f"take; its knobs: {listed or 'none'}"
            )
        if knobs[key].config_field:
            raise ValueError(
                f"{owner}: config field 'loss_options' has the key {key!r}, which is a config field of its own: "
                f"set {key}={options[key]!r} there"
            )
    values = {}
    for h in declared:
        value = field_value(h.name) if h.config_field else options.get(h.name, h.default)
        if not h.accepts(value):
            where = f"config field {h.name!r}" if h.config_field else f"config field 'loss_options' key {h.name!r}"
            other = (elsewhere or {}).get(h.name) if h.config_field else None
            raise ValueError(
                f"{owner}: {where} must be {h.expected()} with the {loss!r} policy loss ({h.doc}), got {value!r}"
                + (f"; {other}" if other else "")
            )
        values[h.name] = value
    return values
