"""Trainers: SFT, reward model, and the one RL loop for every RL algorithm."""

from .reward_model import RewardModelConfig, RewardModelTrainer
from .rl import RLTrainer
from .sft import SFTConfig, SFTTrainer

__all__ = ["RLTrainer", "RewardModelConfig", "RewardModelTrainer", "SFTConfig", "SFTTrainer"]
