"""``Agent``: what the RL loop needs to turn prompt rows into agent episodes (TRL's ``tools=`` and
``environment_factory=``), and their ``agent/*`` metrics and environment reward."""

from __future__ import annotations

import copy

import torch

from .. import distributed
from ..models.loading import eos_token_ids
from .episode import AgentOptions, Episode, run_episodes, start_episode
from .source import EpisodeSource
from .templates import check_agent_template
from .tools import check_environment_factory, environment_tools, make_tools, new_environment, reset_environment


class Agent(EpisodeSource):
    """An ``EpisodeSource`` (``agents.source``): episodes for prompt rows: each has the static ``tools`` plus, with an
    ``environment_factory``, a fresh environment (``reset(**row)``; its public methods are tools).

    ``prompt_limit``: the longest prompt (with the tools' schemas rendered) in tokens, None for no
    limit; a longer one is refused in one line naming its row. ``eos_ids``: the ids that end the
    model's turns besides the tokenizer's EOS (``models.loading.eos_token_ids(tokenizer, model)``:
    Gemma 2's ``<end_of_turn>``), for finding where the template ends a turn."""

    def __init__(
        self,
        tokenizer,
        tools=None,
        environment_factory=None,
        options: AgentOptions | None = None,
        prompt_limit: int | None = None,
        eos_ids=None,
    ):
        if not tools and environment_factory is None:
            raise ValueError("an agent needs tools=[...] and/or environment_factory=...")
        self.tokenizer, self.options, self.prompt_limit = tokenizer, options or AgentOptions(), prompt_limit
        self.eos_ids = eos_token_ids(tokenizer, eos_ids)
        self.tools = make_tools(tools)
        self.environment_factory = environment_factory
        if environment_factory is not None:
            check_environment_factory(environment_factory)
        # A template that rewrites history (Qwen3's <think> handling) renders each turn's prompt;
        # whether it does may depend on the tools it renders: found once per set of tools.
        self._rewrites = {
            tuple(self.tools): check_agent_template(
                tokenizer, [t.schema for t in self.tools.values()] or None, self.options.model_name, self.eos_ids
            )
        }

    @property
    def has_environment_reward(self) -> bool:
        """Whether the environments have ``get_reward()``: an extra reward source (``environment``)."""
        factories = (
            self.environment_factory.values()
            if isinstance(self.environment_factory, dict)
            else [self.environment_factory]
            if self.environment_factory is not None
            else []
        )
        return any(callable(getattr(f, "get_reward", None)) for f in factories)

    def start(
        self, rows: list[dict], indices: list[int], group_size: int, name: str = "train_dataset"
    ) -> list[Episode]:
        """``group_size`` episodes per row of ``indices`` (rows ``g*G .. g*G+G-1`` share row ``g``)."""
        episodes = []
        for i in indices:
            for _ in range(group_size):
                env, tools, messages = None, dict(self.tools), _messages(rows[i]["prompt"])
                if self.environment_factory is not None:
                    env = new_environment(self.environment_factory, rows[i], i, name)
                    extra = reset_environment(env, rows[i], isinstance(self.environment_factory, dict), i, name)
                    tools.update(environment_tools(env))
                    if extra:
                        messages = _append_to_last_user(messages, extra)
                episode = start_episode(self.tokenizer, messages, tools, env, self._rewrites.get(tuple(tools)))
                self._rewrites[tuple(tools)] = episode.rewrites
                if self.prompt_limit is not None and len(episode.prompt_ids) > self.prompt_limit:
                    raise ValueError(
                        f"{name}: row index {i} (0-based): the prompt with the tools' schemas is "
                        f"{len(episode.prompt_ids)} tokens, longer than {self.prompt_limit} "
                        "(max_prompt_length, by default the model's positions minus max_new_tokens)"
                    )
                episodes.append(episode)
        return episodes

    def run(self, engine, episodes: list[Episode], sampling, seed=None, version: int = 0):
        """The episodes to their end (``run_episodes``; ``seed``: one per episode), as one ``Rollout``,
        and the episodes (filled in place). ``version`` changes nothing here: the engine was made
        ready for it by the caller."""
        return run_episodes(engine, self.tokenizer, episodes, sampling, self.options, seed, self.eos_ids), episodes

    def reward_sources(self) -> list:
        """``[environment_reward]`` when the environments have ``get_reward()``, else none."""
        return [environment_reward] if self.has_environment_reward else []


def agent_metrics(episodes: list[Episode]) -> dict:
    """``agent/turns_mean`` and ``agent/tool_calls_mean`` per episode, ``agent/tool_errors`` (calls
    that failed, timed out, named an unknown tool, or could not be parsed),
    ``agent/truncated_episodes`` (ended by the token budget) and ``agent/timed_out_episodes``
    (ended by a call that timed out: left unscored) as counts — over every process."""
    every = torch.ones(len(episodes), dtype=torch.bool)
    counts = lambda field: torch.tensor([float(getattr(e, field)) for e in episodes])  # noqa: E731
    return {
        "agent/turns_mean": distributed.global_mean(counts("turns"), every),
        "agent/tool_calls_mean": distributed.global_mean(counts("tool_calls"), every),
        "agent/tool_errors": distributed.reduce_sum(counts("tool_errors").sum()),
        "agent/truncated_episodes": distributed.reduce_sum(counts("truncated").sum()),
        "agent/timed_out_episodes": distributed.reduce_sum(counts("timed_out").sum()),
    }


def reward_inputs(episodes: list[Episode]) -> tuple[list[list[dict]], list]:
    """What reward functions receive for agent episodes (as TRL passes conversational data): each
    episode's conversation — its assistant and tool messages — as the completion, and its
    environment for ``environments=``: None without a factory, and None for an episode a tool call
    timed out in (that call may still be changing it: ``agents.calls``)."""
    return [e.messages for e in episodes], [None if e.timed_out else e.environment for e in episodes]


def scored(episodes: list[Episode]) -> torch.Tensor:
    """(B,) bool: the episodes that may be scored — all but those a tool call timed out in, whose
    outcome is undefined (``agents.calls``): they are unscored (``valid`` False), like a sample no
    reward function scored."""
    return torch.tensor([not e.timed_out for e in episodes], dtype=torch.bool)


def episode_lengths(episodes: list[Episode]) -> torch.Tensor:
    """(B,) each episode's ``length``: the tokens its budget counted (sampled tokens and tool
    suffixes; ``max_new_tokens`` for an episode the budget ended) — the length the overlong
    punishment reads, as it reads a single completion's."""
    return torch.tensor([e.length for e in episodes], dtype=torch.long)


def environment_reward(prompts, completions, environments=None, **columns) -> list[float | None]:
    """The reward source ``environment``: each episode's ``environment.get_reward()`` (None where
    the environment has none, so the sample is left to the other sources)."""
    return [
        float(env.get_reward()) if callable(getattr(env, "get_reward", None)) else None
        for env in environments or [None] * len(completions)
    ]


def _messages(prompt) -> list[dict]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else copy.deepcopy(list(prompt))


def _append_to_last_user(messages: list[dict], text: str) -> list[dict]:
    """``reset``'s string appended to the last user message (a new user message when none)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            m["content"] = f"{m['content']}{text}"
            return messages
    return messages + [{"role": "user", "content": text}]


def build_agent(
    tokenizer, tools, environment_factory, options: AgentOptions, prompt_limit: int | None, eos_ids=None
) -> Agent | None:
    """The run's ``Agent`` from ``RLTrainer``'s ``tools`` / ``environment_factory`` and the config's
    agent fields (``options``); None when neither is given (one completion per prompt, as before).
    ``eos_ids``: the policy's end ids (``eos_token_ids(tokenizer, policy)``)."""
    if not tools and environment_factory is None:
        return None
    return Agent(tokenizer, list(tools or []), environment_factory, options, prompt_limit, eos_ids)


def model_name(model) -> str:
    """How ``model`` (a directory, a Hub id or a model object) is named to the chat template checks."""
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        return str(model)
    return getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
