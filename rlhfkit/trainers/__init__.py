"""Trainers: SFT, reward model, DPO, and the one RL loop for every RL algorithm."""

from .dpo import DPOConfig, DPOTrainer
from .reward_model import RewardModelConfig, RewardModelTrainer
from .rl import RLTrainer
from .sft import SFTConfig, SFTTrainer

__all__ = ["DPOConfig", "DPOTrainer", "RLTrainer", "RewardModelConfig", "RewardModelTrainer", "SFTConfig", "SFTTrainer"]
