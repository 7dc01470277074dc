"""How ``RewardFunctions`` calls a reward function: TRL's contract (``GRPOTrainer._calculate_rewards``,
TRL 1.16), and ``async def`` functions run concurrently.

Besides ``prompts``, ``completions`` and the dataset columns, a function receives the keywords of
``CONTRACT`` when its signature takes them — by name, or through ``**kwargs`` as TRL's functions
do — so a function written without them (``f(prompts, completions, answer)``) works unchanged:

- ``completion_ids``: the sampled token ids of each completion, a list of ``B`` lists of ints,
  without padding (up to and including the EOS token, as TRL's; an agent episode's response
  region, tool results included); None when the caller has none (a direct call);
- ``trainer_state``: a ``TrainingState`` (``global_step``, ``max_steps``, ``epoch``,
  ``is_world_process_zero``, ``is_local_process_zero``: what TRL's ``trainer_state`` offers that
  a reward function can use); None outside a training run (``rlhfkit eval``);
- ``log_metric(name, value)``: a number for this batch; the values logged under ``name`` in one
  step are averaged (over calls and processes) into that step's metrics as ``name`` (TRL's key),
  ``eval/<name>`` in an evaluation (a name in the run's own families, ``RUN_METRICS``, is refused);
- ``log_extra(column, values)``: ``B`` values (JSON-able) added as ``column`` to the samples the
  step logs to ``samples.jsonl`` (TRL's completions table).

``async def`` functions (or callables whose ``__call__`` is one) are awaited together with
``asyncio.gather`` after the synchronous ones have run, on one event loop in a daemon thread of
this process (as TRL does: the loop outlives each batch, so a client a function keeps can be
reused, and it works beside a running loop, e.g. in a notebook).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import os
import sysconfig
import threading
import traceback
from dataclasses import dataclass

CONTRACT = ("completion_ids", "trainer_state", "log_metric", "log_extra")
RESERVED_COLUMNS = ("step", "prompt", "completion", "score")  # samples.jsonl's own keys
RUN_METRICS = ("reward/", "rollout/", "kl/", "policy/", "critic/", "perf/", "eval/", "agent/")  # the run's own families


@dataclass(frozen=True)
class TrainingState:
    """What a reward function is told of the run (``trainer_state=``), with the names of
    ``transformers.TrainerState``: ``global_step`` — the steps done before this batch's step (in a
    periodic evaluation: the steps done), ``max_steps`` — the run's, ``epoch`` — passes over the
    train prompts so far (fractional), and which process this is."""

    global_step: int
    max_steps: int
    epoch: float = 0.0
    is_world_process_zero: bool = True
    is_local_process_zero: bool = True


def accepted_keywords(fn) -> frozenset | None:
    """The keyword names ``fn`` takes; None when it takes any (``**kwargs``) or its signature is
    unknown (then it is called as before these keywords existed: none of them)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def contract_keywords(accepted: frozenset | None, offered: dict) -> dict:
    """The keywords of ``offered`` (``CONTRACT``'s) that a function taking ``accepted`` receives."""
    return dict(offered) if accepted is None else {k: v for k, v in offered.items() if k in accepted}


def is_async_callable(fn) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` function, a ``functools.partial``
    of one, or an object whose ``__call__`` is one."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


class RewardLogs:
    """What the functions of one batch of ``batch`` samples log: ``metrics`` (name -> the values,
    in call order) and ``extra`` (column -> ``batch`` values)."""

    def __init__(self, batch: int):
        self.batch = batch
        self.metrics: dict[str, list[float]] = {}
        self.extra: dict[str, list] = {}

    def for_function(self, name: str) -> tuple:
        """``(log_metric, log_extra)`` for the function ``name`` (its errors name it)."""
        return functools.partial(self.log_metric, name), functools.partial(self.log_extra, name)

    def log_metric(self, fn_name: str, name, value) -> None:
        if not isinstance(name, str) or not name or name == "step" or name.startswith(RUN_METRICS):
            raise ValueError(
                f"reward function {fn_name!r}: log_metric needs a metric name (a non-empty string, not "
                f"'step' nor in the run's own families {', '.join(RUN_METRICS)}), got {name!r}"
            )
        if hasattr(value, "item"):  # a tensor or numpy scalar
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(
                f"reward function {fn_name!r}: log_metric({name!r}, ...) needs a finite number, got {value!r}"
            )
        self.metrics.setdefault(name, []).append(float(value))

    def log_extra(self, fn_name: str, column, values) -> None:
        if not isinstance(column, str) or not column or column in RESERVED_COLUMNS:
            raise ValueError(
                f"reward function {fn_name!r}: log_extra needs a column name (a non-empty string, not one "
                f"of samples.jsonl's own {', '.join(RESERVED_COLUMNS)}), got {column!r}"
            )
        if hasattr(values, "tolist"):
            values = values.tolist()
        if not isinstance(values, (list, tuple)) or len(values) != self.batch:
            got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
            raise ValueError(
                f"reward function {fn_name!r}: log_extra({column!r}, ...) needs one value per sample "
                f"({self.batch}), got {got}"
            )
        if column in self.extra:
            raise ValueError(
                f"reward function {fn_name!r}: log_extra column {column!r} was already logged for this "
                "batch (each column once per batch)"
            )
        self.extra[column] = list(values)


_LOOP: dict = {}  # pid -> the event loop of that process's daemon thread


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's reward event loop, started on first use (a forked child starts its own: the
    parent's thread is not in it)."""
    loop = _LOOP.get(os.getpid())
    if loop is None:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="rlhfkit-async-rewards", daemon=True).start()
        _LOOP.clear()
        _LOOP[os.getpid()] = loop
    return loop


def run_concurrently(awaitables: list) -> list:
    """Await ``awaitables`` together (``asyncio.gather``) on the reward event loop; each one's
    result, or the exception it raised (every one runs to its end before this returns)."""

    async def gather():
        return await asyncio.gather(*awaitables, return_exceptions=True)

    return asyncio.run_coroutine_threadsafe(gather(), _event_loop()).result()


def _not_the_users() -> tuple:
    """Folders whose files are not the user's code: rlhfkit's own, the standard library's,
    site-packages' (every install scheme's, the virtual environment's included)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the rlhfkit package
    paths = sysconfig.get_paths()
    folders = {here, *(paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))}
    return tuple(os.path.join(os.path.abspath(f), "") for f in folders if f)


_INSTALLED = tuple(os.sep + name + os.sep for name in ("site-packages", "dist-packages"))


def where_user_code_raised(error: BaseException) -> str:
    """Where ``error`` was raised in the user's own code: the innermost frame of its traceback in a
    file that is not rlhfkit's, the standard library's nor site-packages' (nor ``<string>``-like),
    as ``my_rewards.py:12 in score`` (the path relative to the current directory when inside
    it, else in full); ``""`` when no frame is the user's."""
    skipped, found = _not_the_users(), None
    for frame, line in traceback.walk_tb(error.__traceback__):
        path = os.path.abspath(frame.f_code.co_filename)
        if (
            not frame.f_code.co_filename.startswith("<")
            and not path.startswith(skipped)
            and not any(part in path for part in _INSTALLED)
        ):
            found = (path, line, frame.f_code.co_name)
    if found is None:
        return ""
    path, line, name = found
    try:
        inside = path.startswith(os.path.join(os.getcwd(), ""))
    except OSError:  # the current directory was removed
        inside = False
    return f"{os.path.relpath(path) if inside else path}:{line} in {name}"


__all__ = [
    "CONTRACT",
    "RESERVED_COLUMNS",
    "RUN_METRICS",
    "RewardLogs",
    "TrainingState",
    "accepted_keywords",
    "contract_keywords",
    "is_async_callable",
    "run_concurrently",
    "where_user_code_raised",
]
