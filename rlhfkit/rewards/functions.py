"""Programmatic reward functions (RL with verifiable rewards) and their weighted combination.

A reward function has TRL's calling shape::

    f(prompts: list, completions: list, **kwargs) -> list[float | None]

called with keywords: ``prompts`` and ``completions`` are aligned lists of ``B`` items — a prompt
as the dataset gives it (text, or chat messages); a completion as TRL passes it: text for a text
prompt, ``[{"role": "assistant", "content": text}]`` for a conversational one, an agent episode's
messages — and every other dataset column arrives as a keyword list of ``B`` values (e.g.
``answer=[...]``), so a function takes the columns it needs and ``**kwargs`` for the rest. TRL's
``completion_ids``, ``trainer_state``, ``log_metric`` and ``log_extra`` reach a function that takes
them (``calling.py``); ``async def`` functions run concurrently. ``None`` means "this function
does not apply to this sample" (e.g. a code checker on a math prompt).

``RewardFunctions`` combines several with weights the way TRL's GRPO trainer does: the score of a
sample is the weighted sum over the functions that returned a number for it (a NaN-sum); a sample
no function scored is marked invalid and the trainer masks it out. A function that raises or
returns something malformed stops training with a ``ValueError`` naming the function, the row and
the start of the prompt (one that raised: ending with where it raised in the user's own file,
``(my_rewards.py:12 in score)``, ``calling.where_user_code_raised``). So does a score outside
``±MAX_ABS_REWARD`` (1e6), and a weight outside it: the batch statistics (means, stds, whitening)
are float32, where sums and squares of scores near 3e38 overflow to inf — a reward that large is a
bug or a unit to rescale, not a signal.

Functions are named in YAML configs through ``REWARD_FUNCTIONS`` (``@register_reward_function``)
or by an import path ``module:function``, resolved by ``get_reward_function`` (``import_path``:
the current directory first, as ``python -m`` does).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import math
import numbers
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..algorithms.registry import did_you_mean
from .calling import (
    CONTRACT,
    RewardLogs,
    accepted_keywords,
    contract_keywords,
    is_async_callable,
    run_concurrently,
    where_user_code_raised,
)
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
        raise ValueError(
            f"reward function {name}: the run that recorded it passed a function that cannot be "
            "imported; name it here by an import path 'package.module:function'"
        )
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


@register_reward_function("no_reward")
def no_reward(prompts, completions, **columns) -> list[float]:
    """0 for every completion: the reward of a run whose only signal is a teacher's (on-policy distillation,
    ``distillation_coef`` > 0 with no reward function; the trainer adds it then, so the run records it)."""
    return [0.0] * len(completions)


def unrecorded_reward(name: str, why: str = "") -> str:
    """What a run records for a reward function that no name or import path can find again:
    ``<not importable: name — why>`` (``get_reward_function`` refuses it, quoting it)."""
    return f"{_UNRECORDED}{name}{' — ' + why if why else ''}>"


def _import_function(path: str) -> RewardFunction:
    """Import ``"pkg.mod:attr.attr"`` and check that it is callable."""
    obj = import_path(path, "reward function")
    if not callable(obj):
        raise ValueError(f"reward function {path!r} is not callable (got {type(obj).__name__})")
    return obj


def import_path(path: str, what: str) -> Any:
    """The object an import path ``"package.module:name"`` (``name`` may be dotted) names, its module
    found as ``python -m`` finds one: in the current directory first (which joins ``sys.path``, at
    its front, as with ``python -m``), then on ``sys.path``. A module that is nowhere is one line
    saying where it was looked for; ``what`` names the field in messages."""
    module_name, _, attr = str(path).partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r}: expected 'package.module:function'")
    cwd = os.getcwd()
    if cwd not in {os.path.abspath(p or os.curdir) for p in sys.path}:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module file written since this directory was last listed
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None)
        if isinstance(e, ModuleNotFoundError) and missing and f"{module_name}.".startswith(f"{missing}."):
            where = (
                f"the current directory {cwd} and sys.path {[p for p in sys.path if os.path.abspath(p or '.') != cwd]}"
            )
            raise ValueError(
                f"{what} {path!r}: cannot import module {module_name!r}: no module {missing!r} in {where}"
            ) from e
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r}: {type(e).__name__}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"{what} {path!r}: module {module_name!r} has no attribute {attr!r} (the module "
                f"imported: {getattr(importlib.import_module(module_name), '__file__', None)})"
            )
        obj = getattr(obj, part)
    return obj


@dataclass
class RewardOutput:
    """Scores of one batch of ``B`` completions.

    - ``scores`` (B,) float32: weighted sum over the functions that scored each sample (0 where none did).
    - ``per_function``: name -> (B,) float32 raw (unweighted) scores, NaN where the function returned None.
    - ``valid`` (B,) bool: False where every function returned None; the trainer masks these out.
    - ``metrics``: what the functions passed to ``log_metric``: name -> its values, in call order.
    - ``extra``: what they passed to ``log_extra``: column -> ``B`` values.
    """

    scores: torch.Tensor
    per_function: dict[str, torch.Tensor]
    valid: torch.Tensor
    metrics: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, list] = field(default_factory=dict)


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
        self.keywords = [accepted_keywords(f) for f in self.funcs]  # which of TRL's extra keywords each takes

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

    def __call__(
        self,
        prompts: list,
        completions: list,
        columns: dict[str, list] | None = None,
        completion_ids: list[list[int]] | None = None,
        trainer_state=None,
    ) -> RewardOutput:
        """Score a batch: every function is called as ``f(prompts=..., completions=..., **columns)``
        plus those of ``completion_ids``, ``trainer_state``, ``log_metric``, ``log_extra`` it takes
        (``calling.py``); the synchronous functions one after another, then the ``async`` ones
        together."""
        columns = dict(columns or {})
        batch = _check_batch(prompts, completions, columns, completion_ids)
        logs = RewardLogs(batch)
        raw = {}
        pending: list[str] = []  # the functions whose scores are awaited together
        for name, fn, accepted in zip(self.names, self.funcs, self.keywords):
            log_metric, log_extra = logs.for_function(name)
            offered = {
                "completion_ids": None if completion_ids is None else [list(ids) for ids in completion_ids],
                "trainer_state": trainer_state,
                "log_metric": log_metric,
                "log_extra": log_extra,
            }
            kwargs = {
                key: list(values) for key, values in columns.items()
            }  # copies: no function alters another's input
            kwargs.update(
                prompts=copy.deepcopy(list(prompts)),
                completions=copy.deepcopy(list(completions)),
                **contract_keywords(accepted, offered),
            )
            try:
                raw[name] = fn(**kwargs)
            except Exception as e:
                for started in pending:  # never awaited now: closed, so Python does not warn about them
                    getattr(raw[started], "close", lambda: None)()
                raise _failure(name, e, prompts) from e
            if is_async_callable(fn) or inspect.isawaitable(raw[name]):
                pending.append(name)
        for name, result in zip(pending, run_concurrently([raw[name] for name in pending]) if pending else []):
            if isinstance(result, BaseException):
                raise _failure(name, result, prompts) from result
            raw[name] = result
        per_function = {name: _to_tensor(name, raw[name], prompts, batch) for name in self.names}
        stacked = torch.stack(list(per_function.values()))  # (F, B)
        weights = torch.tensor(self.weights, dtype=torch.float32).unsqueeze(1)
        scores = torch.nansum(stacked * weights, dim=0)
        valid = ~torch.isnan(stacked).all(dim=0)
        return RewardOutput(scores, per_function, valid, logs.metrics, logs.extra)

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


def _check_batch(prompts: list, completions: list, columns: dict[str, list], completion_ids=None) -> int:
    """Batch size ``B``; prompts, completions, every column and ``completion_ids`` hold ``B`` items."""
    batch = len(prompts)
    if len(completions) != batch:
        raise ValueError(f"reward functions: got {batch} prompts but {len(completions)} completions")
    if completion_ids is not None and len(completion_ids) != batch:
        raise ValueError(f"reward functions: got {batch} prompts but {len(completion_ids)} completion_ids")
    for key, values in columns.items():
        if key in ("prompts", "completions") or key in CONTRACT:
            raise ValueError(f"reward functions: dataset column {key!r} clashes with the argument of that name")
        if not isinstance(values, (list, tuple)) or len(values) != batch:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(f"reward functions: column {key!r} must be a list of {batch} values, got {got}")
    return batch


def _failure(name: str, e: BaseException, prompts: list) -> ValueError:
    """The one line for a function that raised: its name, the error, the batch and its first prompt,
    ending with where it raised in the user's own file, ``(my_rewards.py:12 in score)``."""
    where = where_user_code_raised(e)
    where = f" ({where})" if where else ""
    hint = ""
    if isinstance(e, TypeError) and "unexpected keyword" in str(e):
        hint = "; every dataset column is passed as a keyword list, so accept **kwargs"
    if isinstance(e, ValueError) and str(e).startswith(f"reward function {name!r}"):  # from log_metric / log_extra
        return ValueError(f"{e}{where}")
    first = _preview(prompts[0]) if prompts else "-"
    message = " ".join(str(e).split()) if "\n" in str(e) else e  # one line (a parser's error spans several)
    return ValueError(
        f"reward function {name!r} raised {type(e).__name__}: {message} "
        f"(batch of {len(prompts)}; first prompt {first}){hint}{where}"
    )


def _to_tensor(name: str, raw: Any, prompts: list, batch: int) -> torch.Tensor:
    """(B,) float32 of one function's scores, NaN for None; malformed values are refused."""
    if not isinstance(raw, (list, tuple)):
        raise ValueError(
            f"reward function {name!r} must return a list of {batch} floats (or None), "
            f"got {type(raw).__name__}; convert arrays and tensors with .tolist()"
        )
    if len(raw) != batch:
        raise ValueError(
            f"reward function {name!r} returned the wrong number of scores: expected {batch}, got {len(raw)}"
        )
    values = []
    for row, value in enumerate(raw):
        if value is None:
            values.append(math.nan)
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            problem = "a bool" if isinstance(value, bool) else f"not a number ({type(value).__name__})"
        elif not math.isfinite(value):
            problem = "not finite"
        elif abs(float(value)) > MAX_ABS_REWARD:
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
