"""Phases 1–3 of the RL loop as one component: the ``Sampler`` turns a step into the batch to train on.

It owns what the sampling side needs and nothing of the update: the train rows and their token
ids, the data order (a seeded shuffle per epoch) and where it stands, the engine (HF generate or
vLLM) and, with ``tools`` / ``environment_factory``, the ``Agent`` whose episodes it runs, the
reward sources, the per-prompt sampling seeds, DAPO's dynamic-sampling rounds
(``rl.sampling.sample_batch``) and the choice of which steps' samples go to ``samples.jsonl``.

The loop calls one method, ``batch(step, version)``; the phases are public for tests and
notebooks (``sample_prompts``, ``generate``, ``score``). The same class serves three places:

- a synchronous process: ``RLTrainer`` holds a ``Sampler`` on its own policy;
- a generator rank (``rollout_workers``): ``rl.pipeline.run_generator`` drives a ``Sampler`` on the
  weights the trainers send, loaded into its policy by ``load_policy_weights`` — then made ready for
  the engine by the same ``engine_ready`` path as in a synchronous process;
- a trainer rank fed by generators: ``rl.pipeline.RemoteSampler``, a ``Sampler`` whose ``batch``
  receives the generators' batch (its own engine and rewards serve ``evaluate``).

Weights: ``version`` is the number of optimizer steps behind the policy the engine must sample
from. The HF engine generates with the policy itself; a vLLM engine is given the policy's weights
when its ``synced_version`` differs (``rollout.engines.engine_ready``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import distributed
from ..agents.agent import agent_metrics
from ..config.parts import ConfigFields, takes
from ..rewards.calling import TrainingState
from ..rollout import Rollout, SamplingParams
from ..rollout.base import row_seeds, sampling_seed
from ..rollout.engines import engine_ready
from ..run.training import epoch_order, timer
from . import sampling, score
from .advantages import ScoreShaping
from .evaluate import run_evaluation


class Batch(NamedTuple):
    """What phases 1–3 give the update: this process's prompt ``rows`` (indices into the train rows),
    their ``rollout`` (``group_size`` completions each), the shaped ``scores`` (B,), which samples
    were scored (``valid``), the ``reward/*``, ``agent/*`` and ``rollout/*`` ``metrics`` (and what
    the reward functions passed to ``log_metric``), and ``samples``: the ``(prompts, completions, raw
    scores, extra columns)`` this step logs to ``samples.jsonl`` (``run.metrics.write_samples``; the
    extra columns: the functions' ``log_extra``), or None."""

    rows: list[int]
    rollout: Rollout
    scores: torch.Tensor
    valid: torch.Tensor
    metrics: dict
    samples: tuple | None = None


@takes(
    "seed",
    "prompts_per_step",
    "drop_last",
    "group_size",
    "dynamic_sampling",
    "max_sampling_rounds",
    "max_steps",
    "num_logged_samples",
)
class SamplerConfig(ConfigFields):
    """The fields of ``RLConfig`` the Sampler reads besides the score shaping (``ScoreShaping``)
    and the sampling parameters (``SamplingParams``); same names, same meaning."""


class Sampler:
    """Phases 1–3 for one process (see the module docstring).

    ``rows``: the train rows (dicts with a ``prompt``); ``prompt_ids``: their token ids;
    ``models``: ``RLModels`` (the policy the HF engine samples and whose weights a vLLM engine
    receives; its tokenizer decodes); ``engine``: a ``RolloutEngine``; ``rewards``:
    ``RewardFunctions``; ``agent``: an ``agents.source.EpisodeSource`` or None; ``config``, ``shaping``, ``sampling``:
    the parts of the run's config it reads."""

    def __init__(
        self,
        config: SamplerConfig,
        shaping: ScoreShaping,
        sampling: SamplingParams,
        rows: list[dict],
        prompt_ids: list[list[int]],
        models,
        engine,
        rewards,
        agent=None,
    ):
        self.config, self.shaping, self.sampling = config, shaping, sampling
        self.rows, self.prompt_ids = rows, prompt_ids
        self.models, self.tokenizer, self.engine, self.rewards, self.agent = (
            models,
            models.tokenizer,
            engine,
            rewards,
            agent,
        )
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.steps_done = 0  # the step an evaluation's reward functions are told (trainer_state.global_step)
        # trainer_state's steps per RL step: 1 (rlhfkit counts RL steps); TRL's drop-in trainers count
        # optimizer steps (rlhfkit.trl sets num_iterations x steps_per_generation / accumulation).
        self.state_steps_per_step = 1
        self.restore((0, 0))

    # ---------------------------------------------------------------- what the loop calls
    def batch(self, step: int, version: int, timings: dict | None = None) -> Batch:
        """Phases 1–3 of ``step`` with the policy of ``version`` (optimizer steps so far): one round
        of ``sample_prompts``, ``generate`` and ``score`` — or, with ``dynamic_sampling``, rounds
        until ``prompts_per_step`` groups with reward variance are kept (at most
        ``max_sampling_rounds``; each round consumes the next prompts of the data order). The
        rounds' times add up in ``timings`` (``generate``, ``reward``, ``weight_sync``)."""
        timings = {} if timings is None else timings
        logged: list = []  # the first round's samples, on the steps that log some
        state = self.training_state(step)

        def one_round(r: int) -> tuple:
            rows = self.sample_prompts()  # 1
            with timer(timings, "generate"):
                rollout, episodes = self.generate(rows, step, r, version, timings)  # 2
            self.engine.sleep()  # a vLLM engine with vllm_sleep frees its memory for the update
            with timer(timings, "reward"):
                scores, valid, metrics, completions, raw, extra = self._score(rows, rollout, episodes, state)  # 3
            if r == 0 and self.logs_samples(step):
                G = self.config.group_size
                logged.append(([self.rows[i]["prompt"] for i in rows for _ in range(G)], completions, raw, extra))
            return rows, rollout, scores, valid, metrics

        rows, rollout, scores, valid, metrics = sampling.sample_batch(one_round, self.config, self.shaping, self.pad_id)
        self.steps_done = step + 1
        return Batch(rows, rollout, scores, valid, metrics, logged[0] if logged else None)

    def position(self) -> tuple[int, int]:
        """Where the data order stands: ``(data_epoch, data_pos)`` (checkpointed by the trainer)."""
        return self.data_epoch, self.data_pos

    def restore(self, position: tuple[int, int]) -> None:
        """Continue the data order from ``position`` (``(data_epoch, data_pos)``, as ``position`` gives it)."""
        self.data_epoch, self.data_pos = position
        self.order = epoch_order(self.config.seed, self.data_epoch, len(self.rows))

    def start(self, counters: dict) -> None:
        """Before the first step (``counters``: the run's step and position): the step is noted (a
        resumed run's evaluation tells it to the reward functions); the generators' end
        (``RemoteSampler``) starts them."""
        self.steps_done = counters["step"]

    def publish(self, version: int, timings: dict) -> None:
        """After the update that made ``version``: nothing to do here (the engine receives the new
        weights when it next generates); the generators' end sends them."""

    # ---------------------------------------------------------------- the phases
    def sample_prompts(self) -> list[int]:
        """Phase 1: this process's share of the next ``prompts_per_step`` prompts of a seeded
        per-epoch shuffle (every process of the role walks the same order; process r takes the r-th
        slice). With ``drop_last`` a step never spans two epochs: an epoch's last prompts that do not
        fill a step are skipped. Returns their indices in the train rows."""
        rows: list[int] = []
        n = self.config.prompts_per_step
        if self.config.drop_last and self.data_pos + n > len(self.order) and n <= len(self.order):
            self.restore((self.data_epoch + 1, 0))
        while len(rows) < n:
            if self.data_pos >= len(self.order):
                self.restore((self.data_epoch + 1, 0))
            rows.append(self.order[self.data_pos])
            self.data_pos += 1
        share = len(rows) // distributed.role_size()
        me = distributed.role_rank()
        return rows[me * share : (me + 1) * share]

    def generate(
        self, rows: list[int], step: int = 0, sampling_round: int = 0, version: int = 0, timings: dict | None = None
    ) -> tuple[Rollout, list | None]:
        """Phase 2: ``group_size`` completions of each prompt of ``rows`` from the engine, made ready
        for the policy of ``version`` first (``engine_ready``), with the per-prompt seeds of
        (``step``, ``sampling_round``) (``sampling_seeds``). With an agent (an
        ``agents.source.EpisodeSource``: tools and environments, or an agent program against the
        policy's endpoint) each row is an episode it runs. Returns the rollout and, with an agent,
        its episodes (one per row of the rollout; ``score`` reads them), else None."""
        G = self.config.group_size
        with engine_ready(self.engine, self.models, version, {} if timings is None else timings):
            seeds = self.sampling_seeds(step, sampling_round, len(rows))
            if self.agent is None:
                return self.engine.generate([self.prompt_ids[i] for i in rows], G, self.sampling, seed=seeds), None
            episodes = self.agent.start(self.rows, rows, G)
            return self.agent.run(self.engine, episodes, self.sampling, row_seeds(seeds, len(rows), G), version)

    def score(self, rows: list[int], rollout: Rollout, episodes: list | None = None):
        """Phase 3 (``rl.score.score``): the rollout's scores after the EOS trick, the overlong
        punishment and clipping, which samples were scored (``valid``) and the ``reward/*`` (and,
        for agent ``episodes``, ``agent/*``) metrics. Returns ``(scores, valid, metrics)``."""
        return self._score(rows, rollout, episodes, self.training_state(self.steps_done))[:3]

    def training_state(self, step: int) -> TrainingState:
        """What the reward functions are told of the run (``trainer_state=``) at ``step`` (steps
        done): the step, ``max_steps``, the data epochs done (fractional) and this process's place."""
        epoch = self.data_epoch + self.data_pos / max(1, len(self.order))
        k = self.state_steps_per_step
        return TrainingState(
            step * k, self.config.max_steps * k, epoch, distributed.is_main(), distributed.local_rank() == 0
        )

    def sampling_seeds(self, step: int, sampling_round: int, count: int) -> list[int]:
        """The sampling seed of each of this process's ``count`` prompts: fixed by (seed, step,
        sampling round, the prompt's place among the step's prompts), never by which process samples
        it — one process, N processes and generator ranks sample the same tokens for the same prompt
        and weights, and a resumed run samples what the uninterrupted one did."""
        first = distributed.role_rank() * count  # process r holds the r-th slice (``sample_prompts``)
        return [sampling_seed(self.config.seed, step, sampling_round, first + i) for i in range(count)]

    def logs_samples(self, step: int) -> bool:
        """Whether ``step`` (0-based) writes samples to ``samples.jsonl``: the first, the last and
        about ten evenly spaced between."""
        every, last = max(1, self.config.max_steps // 10), self.config.max_steps
        return (step + 1) % every == 0 or step == 0 or step + 1 == last

    def evaluate(self, rows: list[dict], prompt_ids: list[list[int]], sampling: SamplingParams, version: int) -> dict:
        """Greedy ``sampling`` of ``rows`` (one completion each; agent episodes with tools) by the
        policy of ``version``, scored by the training reward sources: ``eval/*`` metrics."""
        with engine_ready(self.engine, self.models, version, {}):
            result = run_evaluation(
                self.models.policy,
                None,
                self.tokenizer,
                self.rewards,
                rows,
                prompt_ids,
                1,
                sampling,
                batch_size=64,
                engine=self.engine,
                agent=self.agent,
                trainer_state=self.training_state(self.steps_done),
                version=version,
            )
        self.engine.sleep()
        return result["metrics"]

    def sample_rows(
        self,
        rows: list[dict],
        prompt_ids: list[list[int]],
        group_size: int,
        sampling: SamplingParams,
        seed_key: tuple,
        version: int,
    ) -> Batch:
        """Phases 2–3 on ``rows`` outside the train order (a held-out set sampled as training samples,
        TRL's evaluation): ``group_size`` completions of each prompt (``prompt_ids``; agent episodes
        with tools) drawn with ``sampling`` and per-prompt seeds fixed by ``seed_key`` (ints), by
        the policy of ``version``, scored and shaped as training scores them. Its ``rows`` are
        ``0 .. len(rows) - 1``; no samples are logged."""
        seeds = [sampling_seed(self.config.seed, *seed_key, i) for i in range(len(rows))]
        with engine_ready(self.engine, self.models, version, {}):
            if self.agent is None:
                rollout, episodes = self.engine.generate(prompt_ids, group_size, sampling, seed=seeds), None
            else:
                episodes = self.agent.start(rows, range(len(rows)), group_size)
                rollout, episodes = self.agent.run(
                    self.engine, episodes, sampling, row_seeds(seeds, len(rows), group_size), version
                )
        self.engine.sleep()
        state = self.training_state(self.steps_done)
        out = score.score(rows, rollout, self.rewards, self.tokenizer, group_size, self.shaping, episodes, state)
        if episodes is not None:
            out[2].update(agent_metrics(episodes))
        return Batch(list(range(len(rows))), rollout, out[0], out[1], out[2])

    def _score(self, rows: list[int], rollout: Rollout, episodes: list | None, state: TrainingState):
        data = [self.rows[i] for i in rows]
        out = score.score(
            data, rollout, self.rewards, self.tokenizer, self.config.group_size, self.shaping, episodes, state
        )
        if episodes is not None:
            out[2].update(agent_metrics(episodes))
        return out


__all__ = ["Batch", "Sampler", "SamplerConfig"]
