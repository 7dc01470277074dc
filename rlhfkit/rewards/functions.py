"""Programmatic reward functions (RL with verifiable rewards) and their weighted combination.

A reward function has TRL's calling shape::

    f(prompts: list, completions: list[str], **columns) -> list[float | None]

called with keywords: ``prompts`` and ``completions`` are aligned lists of ``B`` items and every
other dataset column arrives as a keyword list of ``B`` values (e.g. ``answer=[...]``), so a
function takes the columns it needs and ``**kwargs`` for the rest. ``None`` means "this function
does not apply to this sample" (e.g. a code checker on a math prompt).

``RewardFunctions`` combines several with weights the way TRL's GRPO trainer does: the score of a
sample is the weighted sum over the functions that returned a number for it (a NaN-sum); a sample
no function scored is marked invalid and the trainer masks it out. A function that raises or
returns something malformed stops training with a ``ValueError`` naming the function, the row and
the start of the prompt. So does a score outside ``±MAX_ABS_REWARD`` (1e6), and a weight outside
it: the batch statistics (means, stds, whitening) are float32, where sums and squares of scores
near 3e38 overflow to inf — a reward that large is a bug or a unit to rescale, not a signal.

Functions are named in YAML configs through ``REWARD_FUNCTIONS`` (``@register_reward_function``)
or by a dotted import path, resolved by ``get_reward_function``.
"""

from __future__ import annotations

import importlib
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..algorithms.registry import did_you_mean
from .reasoning_gym import reasoning_gym_reward

RewardFunction = Callable[..., list]
REWARD_FUNCTIONS: dict[str, RewardFunction] = {}
MAX_ABS_REWARD = 1e6  # scores and weights beyond it are refused (float32 statistics stay finite)
_ALLOWED = "[-1e6, 1e6]"  # MAX_ABS_REWARD as the range written in messages (config.RANGES uses the same)


def register_reward_function(name: str) -> Callable[[RewardFunction], RewardFunction]:
    """Decorator adding a function to ``REWARD_FUNCTIONS`` under ``name``; a name used twice is
    refused (a ``ValueError``), so two tasks never silently replace each other's function."""

    def decorator(fn: RewardFunction) -> RewardFunction:
        if not callable(fn):
            raise ValueError(f"reward function {name!r} must be callable, got {type(fn).__name__}")
        if name in REWARD_FUNCTIONS:
            raise ValueError(f"reward function {name!r} is already registered ({REWARD_FUNCTIONS[name]!r})")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return decorator


register_reward_function("reasoning_gym")(reasoning_gym_reward)  # reasoning-gym tasks' own checkers


def get_reward_function(name_or_callable: str | RewardFunction) -> RewardFunction:
    """Resolve a reward function: a callable is returned as is; a string is a registered name, or an
    import path ``"package.module:function"`` — and only that form imports anything (the module is
    code, as a script is: a recipe naming one runs it). Any other string imports nothing."""
    if callable(name_or_callable):
        return name_or_callable
    if not isinstance(name_or_callable, str):
        raise ValueError(f"reward function must be a callable or a name, got {type(name_or_callable).__name__}")
    name = name_or_callable
    if name.startswith(_UNRECORDED):
        raise ValueError(f"reward function {name!r}: the run that recorded it passed a function that cannot be "
                         "imported (defined in a script or a closure); move it into a module and name it as "
                         "'package.module:function'")
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    if ":" in name:
        return _import_function(name)
    registered = ", ".join(sorted(REWARD_FUNCTIONS)) or "(none registered)"
    raise ValueError(
        f"unknown reward function {name!r}; registered: {registered}. "
        f"An import path 'package.module:function' (with the colon) also works.{did_you_mean(name, REWARD_FUNCTIONS)}"
    )


_UNRECORDED = "<not importable: "


def unrecorded_reward(name: str) -> str:
    """What a run records for a reward function that no name or import path can find again."""
    return f"{_UNRECORDED}{name}>"


def _import_function(path: str) -> RewardFunction:
    """Import ``"pkg.mod:attr.attr"`` and check that it is callable."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"reward function {path!r}: expected 'package.module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward function {path!r}: cannot import module {module_name!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"reward function {path!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"reward function {path!r} is not callable (got {type(obj).__name__})")
    return obj


@dataclass
class RewardOutput:
    """Scores of one batch of ``B`` completions.

    - ``scores`` (B,) float32: weighted sum over the functions that scored each sample (0 where none did).
    - ``per_function``: name → (B,) float32 raw (unweighted) scores, NaN where the function returned None.
    - ``valid`` (B,) bool: False where every function returned None; the trainer masks these out.
    """

    scores: torch.Tensor
    per_function: dict[str, torch.Tensor]
    valid: torch.Tensor


class RewardFunctions:
    """A weighted combination of reward functions (TRL's ``reward_funcs`` / ``reward_weights``).

    Args:
        funcs: reward functions, or names / import paths resolved by ``get_reward_function``.
        weights: one weight per function (default 1.0 each).
        names: one name per function, used in metrics and errors (default ``f.__name__``, or the
            class name of a callable without one); repeated names get a ``_2``, ``_3``… suffix.
    """

    def __init__(self, funcs: list, weights: list[float] | None = None, names: list[str] | None = None):
        if not isinstance(funcs, (list, tuple)) or not funcs:
            raise ValueError("RewardFunctions needs a non-empty list of reward functions")
        self.funcs = [get_reward_function(f) for f in funcs]
        self.weights = self._check_weights(weights, len(self.funcs))
        if names is not None and len(names) != len(self.funcs):
            raise ValueError(f"RewardFunctions: got {len(names)} names for {len(self.funcs)} reward functions")
        if names is not None and not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"RewardFunctions: names must be non-empty strings, got {list(names)!r}")
        defaults = [_default_name(spec, f) for spec, f in zip(funcs, self.funcs)]
        self.names = _dedupe(list(names) if names is not None else defaults)

    @staticmethod
    def _check_weights(weights: list[float] | None, n: int) -> list[float]:
        if weights is None:
            return [1.0] * n
        if len(weights) != n:
            raise ValueError(f"RewardFunctions: got {len(weights)} weights for {n} reward functions")
        for i, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
                raise ValueError(f"RewardFunctions: weight {i} must be a finite number, got {w!r}")
            if abs(w) > MAX_ABS_REWARD:
                raise ValueError(f"RewardFunctions: weight {i} must be in {_ALLOWED}, got {w!r}")
        return [float(w) for w in weights]

    def __call__(self, prompts: list, completions: list[str], columns: dict[str, list] | None = None) -> RewardOutput:
        """Score a batch: every function is called as ``f(prompts=..., completions=..., **columns)``."""
        columns = dict(columns or {})
        batch = _check_batch(prompts, completions, columns)
        per_function = {}
        for name, fn in zip(self.names, self.funcs):
            raw = _call(name, fn, prompts, completions, columns)
            per_function[name] = _to_tensor(name, raw, prompts, batch)
        stacked = torch.stack(list(per_function.values()))  # (F, B)
        weights = torch.tensor(self.weights, dtype=torch.float32).unsqueeze(1)
        scores = torch.nansum(stacked * weights, dim=0)
        valid = ~torch.isnan(stacked).all(dim=0)
        return RewardOutput(scores, per_function, valid)

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={w:g}" for n, w in zip(self.names, self.weights))
        return f"RewardFunctions({inner})"


def _default_name(spec: Any, fn: Callable) -> str:
    if isinstance(spec, str):  # a registered name, or the last part of an import path
        return spec.replace(":", ".").rsplit(".", 1)[-1]
    return getattr(fn, "__name__", None) or type(fn).__name__


def _dedupe(names: list[str]) -> list[str]:
    """Names made unique by suffixing repeats: ``["f", "f", "g"]`` → ``["f", "f_2", "g"]``."""
    seen: set[str] = set()
    out = []
    for name in names:
        candidate, k = name, 1
        while candidate in seen:
            k += 1
            candidate = f"{name}_{k}"
        seen.add(candidate)
        out.append(candidate)
    return out


def _check_batch(prompts: list, completions: list[str], columns: dict[str, list]) -> int:
    """Batch size ``B``; prompts, completions and every column hold ``B`` items."""
    batch = len(prompts)
    if len(completions) != batch:
        raise ValueError(f"reward functions: got {batch} prompts but {len(completions)} completions")
    for key, values in columns.items():
        if key in ("prompts", "completions"):
            raise ValueError(f"reward functions: dataset column {key!r} clashes with the argument of that name")
        if not isinstance(values, (list, tuple)) or len(values) != batch:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(f"reward functions: column {key!r} must be a list of {batch} values, got {got}")
    return batch


def _call(name: str, fn: Callable, prompts: list, completions: list[str], columns: dict[str, list]) -> Any:
    """Call one function on copies of the lists (so one function cannot alter another's input)."""
    kwargs = {key: list(values) for key, values in columns.items()}
    try:
        return fn(prompts=list(prompts), completions=list(completions), **kwargs)
    except Exception as e:
        hint = ""
        if isinstance(e, TypeError) and "unexpected keyword" in str(e):
            hint = "; every dataset column is passed as a keyword list, so accept **kwargs"
        raise ValueError(
            f"reward function {name!r} raised {type(e).__name__}: {e} "
            f"(batch of {len(completions)}; first prompt {_preview(prompts[0]) if prompts else '-'}){hint}"
        ) from e


def _to_tensor(name: str, raw: Any, prompts: list, batch: int) -> torch.Tensor:
    """(B,) float32 of one function's scores, NaN for None; malformed values are refused."""
    if not isinstance(raw, (list, tuple)):
        raise ValueError(
            f"reward function {name!r} must return a list of {batch} floats (or None), "
            f"got {type(raw).__name__}; convert arrays and tensors with .tolist()"
        )
    if len(raw) != batch:
        raise ValueError(f"reward function {name!r} returned the wrong number of scores: expected {batch}, got {len(raw)}")
    values = []
    for row, value in enumerate(raw):
        if value is None:
            values.append(math.nan)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            problem = "a bool" if isinstance(value, bool) else f"not a number ({type(value).__name__})"
        elif not math.isfinite(value):
            problem = "not finite"
        elif abs(value) > MAX_ABS_REWARD:
            problem = "too large (the batch statistics are float32, where such scores overflow: rescale the reward)"
        else:
            values.append(float(value))
            continue
        raise ValueError(
            f"reward function {name!r} returned {value!r} at row {row}, which is {problem}; "
            f"expected a float in {_ALLOWED} or None (prompt {_preview(prompts[row])})"
        )
    return torch.tensor(values, dtype=torch.float32)


def _preview(prompt: Any, limit: int = 60) -> str:
    """The first ``limit`` characters of a prompt (the last message's content for a chat), quoted."""
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content", "")
    return repr(str(prompt)[:limit])
