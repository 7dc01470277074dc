"""Reward sources for the RL loop: programmatic (verifiable) reward functions with TRL's calling
shape, their weighted combination, and a name registry for YAML configs."""

from .functions import (
    REWARD_FUNCTIONS,
    RewardFunctions,
    RewardOutput,
    get_reward_function,
    register_reward_function,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunctions",
    "RewardOutput",
    "get_reward_function",
    "register_reward_function",
]
