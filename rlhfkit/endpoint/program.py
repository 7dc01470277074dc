"""A user's agent program as the rollout: ``RLTrainer(agent_program=fn)``.

``fn(client, row)`` runs one episode of the dataset ``row`` with a ready ``openai.OpenAI``
``client`` whose base URL is the episode's own path on the trainer's endpoint
(``/episodes/<id>/v1``: how each request is known to belong to it) and returns the episode's
reward (a number) or None (the reward functions then score the recorded conversation).

``ProgramAgent`` is an ``agents.source.EpisodeSource``, as ``agents.agent.Agent`` is: ``run``
starts the endpoint (once; ``close`` stops it), opens each episode with the engine, sampling and
weights version it is given (``Endpoint.new_episode``: its requests are served with them), runs
``group_size`` episodes per prompt on threads, and serves their requests on the caller's thread
(``Endpoint.serve``) until
every program has returned or its time limit (``AgentProgram.timeout``) has passed — an episode
past it is refused further requests and left unscored, as an episode whose tool call timed out; so
is an episode whose program raised, or returned (a reward or None) without calling the model.
The episodes' training rows come from the recorded ids (``record.episode_from_calls``,
``agents.rows.episodes_rollout``). Its reward source (``reward_sources``) is ``agent_program``: each
episode's returned reward, read from ``environments=`` (the episode's ``ProgramResult``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..agents import episodes_rollout
from ..agents.episode import Episode
from ..agents.source import EpisodeSource
from ..rollout.base import row_seeds
from .record import Serving, empty_episode, episode_from_calls
from .server import Endpoint

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class AgentProgram:
    """``fn(client, row) -> float | None`` with its time limit per episode, in seconds."""

    fn: Callable
    timeout: float = 300.0


@dataclass
class ProgramResult:
    """What an episode's program gave: its ``reward`` (None: left to the reward functions) or the
    ``error`` it raised; the episode's ``environments=`` entry for the reward functions."""

    reward: float | None = None
    error: str | None = None

    def get_reward(self):
        return self.reward


def agent_program(prompts, completions, environments=None, **columns) -> list[float | None]:
    """The reward source of ``RLTrainer(agent_program=...)``: each episode's returned reward."""
    return [e.reward if isinstance(e, ProgramResult) else None for e in environments or [None] * len(completions)]


class ProgramAgent(EpisodeSource):
    """The ``EpisodeSource`` of an agent program (module docstring)."""

    def __init__(self, program, tokenizer, models=None, model_name: str = "policy"):
        self.program = program if isinstance(program, AgentProgram) else AgentProgram(program)
        if not callable(self.program.fn):
            raise ValueError(f"agent_program must be callable fn(client, row), got {type(self.program.fn).__name__}")
        self.tokenizer, self.models, self.model_name = tokenizer, models, model_name
        self.endpoint: Endpoint | None = None
        # A batch closes once every running episode has a request waiting, or this long after its first
        # request: the time an episode may spend between two calls (its tools) and still join the batch.
        self.window = 0.2
        self._http: httpx.Client | None = None

    def start(self, rows: list[dict], indices, group_size: int, name: str = "train_dataset") -> list[Episode]:
        """``group_size`` episodes per row of ``indices``, to be filled by ``run``."""
        episodes = []
        for i in indices:
            for _ in range(group_size):
                prompt = rows[i]["prompt"]
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                episodes.append(empty_episode(self.tokenizer, messages, rows[i]))
        return episodes

    def run(self, engine, episodes: list[Episode], sampling, seed=None, version: int = 0):
        """Run the programs of ``episodes`` against the endpoint, their requests served by
        ``engine`` with ``sampling`` (the policy of ``version``), and return their ``Rollout`` and
        the recorded episodes (new ones, in the same order)."""
        import openai

        endpoint = self._endpoint(engine, sampling)
        seeds: list[int] | list[None] = row_seeds(seed, len(episodes), 1) or [None] * len(episodes)
        serving = Serving(engine, sampling, version)
        records = [endpoint.new_episode(s, sampling.max_new_tokens, serving) for s in seeds]
        timeout = self.program.timeout

        def one(k: int):
            client = openai.OpenAI(
                base_url=endpoint.episode_url(records[k].id),
                api_key="rlhfkit",
                max_retries=0,
                timeout=timeout,
                # openai 3's stubs name httpx2.Client; it takes an httpx.Client as well (is_legacy_httpx_sync_client)
                http_client=self._http,  # type: ignore[arg-type]
            )
            try:
                return ProgramResult(_reward(self.program.fn(client, episodes[k].row)))
            finally:
                records[k].closed = records[k].closed or "its program returned"

        pool = ThreadPoolExecutor(max_workers=len(episodes), thread_name_prefix="agent-program")
        deadline = time.monotonic() + timeout
        try:
            futures = [pool.submit(one, k) for k in range(len(episodes))]
            endpoint.serve(
                until=lambda: all(f.done() for f in futures) or time.monotonic() > deadline,
                expected=lambda: sum(not f.done() for f in futures),
            )
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        episodes, errors, uncalled = self._recorded(episodes, records, futures, sampling.max_new_tokens)
        for r in records:
            endpoint.episodes.pop(r.id, None)
        if errors and len(errors) == len(episodes):
            raise RuntimeError(f"agent_program raised in every episode; the first: {errors[0]}")
        if errors:
            warnings.warn(
                f"agent_program raised in {len(errors)} of {len(episodes)} episodes (left unscored); the "
                f"first: {errors[0]}",
                stacklevel=2,
            )
        if uncalled:
            warnings.warn(
                f"agent_program returned without calling the model in {uncalled} of {len(episodes)} "
                "episodes (left unscored: nothing was sampled, its reward is ignored)",
                stacklevel=2,
            )
        with_logprobs = all(c.logprobs is not None for r in records for c in r.calls)
        return episodes_rollout(episodes, self.tokenizer.pad_token_id, with_logprobs), episodes

    def reward_sources(self) -> list:
        """``[agent_program]``: each episode's returned reward."""
        return [agent_program]

    def _recorded(self, episodes, records, futures, budget: int) -> tuple[list[Episode], list[str], int]:
        """Each episode built from its recorded calls, with its ``ProgramResult`` as its environment;
        an episode whose program raised, ran past its time limit or returned without calling the
        model (no sampled token: the started ``record.empty_episode``) is unscored — its reward
        ignored. Returns the episodes, the programs' errors and the count of episodes that returned
        without a call."""
        done: list[Episode] = []
        errors: list[str] = []
        uncalled = 0
        for e, record, future in zip(episodes, records, futures):
            with record.lock:
                record.closed = record.closed or f"past its time limit ({self.program.timeout} s)"
                calls = list(record.calls)
            result = ProgramResult(error="time limit")
            if future.done():
                try:
                    result = future.result()
                except Exception as err:  # noqa: BLE001 — the program's own error
                    error = f"{type(err).__name__}: {' '.join(str(err).split())}"
                    result = ProgramResult(error=error)
                    errors.append(error)
            if calls:
                e = episode_from_calls(calls, self.tokenizer, budget, record.truncated, e.row)
            elif result.error is None:  # returned without a call: a reward for no sampled token is ignored
                result, uncalled = ProgramResult(error="no model call"), uncalled + 1
            e.environment = result
            e.timed_out = result.error is not None  # unscored (``agents.agent.scored``), like a timed-out tool call
            done.append(e)
        return done, errors, uncalled

    def _endpoint(self, engine, sampling) -> Endpoint:
        if self.endpoint is None:
            import httpx

            policy = getattr(self.models, "policy", None)
            positions = getattr(getattr(policy, "config", None), "max_position_embeddings", None)
            self.endpoint = Endpoint(  # requests outside an episode: the first run's engine and sampling
                engine,
                self.tokenizer,
                sampling,
                self.model_name,
                training=True,
                logprob_model=policy,
                lm_head=getattr(getattr(self.models, "args", None), "lm_head", "chunked"),  # as the trainer's passes
                max_positions=positions,
                request_timeout=self.program.timeout,
                window=self.window,
            ).start()
            self._http = httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
        return self.endpoint

    def close(self) -> None:
        """Stop the endpoint (the trainer calls it when training ends)."""
        if self.endpoint is not None:
            self.endpoint.stop()
            self.endpoint = None
        if self._http is not None:
            self._http.close()
            self._http = None


def _reward(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"agent_program must return a number or None, got {type(value).__name__}")
    return float(value)


def program_agent(program, agent, tokenizer, models, model_name: str) -> ProgramAgent:
    """The trainer's ``ProgramAgent`` for ``RLTrainer(agent_program=...)``; refused in one line
    beside ``tools`` / ``environment_factory`` (the program calls its own tools)."""
    if agent is not None:
        raise ValueError("agent_program runs its own tools: give it without tools= / environment_factory=")
    return ProgramAgent(program, tokenizer, models, model_name)
