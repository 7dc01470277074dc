"""The parts of ``RLConfig`` that the phases of the RL loop take, declared by name only.

A phase never reads the whole config: it takes a *part*, a frozen dataclass holding the fields it reads under
``RLConfig``'s names (``rl/update.py:MinibatchUpdate``, ``rollout/engines.py:EngineConfig``, ...). A part lives
next to the phase that reads it and says only *which* fields it takes::

    @takes("num_iterations", "mini_batch_size", "seed")
    class MinibatchUpdate(UpdateLoss):
        '''The fields of RLConfig that phase 6 reads.'''

``takes`` gives each named field the type, default and docstring of its one declaration in ``RLConfig``'s
concerns (``rl.py``, ``rollout.py``, ``algorithm.py``, ``base.py``), so a field is written once and a part
cannot drift from it; a group dataclass stands for all of its fields (``takes(VLLMOptions)``). A part may derive
from other parts (it holds their fields too) and add fields of its own that are not config fields (a class
annotation, as in any dataclass: ``greedy: bool = False``); it may not re-declare a config field. ``part``
builds a part from a config or from a larger part.

For the type checker a part derives from ``ConfigFields``, which it reads as ``RLConfig`` (at run time
``object``), and ``takes`` is a ``dataclass_transform``: mypy sees every config field a part may take,
with its type, and the part's own fields; what it cannot see is which of them a part leaves out (reading
one it did not take is an ``AttributeError`` at run time). ``tests/test_config_part_reads.py`` checks it
statically instead: every read of a parameter annotated with a part names a field the part takes."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform

    from .rl import RLConfig as ConfigFields
else:
    ConfigFields = object  # a part's base: RLConfig's fields for the type checker, nothing at run time

    def dataclass_transform(**_):
        return lambda decorator: decorator


@functools.cache
def _declarations() -> tuple[dict[str, dataclasses.Field], dict[str, str]]:
    from .io import field_docs
    from .rl import RLConfig

    return {f.name: f for f in dataclasses.fields(RLConfig) if f.init}, field_docs(RLConfig)


def config_field_names(*groups) -> tuple[str, ...]:
    """Names of the fields ``groups`` stand for: a string is a field's name, a dataclass (a concern of
    ``RLConfig`` such as ``VLLMOptions``) all of its fields, in order."""
    names: list[str] = []
    for group in groups:
        if isinstance(group, str):
            names.append(group)
        elif isinstance(group, type) and dataclasses.is_dataclass(group):
            names.extend(f.name for f in dataclasses.fields(group))
        else:
            raise TypeError(f"takes() expects field names or config dataclasses, got {group!r}")
    return tuple(names)


@dataclass_transform(frozen_default=True)
def takes(*groups):
    """Class decorator: the class becomes a frozen dataclass part holding the ``RLConfig`` fields that
        ``groups`` name (field names, or config dataclasses standing for all their fields), each with the
        config's type, default, docstring (``field.metadata["doc"]``, which ``field_docs`` reads) and declared range
    (``base.ranged``, which ``check_ranges`` reads). A name
        that is no ``RLConfig`` field, one listed twice or already held by a base part, and a config field the
        class body annotates itself are refused when the class is defined."""

    def decorate(cls):
        declared, docs = _declarations()
        names = config_field_names(*groups)
        inherited = {
            f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)
        }
        own = dict(inspect.get_annotations(cls))
        for name in names:
            if name not in declared:
                from ..algorithms.registry import did_you_mean  # only on this error's path

                raise TypeError(
                    f"{cls.__qualname__}: takes({name!r}) names no RLConfig field.{did_you_mean(name, declared)}"
                )
            if names.count(name) > 1 or name in inherited:
                raise TypeError(f"{cls.__qualname__}: takes({name!r}) twice (or a base part already holds it)")
        redeclared = sorted(set(own) & set(declared))
        if redeclared:
            raise TypeError(
                f"{cls.__qualname__} re-declares RLConfig fields {redeclared}: name them in takes(...) instead, "
                "so their type, default and doc stay the config's"
            )
        annotations = {}
        for name in names:
            source = declared[name]
            annotations[name] = source.type
            setattr(
                cls,
                name,
                dataclasses.field(
                    default=source.default,
                    default_factory=source.default_factory,
                    metadata={**source.metadata, "doc": docs[name], "config_field": True},
                ),
            )
        cls.__annotations__ = {**annotations, **own}  # the config's fields first, then the part's own
        return dataclasses.dataclass(frozen=True)(cls)

    return decorate


def part(cls, config):
    """An instance of the part ``cls`` holding the values of ``config``'s fields of the same names: the
    small typed part of a config that one phase reads (``rl.sampler.SamplerConfig``,
    ``rl.advantages.ScoreShaping``, ...). ``config`` is an ``RLConfig`` or a larger part that holds
    ``cls``'s fields; a part's own (non-config) fields keep their defaults unless ``config`` has them."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.init and (f.metadata.get("config_field") or hasattr(config, f.name)):
            values[f.name] = getattr(config, f.name)
    return cls(**values)
