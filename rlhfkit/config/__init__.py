"""Every config of rlhfkit, in one package of the config layer (below the models, the data and the
trainers, which all read it; it imports no torch):

- ``rl.py``: ``RLConfig`` (the RL run, one flat object as TRL's ``GRPOConfig``) and its concerns
  (``ModelConfig``, ``RolloutConfig``, ``AgentConfig``, ``AlgorithmConfig``, ``OptimConfig``,
  ``RunConfig``), the algorithm ``PRESETS`` and the checks of their combinations;
- ``base.py``: what every trainer's config shares (``OptimBase``, ``RunBase``, the lists of
  choices such as ``DTYPES`` and ``SCHEDULERS``);
- ``supervised.py``: ``SFTConfig``, ``RewardModelConfig``, ``DPOConfig`` (on ``TrainConfig``);
- ``jobs.py``: the command line's jobs, a trainer config plus its model and data paths;
- ``checks.py``: ``RANGES`` (the allowed range of every numeric field) and the one-line checks
  every config runs at construction (``check_ranges``, ``check_fields``, ``check_run_fields``);
- ``io.py``: YAML files, ``key=value`` overrides and ``--help`` text, generic over any config.
- ``trl_names.py``: TRL's field names and rlhfkit's for the same setting (the drop-in configs'
  renames, ``rlhfkit/trl/``), which the unknown-key error of ``io.py`` answers with.

Each field is documented right under it; that docstring is the only source of help text. Configs
are frozen: nothing changes them at run time. This module re-exports the RL config's names, the
checks and the file functions (``from rlhfkit.config import RLConfig, PRESETS, load_config``); the
supervised configs and the jobs are imported from their modules (or ``from rlhfkit import SFTConfig``).

The phases of the RL loop take *parts* of ``RLConfig``, never the whole config: a part is a frozen
dataclass that lists only the fields one phase reads, under ``RLConfig``'s names, and ``part``
builds it (``part(MinibatchUpdate, config)``). Each part lives next to the phase that reads it
(``rl/update.py:MinibatchUpdate``, ``rl/advantages.py:AdvantageEstimation``,
``models/rl_models.py:ModelLoading``, ...), not in this package: the reader of a phase finds what
it reads in the same file, and the config layer stays unaware of the layers above it. A phase that
calls another takes a part derived from the callee's and passes itself on. Because the names are
the config's, ``part`` needs no mapping, and ``tests/test_config_parts.py`` checks that every class
given to ``part`` names ``RLConfig`` fields only.
"""

from __future__ import annotations

from .base import DEVICE_KINDS, DTYPES, PARALLELISMS, SCHEDULERS, OptimBase, RunBase
from .checks import RANGES, TRACKERS, check_fields, check_ranges, check_run_fields, in_range
from .io import field_docs, format_help, load_config, save_config
from .rl import (
    AUTOCAST_DTYPES,
    CRITICS,
    PRESETS,
    AgentConfig,
    AlgorithmConfig,
    ModelConfig,
    OptimConfig,
    RLConfig,
    RolloutConfig,
    RunConfig,
)

__all__ = [
    "AUTOCAST_DTYPES",
    "CRITICS",
    "DEVICE_KINDS",
    "DTYPES",
    "PARALLELISMS",
    "PRESETS",
    "RANGES",
    "SCHEDULERS",
    "TRACKERS",
    "AgentConfig",
    "AlgorithmConfig",
    "ModelConfig",
    "OptimBase",
    "OptimConfig",
    "RLConfig",
    "RolloutConfig",
    "RunBase",
    "RunConfig",
    "check_fields",
    "check_ranges",
    "check_run_fields",
    "field_docs",
    "format_help",
    "in_range",
    "load_config",
    "save_config",
    "part",
]


def part(cls, config):
    """An instance of the dataclass ``cls`` holding the values of ``config``'s fields of the same
    names: the small typed part of a config that one phase reads (``rl.sampler.SamplerConfig``,
    ``rl.advantages.ScoreShaping``, ...). A part names its fields as the config does, so a field's
    user-facing name lives in one place."""
    import dataclasses

    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})
