"""Generation engines behind one small interface (``RolloutEngine``)."""

from .base import Rollout, RolloutEngine, SamplingParams, build_rollout
from .hf import HFEngine

__all__ = ["HFEngine", "Rollout", "RolloutEngine", "SamplingParams", "build_rollout"]
