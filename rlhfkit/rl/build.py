"""Assembling phases 1–3: the run's ``Sampler`` (and its evaluation set) from what ``RLTrainer`` is
given, so the trainer keeps the loop, the update side and the run.

One function per job:

- ``episode_source``: the run's ``agents.source.EpisodeSource``, if any — an ``agents.agent.Agent``
  for ``tools`` / ``environment_factory`` (with the config's agent options), or an
  ``endpoint.program.ProgramAgent`` for ``agent_program``;
- ``build_rewards_of``: the run's reward sources plus the ones the episode source brings
  (``EpisodeSource.reward_sources``: the environments' ``get_reward()``, the program's reward);
- ``build_sampler``: the prompts' token ids (train and eval), the engine sized for the longest
  prompt it may be given (``rollout.engines.build_engine``, with the option fields its
  ``config.engines`` entry names), and the local ``rl.sampler.Sampler``
  or, on a trainer rank fed by generator ranks, the ``rl.pipeline.RemoteSampler``; returned with
  the ``EvalSet`` the trainer's evaluation runs.
"""

from __future__ import annotations

from typing import NamedTuple

from .. import distributed
from ..agents.agent import build_agent, model_name
from ..agents.episode import AgentOptions
from ..agents.source import EpisodeSource
from ..config import RLConfig, part
from ..config.engines import engine_options
from ..data.encode import prompt_limit, tokenize_prompts
from ..endpoint.program import program_agent
from ..models.loading import eos_token_ids
from ..rewards.sources import build_rewards
from ..rollout import SamplingParams
from ..rollout.engines import EngineConfig, build_engine
from .advantages import ScoreShaping
from .pipeline import RemoteSampler
from .sampler import Sampler, SamplerConfig


class EvalSet(NamedTuple):
    """The held-out prompts the trainer evaluates: their ``rows``, token ``prompt_ids`` and the
    greedy ``sampling`` (``eval_max_new_tokens``, else ``max_new_tokens``)."""

    rows: list[dict]
    prompt_ids: list[list[int]]
    sampling: SamplingParams


def agent_prompt_limit(config: RLConfig, models) -> int | None:
    """The longest prompt allowed, in tokens (``data.encode.prompt_limit``: ``max_prompt_length``,
    else the model's positions minus ``max_new_tokens``)."""
    return prompt_limit(config.max_prompt_length, config.max_new_tokens, models.policy.config)


def episode_source(
    config: RLConfig, models, model, tools=None, environment_factory=None, agent_program=None
) -> EpisodeSource | None:
    """The run's episode source: an ``Agent`` for ``tools`` / ``environment_factory`` (the config's
    agent fields; a turn ends at the model's end ids too), a ``ProgramAgent`` for ``agent_program``
    (refused in one line beside tools / environments), None for one completion per prompt.
    ``model``: what the trainer was given (its name goes to the chat template checks)."""
    name = model_name(model)
    options = AgentOptions(
        max_tool_calling_iterations=config.max_tool_calling_iterations,
        max_tool_response_tokens=config.max_tool_response_tokens,
        tool_call_timeout=config.tool_call_timeout,
        model_name=name,
    )
    tokenizer = models.tokenizer
    limit = agent_prompt_limit(config, models)
    eos = eos_token_ids(tokenizer, models.policy)
    agent: EpisodeSource | None = build_agent(tokenizer, tools, environment_factory, options, limit, eos)
    if agent_program is not None:  # the program's episodes through the endpoint
        agent = program_agent(agent_program, agent, tokenizer, models, name)
    return agent


def build_rewards_of(reward_funcs: list, reward_weights, source: EpisodeSource | None, tokenizer, device):
    """``rewards.sources.build_rewards`` of the run's sources and, after them, those ``source``
    brings (weight 1 each when ``reward_weights`` are given)."""
    sources, weights = list(reward_funcs), reward_weights
    for extra in source.reward_sources() if source is not None else []:
        sources, weights = sources + [extra], list(weights) + [1.0] if weights is not None else None
    return build_rewards(sources, weights, tokenizer, device)


def build_sampler(
    config: RLConfig,
    models,
    train_rows: list[dict],
    reward_funcs: list,
    reward_weights=None,
    source: EpisodeSource | None = None,
    eval_rows: list[dict] | None = None,
) -> tuple[Sampler, EvalSet | None]:
    """Phases 1–3's component for this process and the evaluation set (module docstring).
    ``models``: the ``RLModels`` (policy, tokenizer, device); ``source``: an ``EpisodeSource``
    or None (``episode_source``). A prompt too long is refused naming its row."""
    if source is not None and not isinstance(source, EpisodeSource):
        raise TypeError(
            f"the episode source must be an rlhfkit.agents.source.EpisodeSource, got {type(source).__name__}"
        )
    tokenizer = models.tokenizer
    rewards = build_rewards_of(reward_funcs, reward_weights, source, tokenizer, models.device)
    limit, cut = agent_prompt_limit(config, models), config.truncate_prompts
    prompt_ids = tokenize_prompts(train_rows, tokenizer, limit, cut)
    evals = None
    if eval_rows is not None:
        sampling = SamplingParams.from_config(
            config, max_new_tokens=config.eval_max_new_tokens or config.max_new_tokens, greedy=True
        )
        evals = EvalSet(eval_rows, tokenize_prompts(eval_rows, tokenizer, limit, cut, "eval_dataset"), sampling)
    longest = max((len(p) for p in prompt_ids + (evals.prompt_ids if evals else [])), default=1)
    if source is not None and limit:  # an episode's prompt carries the tools' schemas: the longest allowed
        longest = max(longest, limit)
    engine = build_engine(part(EngineConfig, config), models, longest, engine_options(config.rollout_engine, config))
    parts = (part(SamplerConfig, config), part(ScoreShaping, config), SamplingParams.from_config(config))
    sampler: Sampler | RemoteSampler
    if config.rollout_workers and not distributed.is_generator():
        sampler = RemoteSampler(
            *parts, train_rows, prompt_ids, models, engine, rewards, source, max_staleness=config.max_staleness
        )
    else:
        sampler = Sampler(*parts, train_rows, prompt_ids, models, engine, rewards, source)
    return sampler, evals


__all__ = ["EvalSet", "agent_prompt_limit", "build_rewards_of", "build_sampler", "episode_source"]
