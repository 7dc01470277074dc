"""The one RL loop for every algorithm (docs/architecture.md, "The RL loop").

Each step reads like the paper pseudocode: 1. sample prompts; 2. generate G completions each;
3. score them; 4. old / reference log-probs and values; 5. token rewards and advantages through the
registries; 6. K passes of minibatch updates; 7. log and checkpoint. Algorithms differ only by
their config preset (``config.PRESETS``) — there is no ``if algorithm == ...`` below.

The trainer holds the loop, its state (data order, step, β, the run) and the engine; the phases
are public methods (``sample_prompts``, ``generate``, ``score`` — run in rounds by ``sample_batch``
under dynamic sampling — ``make_experience``, ``update``) that delegate to the functions of
``rlhfkit/rl/`` (sampling, score, experience, update), whose formulas are
in ``rlhfkit/algorithms/``. The models are ``models.rl_models.RLModels``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .. import distributed
from ..algorithms import AdaptiveKLController, FixedKLController
from ..config import RLConfig
from ..data import load_prompt_dataset
from ..agents.agent import agent_metrics, build_agent, environment_reward
from ..data.chat_templates import use_chat_template
from ..data.encode import prompt_limit, tokenize_prompts
from ..models.rl_models import build_models
from ..rewards.sources import build_rewards
from ..rl import experience, sampling, score, update
from ..rl.advantages import rollout_metrics
from ..rl.evaluate import run_evaluation
from ..rl.experience import Experience
from ..rl.pipeline import TrainerLink, run_generator
from ..rollout import Rollout, SamplingParams
from ..rollout.base import row_seeds, sampling_seed
from ..rollout.engines import build_engine, engine_ready
from ..run.lifecycle import Run
from ..run.metrics import write_samples
from ..run.training import epoch_order, seed_everything, timer


class RLTrainer:
    """``RLTrainer(model=..., reward_funcs=[...], args=RLConfig(algorithm="grpo"), train_dataset=...).train()``

    ``model``: a local HF directory or a causal-LM object; ``processing_class``: its tokenizer
    (loaded from the directory when omitted); ``reward_funcs``: callables of TRL's shape, names of
    registered functions, or reward-model directories; ``train_dataset``: a ``datasets.Dataset``,
    a list of dicts or a JSONL path with a ``prompt`` column (text or chat messages);
    ``peft_config``: a ``peft`` config to train a LoRA adapter (the reference is then the base model
    with the adapter disabled — no second copy); ``eval_dataset``: held-out prompts (same format)
    greedily evaluated before the first step, every ``eval_every`` steps and after the last.

    Agents (TRL's interface): ``tools``: typed, documented Python functions the model may call;
    ``environment_factory``: a class (or ``{name: class}`` chosen by an ``environment`` column)
    instantiated per episode, ``reset(**row)`` first, its public methods as tools, its optional
    ``get_reward()`` an extra reward source. Episodes run token in, token out
    (``rlhfkit.agents``); the loss sees only the tokens the policy sampled.

    ``callbacks``: ``transformers.TrainerCallback`` objects (``rlhfkit/run/callbacks.py``); one that
    sets ``control.should_training_stop`` ends the run after that step, evaluated and saved as a
    last step (not with ``rollout_workers``).
    """

    sampling_round = 0  # the round of dynamic sampling being generated (``_sampling_seeds``)

    def __init__(self, model, reward_funcs, args: RLConfig | None = None, train_dataset=None,
                 processing_class=None, reward_weights=None, peft_config=None, ref_model=None, eval_dataset=None,
                 tools=None, environment_factory=None, callbacks=None):
        args = args or RLConfig()
        if train_dataset is None:
            raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a JSONL path)")
        train_rows = load_prompt_dataset(train_dataset)  # data errors before any model is loaded
        self.eval_rows = (load_prompt_dataset(eval_dataset, name="eval dataset", train_rows=train_rows)
                          if eval_dataset is not None else None)
        if reward_funcs is None:
            raise ValueError("reward_funcs is required: reward functions and/or reward-model directories")
        reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if args.rollout_engine == "vllm":
            from ..rollout.vllm import import_vllm

            import_vllm()  # not installed: one line now, before any model loads
        if callbacks and args.rollout_workers:
            raise ValueError("callbacks are not supported with rollout_workers (a generator rank cannot end the run "
                             "early)")
        args.check_processes(distributed.planned_world())
        self.run = Run(args, callbacks=callbacks)  # the run lifecycle; nothing is written before everything has loaded
        self.args = args = self.run.args
        self.out_dir = self.run.out_dir
        seed_everything(args.seed)  # the same initial weights (critic and value heads too) on every process
        self.models = build_models(model, processing_class, args, peft_config, ref_model)
        if distributed.world() > 1:  # then each process samples its own completions
            seed_everything(args.seed + 1_000_003 * distributed.rank())
        self.tokenizer = self.models.tokenizer
        use_chat_template(self.tokenizer, args.chat_template)
        limit = prompt_limit(args.max_prompt_length, args.max_new_tokens, self.models.policy.config)
        self.agent, self.episodes = build_agent(self.tokenizer, tools, environment_factory, args, model, limit), None
        sources, weights = reward_funcs, reward_weights
        if self.agent is not None and self.agent.has_environment_reward:  # get_reward(): one more source
            sources, weights = sources + [environment_reward], list(weights) + [1.0] if weights is not None else None
        self.rewards = build_rewards(sources, weights, self.tokenizer, self.models.device)
        cut = args.truncate_prompts
        self.rows, self.prompt_ids = train_rows, tokenize_prompts(train_rows, self.tokenizer, limit, cut)
        self.eval_prompt_ids = (tokenize_prompts(self.eval_rows, self.tokenizer, limit, cut, "eval_dataset")
                                if self.eval_rows is not None else None)
        # An agent's prompts carry the tools' schemas and environments' text: size the engine for the longest allowed.
        longest = [[0] * limit] if self.agent is not None and limit else []
        self.engine = build_engine(args, self.models, self.prompt_ids + (self.eval_prompt_ids or []) + longest)
        self.run.open(model, {"train_dataset": (train_dataset, train_rows), "eval_dataset": (eval_dataset, self.eval_rows)},
                      reward_funcs=reward_funcs, reward_weights=reward_weights, ref_model=ref_model, peft_config=peft_config,
                      tools=tools, environment_factory=environment_factory)
        self.weights_version = 0  # optimizer steps taken: a vLLM engine syncs when it holds an older version
        self.sampling = SamplingParams.from_config(args)
        self.kl_ctl = (AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon) if args.adaptive_kl
                       else FixedKLController(args.kl_coef))
        self.step, self.data_epoch, self.data_pos = 0, 0, 0
        self.order = self._epoch_order(0)
        self.samples = None  # this step's samples.jsonl lines (a generator rank sends them to rank 0)
        # rollout_workers: a generator rank only runs phases 1-3 (rl.pipeline.run_generator); no optimizer.
        self.link = TrainerLink(args, self.tokenizer.pad_token_id or 0) if args.rollout_workers else None
        if distributed.is_generator():
            return
        mini = args.mini_batch_size or args.batch_size  # the schedule counts optimizer steps: K passes x minibatches
        counters = self.run.start(self._modules(), args.max_steps, param_groups=self._param_groups(),
                                  schedule_steps=max(1, args.max_steps * args.num_iterations * math.ceil(args.batch_size / mini)))
        if counters is not None:
            self._restore(counters)

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict]:
        """The loop, until ``max_steps``: each step samples prompts, generates, scores, makes the
        experience and updates the policy (and critic), then logs, evaluates and checkpoints."""
        if distributed.is_generator():  # rollout_workers: this rank generates the batches, phases 1-3
            run_generator(self)
            distributed.finished()
            return []
        if self.link is not None:
            self.link.start(self._counters(), self.models)  # the generators start on the first batches
        if self.eval_rows is not None and self.step == 0:
            self.run.log(0, self.evaluate())
        while self.step < self.args.max_steps:
            timings: dict[str, float] = {}
            self.run.step_begin()
            rows, rollout, scores, valid, metrics = self.next_batch(timings)       # 1, 2, 3
            with timer(timings, "logprobs"):
                exp = self.make_experience(rollout, scores, valid, metrics)         # 4, 5
            with timer(timings, "update"):
                if bool(distributed.reduce_sum(exp.mask.sum()) > 0):  # nothing scored anywhere: no step
                    metrics.update(self.update(exp))                                # 6
            self.step += 1
            if self.link is not None:  # the generators go on with the new weights
                with timer(timings, "weight_sync"):
                    self.link.publish(self.step, self.models)
            stop = self.run.step_end(self.step)  # a callback's should_training_stop: this step is the last
            if self._eval_due(last=stop):
                metrics.update(self.evaluate())
            self._log(metrics, exp, timings)                                        # 7
            self.run.step_done(self.step, self._counters)                           # checkpoint
            if stop:
                break
        return self.run.finish(self.save_model)  # final/, plots, trackers closed

    # ---------------------------------------------------------------- the phases (rlhfkit/rl/)
    def next_batch(self, timings: dict) -> tuple:
        """Phases 1–3 of this step: ``sample_batch`` here, or, with ``rollout_workers``, this
        trainer's share of the batch the generator ranks made (``rl.pipeline.TrainerLink``)."""
        if self.link is None:
            return self.sample_batch(timings)
        batch, position, samples = self.link.receive(self.step, timings)
        self.restore_position({"data_epoch": position[0], "data_pos": position[1]})
        if samples is not None:
            write_samples(self.out_dir, self.step + 1, *samples, self.args.num_logged_samples)
        return batch

    def sample_batch(self, timings: dict | None = None):
        """Phases 1–3 (``rl.sampling.sample_batch``): one round of ``sample_prompts``, ``generate``
        and ``score`` — or, with ``dynamic_sampling``, rounds until ``prompts_per_step`` groups with
        reward variance are kept (at most ``max_sampling_rounds``; each round consumes the next
        prompts of the data order). Returns ``(rows, rollout, scores, valid, metrics)`` of the
        batch to train on; the rounds' times add up in ``timings``."""
        timings = {} if timings is None else timings
        try:
            return sampling.sample_batch(lambda r: self._sampling_round(r, timings), self.args,
                                         self.tokenizer.pad_token_id or 0)
        finally:
            self.sampling_round = 0

    def _sampling_round(self, r: int, timings: dict):
        self.sampling_round = r  # in the sampling seeds of this round
        rows = self.sample_prompts()                                           # 1
        with timer(timings, "generate"):
            rollout = self.generate(rows, timings)                              # 2
        self.engine.sleep()  # a vLLM engine with vllm_sleep frees its memory for the update
        with timer(timings, "reward"):
            scores, valid, metrics = self.score(rows, rollout)                  # 3
        return rows, rollout, scores, valid, metrics

    def sample_prompts(self) -> list[int]:
        """Phase 1: this process's share of the next ``prompts_per_step`` prompts of a seeded
        per-epoch shuffle (every process walks the same order; process r takes the r-th slice).
        Returns their indices in the train rows."""
        rows = []
        while len(rows) < self.args.prompts_per_step:
            if self.data_pos >= len(self.order):
                self.data_epoch, self.data_pos = self.data_epoch + 1, 0
                self.order = self._epoch_order(self.data_epoch)
            rows.append(self.order[self.data_pos])
            self.data_pos += 1
        share = len(rows) // distributed.world()
        return rows[distributed.rank() * share:(distributed.rank() + 1) * share]

    def generate(self, rows: list[int], timings: dict | None = None) -> Rollout:
        """Phase 2: ``group_size`` completions of each prompt of ``rows`` from the engine, made ready
        to generate from the current policy first (``rollout.engines.engine_ready``: a vLLM engine
        receives the weights, timed as ``timings["weight_sync"]``), with its per-prompt seeds (``_sampling_seeds``)."""
        with self._engine_ready({} if timings is None else timings):
            seeds = self._sampling_seeds(len(rows))
            if self.agent is not None:  # multi-turn episodes: kept for the score phase and the metrics
                self.episodes = self.agent.start(self.rows, rows, self.args.group_size)
                return self.agent.run(self.engine, self.episodes, self.sampling,
                                      seed=row_seeds(seeds, len(rows), self.args.group_size))
            return self.engine.generate([self.prompt_ids[i] for i in rows], self.args.group_size, self.sampling,
                                        seed=seeds)

    def score(self, rows: list[int], rollout: Rollout):
        """Phase 3 (``rl.score.score``): the rollout's scores after the EOS trick, clipping and
        normalisation, which samples were scored (``valid``) and the ``reward/*`` metrics; some
        steps' samples also go to ``samples.jsonl`` (under dynamic sampling, the first round's)."""
        data = [self.rows[i] for i in rows]
        episodes = self.episodes if self.agent is not None else None
        scores, valid, metrics, completions, raw = score.score(data, rollout, self.rewards, self.tokenizer, self.args,
                                                               episodes)
        if episodes is not None:
            metrics.update(agent_metrics(episodes))
        if self._sample_step() and self.sampling_round == 0:  # one round's samples per step
            self.samples = ([d["prompt"] for d in data for _ in range(self.args.group_size)], completions, raw)
            write_samples(self.out_dir, self.step + 1, *self.samples, self.args.num_logged_samples)
        return scores, valid, metrics

    def make_experience(self, rollout: Rollout, scores, valid, metrics: dict) -> Experience:
        """Phases 4–5 (``rl.experience.make_experience``): old / reference log-probs and values,
        token rewards and advantages, with this step's β."""
        return experience.make_experience(self.models, self.args, rollout, scores, valid, self.kl_ctl.value, metrics)

    def update(self, exp: Experience) -> dict:
        """Phase 6 (``rl.update.update``): K passes of minibatch updates, each closed by
        ``optimizer_step``; returns the update's metrics."""
        return update.update(self.models, self.args, exp, self.kl_ctl.value, self.step, self.optimizer_step)

    def optimizer_step(self) -> dict:
        """One optimizer step of the run (a non-finite gradient norm is skipped: ``NonFiniteGuard``);
        the engine's weights are then out of date."""
        grad_norm = self.run.optimizer_step()["perf/grad_norm"]
        self.weights_version += 1  # a skipped step changes nothing, but the engine resyncs: harmless
        return {"perf/grad_norm": grad_norm}

    def evaluate(self) -> dict:
        """Greedy completions of the eval prompts scored by the training reward sources:
        ``eval/<source>_mean``, ``eval/score_mean``, length and truncation (as ``rlhfkit eval``);
        with tools or an environment factory, greedy agent episodes (``eval/turns_mean``,
        ``eval/tool_calls_mean``)."""
        if self.eval_rows is None:
            raise ValueError("evaluate() needs an eval_dataset")
        args = self.args
        sampling = SamplingParams.from_config(args, max_new_tokens=args.eval_max_new_tokens or args.max_new_tokens,
                                              greedy=True)
        # Every process evaluates the whole set with the current weights (greedy: the same numbers).
        with self._engine_ready({}):
            result = run_evaluation(self.models.policy, None, self.tokenizer, self.rewards, self.eval_rows,
                                    self.eval_prompt_ids, 1, sampling, batch_size=64, engine=self.engine, agent=self.agent)
        self.engine.sleep()
        return result["metrics"]

    def _engine_ready(self, timings: dict):
        return engine_ready(self.engine, self.models, self.weights_version, timings)

    def _sampling_seeds(self, count: int) -> list[int]:
        """The sampling seed of each of this process's ``count`` prompts: fixed by (seed, step,
        sampling round, the prompt's place among the step's prompts), never by which process samples
        it — one process, N processes and generator ranks sample the same tokens for the same prompt
        and weights, and a resumed run samples what the uninterrupted one did."""
        first = distributed.rank() * count  # process r holds the r-th slice (``sample_prompts``)
        return [sampling_seed(self.args.seed, self.step, self.sampling_round, first + i) for i in range(count)]

    def _eval_due(self, last: bool = False) -> bool:
        every = self.args.eval_every
        last = last or self.step == self.args.max_steps
        return self.eval_rows is not None and (last or bool(every and self.step % every == 0))

    def _sample_step(self) -> bool:
        every = max(1, self.args.max_steps // 10)
        return (self.step + 1) % every == 0 or self.step == 0 or self.step + 1 == self.args.max_steps

    # ---------------------------------------------------------------- set-up and bookkeeping
    def _param_groups(self) -> list[dict]:
        """AdamW's groups: the policy at ``learning_rate``, a critic at ``critic_learning_rate``."""
        args = self.args
        groups = [{"params": [p for p in self.models.policy.parameters() if p.requires_grad], "lr": args.learning_rate}]
        if self.models.critic_module is not None:
            groups.append({"params": [p for p in self.models.critic_module.parameters() if p.requires_grad],
                           "lr": args.critic_learning_rate or args.learning_rate})
        return groups

    def _epoch_order(self, epoch: int) -> list[int]:
        return epoch_order(self.args.seed, epoch, len(self.rows))

    def _log(self, metrics: dict, exp: Experience, timings: dict) -> None:
        """Global metrics (every process computes the same row); rank 0 writes and prints it."""
        tokens = distributed.reduce_sum(exp.rollout.response_mask.sum().float())
        metrics.update({
            **rollout_metrics(exp.rollout), "kl/coef": self.kl_ctl.value, "perf/lr": self.run.scheduler.get_last_lr()[0],
            "perf/skipped_steps": float(self.run.guard.skipped),
            **{f"perf/time_{k}": v for k, v in timings.items()},
            "perf/tokens_per_s": float(tokens) / max(sum(timings.values()), 1e-9),
        })
        row = self.run.log(self.step, metrics)
        if "kl/k1" in row:  # KL per sequence drives the adaptive controller
            seq_kl = row["kl/k1"] * row["rollout/response_length_mean"]
            self.kl_ctl.update(seq_kl, self.args.batch_size)

    def _modules(self) -> dict[str, torch.nn.Module]:
        mods = {"policy": self.models.policy}
        if self.models.critic_module is not None:
            mods["critic"] = self.models.critic_module
        return mods

    def save_checkpoint(self, path: Path) -> None:
        """Every process calls this: DCP shards of the weights and optimizer, per-rank RNG, counters."""
        self.run.save_checkpoint(path, self._counters())

    def _counters(self) -> dict:
        return {"step": self.step, "data_epoch": self.data_epoch, "data_pos": self.data_pos, "kl_coef": self.kl_ctl.value}

    def position(self) -> tuple[int, int]:
        """Where the data order stands: ``(data_epoch, data_pos)``."""
        return self.data_epoch, self.data_pos

    def restore_position(self, counters: dict) -> None:
        """The step (when ``counters`` has one) and data position of ``counters``."""
        self.step = counters.get("step", self.step)
        self.data_epoch, self.data_pos = counters["data_epoch"], counters["data_pos"]
        self.order = self._epoch_order(self.data_epoch)

    def _restore(self, counters: dict) -> None:
        self.restore_position(counters)
        self.kl_ctl.value = counters["kl_coef"] if self.args.adaptive_kl else self.kl_ctl.value  # fixed β: the config's

    def save_model(self, path: Path) -> None:
        """The policy as a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA merged, or the
        adapter alone with ``save_adapter``)."""
        self.models.save_policy(Path(path), self.tokenizer)  # every process takes part in gathering the weights


__all__ = ["RLTrainer"]
