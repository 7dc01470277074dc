"""``EpisodeSource``: what the RL loop's Sampler needs of anything that turns prompt rows into
multi-turn episodes.

Two implement it: ``agents.agent.Agent`` (TRL's ``tools=`` / ``environment_factory=``: episodes run
token in, token out on the engine) and ``endpoint.program.ProgramAgent`` (a user's agent program
against the policy's OpenAI-compatible endpoint). The Sampler, the evaluation and the builder that
assembles them (``rl.build.build_sampler``) know only this interface:

- ``start(rows, indices, group_size, name)``: ``group_size`` episodes per row of ``indices``
  (rows ``g*G .. g*G+G-1`` of the batch share row ``g``);
- ``run(engine, episodes, sampling, seed, version)``: the episodes to their end with ``engine``,
  ``sampling`` and the policy of ``version`` (optimizer steps behind the weights the engine
  samples) — all passed in, nothing held between calls — returning their ``Rollout`` and the
  finished episodes (one per row of the rollout, in the order ``start`` gave them);
- ``reward_sources()``: the reward sources the episodes bring besides the run's own (the
  environments' ``get_reward()``, the program's returned reward), each read from
  ``environments=`` as TRL passes it;
- ``close()``: release what the source holds when the run ends (the program's endpoint).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from ..rollout.base import Rollout, SamplingParams, Seed
from .episode import Episode


class EpisodeSource(ABC):
    """Prompt rows in, finished episodes and their ``Rollout`` out (module docstring)."""

    @abstractmethod
    def start(
        self, rows: list[dict], indices: list[int], group_size: int, name: str = "train_dataset"
    ) -> list[Episode]:
        """``group_size`` episodes per row of ``indices`` (``name``: the dataset, for errors)."""

    @abstractmethod
    def run(
        self, engine, episodes: list[Episode], sampling: SamplingParams, seed: Seed = None, version: int = 0
    ) -> tuple[Rollout, list[Episode]]:
        """The ``episodes`` to their end on ``engine`` with ``sampling`` (``seed``: one per episode)
        by the policy of ``version``: their ``Rollout`` and the finished episodes."""

    def reward_sources(self) -> list[Callable]:
        """The reward sources the episodes bring (TRL's reward-function contract, reading
        ``environments=``); none by default."""
        return []

    def close(self) -> None:
        """Release what the source holds when the run ends; nothing by default."""
        return None


__all__ = ["EpisodeSource"]
