"""Reward sources for the RL loop: programmatic (verifiable) reward functions with TRL's calling
shape, their weighted combination, and a name registry for YAML configs."""

from .functions import (
    REWARD_FUNCTIONS,
    RewardFunctions,
    RewardOutput,
    get_reward_function,
    register_reward_function,
)
from .verifiable import (
    answer_format,
    answers_match,
    concise_math_answer,
    digit_match,
    exact_match,
    extract_answer,
    math_answer,
    strict_math_answer,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunctions",
    "RewardOutput",
    "get_reward_function",
    "register_reward_function",
    "answer_format",
    "answers_match",
    "concise_math_answer",
    "digit_match",
    "exact_match",
    "extract_answer",
    "math_answer",
    "strict_math_answer",
]
