"""The checks every config runs at construction: ``check_ranges`` (each numeric field against the allowed values
declared beside it: ``base.ranged``), ``check_fields`` (choices and rules, the concerns' ``(ok, field,
expected)`` entries), ``check_run_fields`` (the fields every trainer shares), and ``ranges_of``, the table of every
range by field name (``rlhfkit.config.RANGES``). ``rlhfkit.config`` re-exports them."""

from __future__ import annotations

import dataclasses
import math
import numbers

from .base import CHECKPOINTING_MODES

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")


def ranges_of(*configs) -> dict[str, str]:
    """Field name -> its allowed values, read from the declarations (``base.ranged`` / ``base.preset``) of every
    field of ``configs``: the table of every range (``rlhfkit.config.RANGES``). A name means one thing across
    configs: two declarations of it may differ only in admitting None (a field optional in one config); the
    table keeps the spec that admits it. Counts have an upper bound far above any real run (1e9 steps, 1e7
    tokens, 1e6 rows), so a slip of the keyboard (max_steps=99999999999999999999) is refused instead of running
    forever; seeds fit numpy's 32-bit seeding with room for the per-rank offset."""
    table: dict[str, str] = {}
    for config in configs:
        for f in dataclasses.fields(config):
            spec = f.metadata.get("range")
            if spec is None:
                continue
            known = table.setdefault(f.name, spec)
            if known.removesuffix(" or None") != spec.removesuffix(" or None"):
                raise TypeError(f"{config.__name__}.{f.name}: range {spec!r}, elsewhere {known!r} (one meaning a name)")
            if spec.endswith(" or None"):
                table[f.name] = spec
    return table


def in_range(value, spec: str, integer: bool = False) -> bool:
    """Whether ``value`` satisfies a ``RANGES`` spec (a bool is not a number; ``integer``: a whole
    number is required)."""
    if spec.endswith(" or 'auto'"):
        return value == "auto" or in_range(value, spec.removesuffix(" or 'auto'"), integer)
    text, none_ok = (spec[: -len(" or None")], True) if spec.endswith(" or None") else (spec, False)
    if value is None:
        return none_ok
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if integer and not isinstance(value, numbers.Integral):
        return False
    if not isinstance(value, numbers.Integral) and not math.isfinite(value):  # NaN and ±inf: never
        return False
    if text == "finite":
        return True
    try:
        x = float(value)
    except OverflowError:  # an integer past float's range: past every bound
        return False
    if text[0] in "([":
        low, high = (float(b) for b in text[1:-1].split(","))
        above = x > low if text[0] == "(" else x >= low
        below = x < high if text[-1] == ")" else x <= high
        return above and below
    op, bound = text.split()
    return x >= float(bound) if op == ">=" else x > float(bound)


def check_ranges(config) -> None:
    """Check every field of ``config`` declared with a range (``base.ranged``, ``base.preset``) against it and
    its annotation (None only where the annotation admits it, whole numbers for ``int`` fields); the first
    failure is raised as one line naming the config, the field, the value and the range."""
    for f in dataclasses.fields(config):
        spec = f.metadata.get("range")
        if spec is None or not f.init:
            continue
        annotation = str(f.type).replace(" ", "")
        if "None" not in annotation:
            spec = spec.removesuffix(" or None")
        integer = "int" in annotation.split("|") and "float" not in annotation
        value = getattr(config, f.name)
        if not in_range(value, spec, integer):
            expected = f"in {spec}" if spec[0] in "([" else spec
            kind = "an integer " if integer and not isinstance(value, numbers.Integral) else ""
            raise ValueError(
                f"{type(config).__name__}: config field {f.name!r} must be {kind}{expected}, got {value!r}"
            )


def check_run_fields(config) -> None:
    """``report_to`` as a tuple (a single name or 'none' is accepted, as in TRL) of known trackers;
    ``gradient_checkpointing`` one of ``CHECKPOINTING_MODES`` (True / False as 'on' / 'off')."""
    mode = config.gradient_checkpointing
    if isinstance(mode, bool):
        object.__setattr__(config, "gradient_checkpointing", "on" if mode else "off")
    elif mode not in CHECKPOINTING_MODES:
        raise ValueError(
            f"{type(config).__name__}: config field 'gradient_checkpointing' must be one of "
            f"{', '.join(CHECKPOINTING_MODES)} (or True / False), got {mode!r}"
        )
    value = config.report_to
    names = (value,) if isinstance(value, str) else tuple(value or ())
    names = tuple(n for n in names if n != "none")
    object.__setattr__(config, "report_to", names)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"{type(config).__name__}: config field 'report_to' must list trackers among "
            f"{', '.join(TRACKERS)} (each once), got {list(value) if not isinstance(value, str) else value!r}"
        )


def check_fields(config, checks) -> None:
    """Raise for the first ``(ok, field, expected)`` that fails, naming the config and the field."""
    for ok, name, expected in checks:
        if not ok:
            raise ValueError(
                f"{type(config).__name__}: config field {name!r} must be {expected}, got {getattr(config, name)!r}"
            )
