"""The rollout engines by name: ``RLConfig.rollout_engine`` is one of ``engine_names()``.

Each ``EngineEntry`` declares an engine's ``name``, its ``build`` function, its ``install_check``
(one line naming what to install, before any model loads), its ``check``: the engine's own rules
among the config's fields (``engine_rules``, run by ``RLConfig``'s validation), and the ``options``:
the ``RLConfig`` fields it reads besides the general ones of ``rollout.engines.EngineConfig``
(vLLM's ``vllm_*``), and its ``knobs``: options of its own that are no config field (name ->
default), which a user sets in the config's ``engine_options`` mapping (checked by
``check_engine_options``). ``rollout.engines.build_engine`` calls ``build(config, models,
longest_prompt, options)`` with ``options`` the values of those fields (``engine_options``). Adding
an engine is a module in ``rollout/`` and one ``register_engine`` call; neither the trainer nor the
general config changes.

The registry lives in the config layer, which names what a config may choose; the engines live above
it (``rollout/``). So the built-in entries name their functions by ``"module:function"`` paths,
loaded when they are first called (``resolve``); an entry registered at run time may give the
functions themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineEntry:
    """One rollout engine (module docstring). ``build``, ``install_check`` and ``check``: functions,
    or ``"module:function"`` paths; ``install_check`` raises ``ValueError`` in one line when the
    engine cannot run here (None: nothing to check); ``check(config)`` returns the engine's rules
    as ``checks.check_fields`` entries ``(ok, field, expected)`` (None: no rule of its own)."""

    name: str
    build: Callable | str
    install_check: Callable | str | None = None
    check: Callable | str | None = None
    options: tuple[str, ...] = ()
    knobs: dict[str, object] | None = None  # options of its own that are no RLConfig field: name -> default


ENGINES: dict[str, EngineEntry] = {}


def register_engine(entry: EngineEntry, replace: bool = False) -> EngineEntry:
    """Add ``entry`` under its name (an existing name is refused unless ``replace``); returns it."""
    if not isinstance(entry, EngineEntry):
        raise TypeError(f"register_engine takes an EngineEntry, got {type(entry).__name__}")
    if entry.name in ENGINES and not replace:
        raise ValueError(f"rollout engine {entry.name!r} is already registered (pass replace=True to replace it)")
    ENGINES[entry.name] = entry
    return entry


def unregister_engine(name: str) -> None:
    """Remove the engine ``name`` (a test's own, for example); unknown names are ignored."""
    ENGINES.pop(name, None)


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, in registration order."""
    return tuple(ENGINES)


def engine_entry(name: str) -> EngineEntry:
    """The entry of ``name``; an unknown one is refused in one line naming the known ones."""
    if name not in ENGINES:
        raise ValueError(f"rollout_engine: {name!r} is not a rollout engine; one of {', '.join(ENGINES)}")
    return ENGINES[name]


def resolve(function: Callable | str) -> Callable:
    """``function`` itself, or the function a ``"module:function"`` path names (imported now)."""
    if callable(function):
        return function
    module, _, attribute = function.partition(":")
    return getattr(importlib.import_module(module), attribute)


def check_installed(name: str) -> None:
    """Run the install check of the engine ``name`` (one ``ValueError`` line when it cannot run)."""
    entry = engine_entry(name)
    if entry.install_check is not None:
        resolve(entry.install_check)()


def check_engine_options(name: str, given: dict) -> None:
    """``given`` (the config's ``engine_options``) against the knobs the engine ``name`` declares:
    a mapping whose keys are among them, each value of its default's type (an int for a float
    knob); one ``ValueError`` line naming the key, the engine and its knobs otherwise."""
    if not isinstance(given, dict):
        raise ValueError(f"engine_options: a mapping of the engine's options, got {type(given).__name__}")
    knobs = engine_entry(name).knobs or {}
    for key, value in given.items():
        if key not in knobs:
            known = ", ".join(knobs) or "none"
            raise ValueError(f"engine_options: {key!r} is no option of rollout_engine={name!r} (its options: {known})")
        default = knobs[key]
        kind = float if isinstance(default, float) else type(default)
        ok = isinstance(value, kind) or (kind is float and isinstance(value, int))
        if default is not None and (not ok or isinstance(value, bool) != isinstance(default, bool)):
            raise ValueError(
                f"engine_options: {key!r} of rollout_engine={name!r} takes a {kind.__name__} "
                f"(default {default!r}), got {value!r}"
            )


def engine_rules(config) -> list[tuple[bool, str, str]]:
    """The rules of the engine ``config.rollout_engine`` names (its entry's ``check``), as
    ``check_fields`` entries; the name itself first (an unknown one fails there, naming the known)."""
    name = config.rollout_engine
    if name not in ENGINES:
        return [(False, "rollout_engine", f"one of {', '.join(ENGINES)}")]
    check_engine_options(name, config.engine_options)  # the engine's own knobs, as its entry declares them
    check = ENGINES[name].check
    return list(resolve(check)(config)) if check is not None else []


def engine_options(name: str, config) -> dict:
    """The options the engine ``name`` is built with: the values of the ``RLConfig`` fields it names
    (``options``), then its own knobs — each the config's ``engine_options`` value, else the knob's
    default."""
    values = {field: getattr(config, field) for field in engine_entry(name).options}
    given = getattr(config, "engine_options", None) or {}
    return {**values, **(engine_entry(name).knobs or {}), **given}


register_engine(
    EngineEntry("hf", "rlhfkit.rollout.engines:build_hf_engine", check="rlhfkit.config.rollout:hf_engine_rules")
)
register_engine(
    EngineEntry(
        "vllm",
        "rlhfkit.rollout.vllm:build_vllm_engine",
        install_check="rlhfkit.rollout.vllm:import_vllm",
        options=(
            "vllm_kv_cache_gb",
            "vllm_gpu_memory_utilization",
            "vllm_enforce_eager",
            "vllm_sleep",
            "vllm_tensor_parallel_size",
        ),
    )
)

__all__ = [
    "ENGINES",
    "EngineEntry",
    "check_installed",
    "engine_entry",
    "engine_names",
    "engine_options",
    "engine_rules",
    "register_engine",
    "resolve",
    "unregister_engine",
]
