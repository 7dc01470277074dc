"""rlhfkit: RL post-training of language models (SFT, reward models, DPO, KTO, PPO / GRPO / REINFORCE / RLOO).

The trainers and their configs are importable from the top level, as in TRL::

    from rlhfkit import RLTrainer, RLConfig, SFTTrainer, SFTConfig
    from rlhfkit import RewardModelTrainer, RewardModelConfig, DPOTrainer, DPOConfig, KTOTrainer, KTOConfig

They are loaded on first use, so ``import rlhfkit`` (and ``rlhfkit.algorithms``) stays light.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "RLConfig": "rlhfkit.config",
    "RLTrainer": "rlhfkit.trainers.rl",
    "SFTConfig": "rlhfkit.config.supervised",
    "SFTTrainer": "rlhfkit.trainers.sft",
    "RewardModelConfig": "rlhfkit.config.supervised",
    "RewardModelTrainer": "rlhfkit.trainers.reward_model",
    "DPOConfig": "rlhfkit.config.supervised",
    "DPOTrainer": "rlhfkit.trainers.dpo",
    "KTOConfig": "rlhfkit.config.supervised",
    "KTOTrainer": "rlhfkit.trainers.kto",
    "RewardFunctions": "rlhfkit.rewards",
    "register_reward_function": "rlhfkit.rewards",
    "load_config": "rlhfkit.config.io",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'rlhfkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
