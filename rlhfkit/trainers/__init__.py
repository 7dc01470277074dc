"""Trainers: SFT, reward model, DPO, KTO, and the one RL loop for every RL algorithm."""

from .dpo import DPOConfig, DPOTrainer
from .kto import KTOConfig, KTOTrainer
from .reward_model import RewardModelConfig, RewardModelTrainer
from .rl import RLTrainer
from .sft import SFTConfig, SFTTrainer

__all__ = [
    "DPOConfig",
    "DPOTrainer",
    "KTOConfig",
    "KTOTrainer",
    "RLTrainer",
    "RewardModelConfig",
    "RewardModelTrainer",
    "SFTConfig",
    "SFTTrainer",
]
