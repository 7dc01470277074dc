"""Generation engines behind one small interface (``RolloutEngine``)."""

from .base import Rollout, RolloutEngine, SamplingParams, build_rollout, concat_rollouts, decode_completions
from .hf import HFEngine

__all__ = [
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout",
    "concat_rollouts",
    "decode_completions",
]
