"""Tools and environments of an agent episode, with TRL's interface.

- ``tools=[f, g]``: typed Python functions with Google-style docstrings; their JSON schema comes
  from ``transformers.utils.get_json_schema`` and reaches the model through the chat template's
  ``tools=``. Async functions are allowed.
- ``environment_factory=Factory`` (or ``{name: Factory}`` with an ``environment`` column choosing
  per row): one instance per episode; ``reset(**row) -> str | None`` (a string is appended to the
  last user message); its public methods are the episode's tools (``reset`` and ``get_reward``
  excepted); an optional ``get_reward() -> float`` is an extra reward source (``environment``).

How the calls run (in order within an episode, episodes side by side, each under
``tool_call_timeout``): ``agents.calls``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

RESERVED_METHODS = ("reset", "get_reward")


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by ``name``, and the JSON schema the template shows it."""

    name: str
    fn: Callable
    schema: dict


def make_tool(fn: Callable, where: str = "tools") -> Tool:
    """``fn`` with its schema from ``get_json_schema``; a function without type hints or a
    Google-style docstring describing every argument is refused in one line naming it."""
    from transformers.utils import get_json_schema

    name = getattr(fn, "__name__", None) or type(fn).__name__
    if not callable(fn):
        raise ValueError(f"{where}: {name!r} is not callable")
    try:
        schema = get_json_schema(fn)
    except Exception as err:  # TypeHintParsingException, DocstringParsingException
        raise ValueError(
            f"{where}: tool {name!r} needs type hints on every argument and a Google-style docstring "
            f"describing each one (transformers.utils.get_json_schema: {err})"
        ) from None
    schema = schema if "function" in schema else {"type": "function", "function": schema}  # older transformers
    return Tool(schema["function"]["name"], fn, schema)


def make_tools(fns, where: str = "tools") -> dict[str, Tool]:
    """``{name: Tool}`` of a list of callables; two tools of one name are refused."""
    tools: dict[str, Tool] = {}
    for fn in fns or []:
        tool = make_tool(fn, where)
        if tool.name in tools:
            raise ValueError(f"{where}: two tools are named {tool.name!r}")
        tools[tool.name] = tool
    return tools


def import_object(path: str, field: str):
    """``"package.module:name"`` imported (a YAML or command-line ``tools`` / ``environment`` entry),
    the module found as ``python -m`` finds one (``rewards.functions.import_path``: the current
    directory first); anything else, or a missing module or name, is one line naming the field."""
    from ..rewards.functions import import_path

    return import_path(path, f"{field}: cannot import")


def check_environment_factory(factory, where: str = "environment_factory") -> None:
    """One line for a factory that is not a class/callable or whose instances cannot ``reset``."""
    factories = factory.values() if isinstance(factory, dict) else [factory]
    for f in factories:
        if not callable(f):
            raise ValueError(f"{where}: {f!r} is not a class or callable")
        if inspect.isclass(f) and not callable(getattr(f, "reset", None)):
            raise ValueError(f"{where}: {f.__name__} has no reset(**row) method (it starts each episode)")


def environment_tools(env, where: str = "environment_factory") -> dict[str, Tool]:
    """An environment's public methods, ``reset`` and ``get_reward`` excepted, as tools."""
    if not callable(getattr(env, "reset", None)):
        raise ValueError(f"{where}: {type(env).__name__} has no reset(**row) method (it starts each episode)")
    methods = [
        getattr(env, n)
        for n in dir(env)
        if not n.startswith("_") and n not in RESERVED_METHODS and inspect.ismethod(getattr(env, n, None))
    ]
    return make_tools(methods, f"{where} ({type(env).__name__})")


def new_environment(factory, row: dict, index: int, name: str = "train_dataset"):
    """The environment of one episode: ``factory()``, or ``factory[row['environment']]()`` for a
    dict of factories (a missing or unknown name is one line naming the row of dataset ``name``)."""
    if not isinstance(factory, dict):
        return factory()
    chosen = row.get("environment")
    if chosen not in factory:
        from ..algorithms.registry import did_you_mean

        raise ValueError(
            f"{name}: row index {index} (0-based): environment {chosen!r} is not one of "
            f"{sorted(factory)}{did_you_mean(str(chosen), factory)}"
        )
    return factory[chosen]()


def reset_environment(
    env, row: dict, routed: bool = False, index: int | None = None, name: str = "train_dataset"
) -> str | None:
    """``env.reset(**row)`` as TRL calls it: every column of the row — except, when a dict of
    factories routes rows by their ``environment`` column (``routed``), that control column. A
    ``reset`` that cannot take the columns is refused in one line naming the row (``index``) and
    the columns; its return value must be a string or None."""
    columns = {k: v for k, v in row.items() if k != "environment"} if routed else row
    try:
        signature = inspect.signature(env.reset)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to check before calling it
        signature = None
    if signature is not None:
        try:
            signature.bind(**columns)
        except TypeError as err:
            where = f"{name}: row index {index} (0-based): " if index is not None else ""
            raise ValueError(
                f"{where}{type(env).__name__}.reset(**row) cannot take the row's columns "
                f"{sorted(columns)} ({err}); give reset a **kwargs parameter for the columns it does "
                "not use"
            ) from None
    out = env.reset(**columns)
    if out is not None and not isinstance(out, str):
        raise ValueError(
            f"environment {type(env).__name__}.reset returned {type(out).__name__}; it must return "
            "a string (appended to the last user message) or None"
        )
    return out
