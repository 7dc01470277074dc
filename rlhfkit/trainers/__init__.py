"""Trainers: SFT, reward model, and the one RL loop for every RL algorithm."""

from .rl import RLTrainer

__all__ = ["RLTrainer"]
