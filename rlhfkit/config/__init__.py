"""Every config of rlhfkit, in one package of the config layer (below the models, the data and the
trainers, which all read it; it imports no torch):

- ``rl.py``: ``RLConfig`` (the RL run, one flat object as TRL's ``GRPOConfig``), joined from its concerns:
  ``ModelConfig``, ``OptimConfig``, ``RunConfig`` (there), ``rollout.py`` (``RolloutConfig``, the engines'
  ``HFOptions`` and ``VLLMOptions``, ``AgentConfig``) and ``algorithm.py`` (``AlgorithmConfig`` and the
  algorithm ``PRESETS``); ``rl.py`` also checks the combinations;
- ``base.py``: what every trainer's config shares (``OptimBase``, ``RunBase``, the lists of
  choices such as ``DTYPES`` and ``SCHEDULERS``);
- ``supervised.py``: ``SFTConfig``, ``RewardModelConfig``, ``DPOConfig`` (on ``TrainConfig``);
- ``jobs.py``: the command line's jobs, a trainer config plus its model and data paths;
- ``checks.py``: the one-line checks every config runs at construction (``check_ranges``, ``check_fields``,
  ``check_run_fields``) and ``ranges_of``: ``RANGES``, the allowed range of every numeric field, is read from
  the declarations, where each range stands beside its field (``base.ranged``);
- ``presets.py``: the algorithms as values of the preset fields (``PRESETS``; ``base.preset`` declares such a
  field);
- ``engines.py``: the rollout engines by name, each with its own rules (``EngineEntry``, ``register_engine``);
- ``io.py``: YAML files, ``key=value`` overrides and ``--help`` text, generic over any config.
- ``trl_names.py``: TRL's field names and rlhfkit's for the same setting (the drop-in configs'
  renames, ``rlhfkit/trl/``), which the unknown-key error of ``io.py`` answers with;
- ``parts.py``: ``takes`` and ``part``, the parts of ``RLConfig`` that the phases read.

Each field is declared once, in its concern, and documented right under it; that docstring is the only
source of help text. Configs are frozen: nothing changes them at run time. This module re-exports the RL
config's names, the checks and the file functions (``from rlhfkit.config import RLConfig, PRESETS,
load_config``); the supervised configs and the jobs are imported from their modules (or ``from rlhfkit
import SFTConfig``).

The phases of the RL loop take *parts* of ``RLConfig``, never the whole config: a part is a frozen
dataclass that holds only the fields one phase reads, under ``RLConfig``'s names, and ``part`` builds it
(``part(MinibatchUpdate, config)``). A part declares only which fields it takes
(``@takes("num_iterations", "seed")``); their type, default and doc are the config's. Each part lives
next to the phase that reads it (``rl/update.py:MinibatchUpdate``, ``rl/advantages.py:AdvantageEstimation``,
``models/rl_build.py:ModelLoading``, ...), not in this package: the reader of a phase finds what it reads
in the same file, and the config layer stays unaware of the layers above it. A phase that calls another
takes a part derived from the callee's and passes itself on. ``tests/test_config_parts.py`` checks that
every class given to ``part`` holds ``RLConfig`` fields only, as the config declares them.
"""

from __future__ import annotations

from .base import DEVICE_KINDS, DTYPES, PARALLELISMS, SCHEDULERS, OptimBase, RunBase
from .checks import TRACKERS, check_fields, check_ranges, check_run_fields, in_range, ranges_of
from .io import field_docs, format_help, load_config, save_config
from .jobs import DPOJob, KTOJob, RLJob, RMJob, SFTJob  # noqa: E402  (after RLConfig, which they build on)
from .parts import part, takes
from .rl import (
    AUTOCAST_DTYPES,
    CRITICS,
    PRESETS,
    AgentConfig,
    AlgorithmConfig,
    HFOptions,
    ModelConfig,
    OptimConfig,
    RLConfig,
    RolloutConfig,
    RunConfig,
    VLLMOptions,
)

# The allowed values of every numeric field of every config (the jobs hold the supervised configs' fields and the
# command line's sources), by name: one meaning per name across configs.
RANGES: dict[str, str] = ranges_of(RLJob, SFTJob, RMJob, DPOJob, KTOJob)

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
    "HFOptions",
    "ModelConfig",
    "OptimBase",
    "OptimConfig",
    "RLConfig",
    "RolloutConfig",
    "RunBase",
    "RunConfig",
    "VLLMOptions",
    "check_fields",
    "check_ranges",
    "check_run_fields",
    "field_docs",
    "format_help",
    "in_range",
    "load_config",
    "save_config",
    "part",
    "takes",
]
