"""The one RL loop for every algorithm (docs/architecture.md, "The RL loop").

Each step reads like the paper pseudocode: 1. sample prompts; 2. generate G completions each;
3. score them; 4. old / reference log-probs and values; 5. token rewards and advantages through the
registries; 6. K passes of minibatch updates; 7. log and checkpoint. Algorithms differ only by
their config preset (``config.PRESETS``) — there is no ``if algorithm == ...`` below.

The trainer holds the loop, the update side and the ``Run``: its step, β, the models
(``models.rl_models.RLModels``) and optimizer. Phases 1–3 belong to its ``Sampler``
(``rl/sampler.py``: data order, seeds, engine or agent episodes, scoring, dynamic sampling), which
the loop asks for each step's batch; with ``rollout_workers`` a trainer rank's sampler is the
receiving end of the generator ranks (``rl.pipeline.RemoteSampler``) and a generator rank holds
only its Sampler, run by ``rl.pipeline.GeneratorRank``. The Sampler is assembled by ``rl.build``
(episode source, reward sources, prompt ids, engine). Phases 4–6 are public methods
(``make_experience``, ``update``) delegating to ``rlhfkit/rl/`` (experience, update), whose formulas
are in ``rlhfkit/algorithms/``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .. import distributed
from ..algorithms import AdaptiveEntropyController, AdaptiveKLController, FixedKLController
from ..config import RLConfig, part
from ..config.engines import check_installed
from ..config.teacher import distillation_weight
from ..data import load_prompt_dataset
from ..data.chat_templates import use_chat_template
from ..models import efficiency, soft_update
from ..models.rl_build import ModelLoading, build_models
from ..rl import advantages, build, experience, pipeline, update
from ..rollout import Rollout
from ..run import lifecycle, trace, training
from ..run.metrics import write_samples


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

    ``agent_program``: ``fn(client, row) -> reward | None``, an agent written against the
    ``openai`` client (or ``rlhfkit.endpoint.AgentProgram(fn, timeout=...)``): each episode runs it
    with a client on the policy's OpenAI-compatible endpoint, which records exactly what was
    sampled (``rlhfkit.endpoint``); instead of ``tools`` / ``environment_factory``.

    ``callbacks``: ``transformers.TrainerCallback`` objects (``rlhfkit/run/callbacks.py``); one that
    sets ``control.should_training_stop`` ends the run after that step, evaluated and saved as a
    last step (not with ``rollout_workers``).
    """

    def __init__(
        self,
        model,
        reward_funcs,
        args: RLConfig | None = None,
        train_dataset=None,
        processing_class=None,
        reward_weights=None,
        peft_config=None,
        ref_model=None,
        eval_dataset=None,
        tools=None,
        environment_factory=None,
        callbacks=None,
        agent_program=None,
        teacher_model=None,
    ):
        args = args or RLConfig()
        if train_dataset is None:
            raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a JSONL path)")
        train_rows = load_prompt_dataset(train_dataset)  # data errors before any model is loaded
        self.eval_rows = (
            load_prompt_dataset(eval_dataset, name="eval dataset", train_rows=train_rows)
            if eval_dataset is not None
            else None
        )
        reward_funcs = teacher_only_rewards(reward_funcs, args)
        check_installed(args.rollout_engine)  # not installed: one line now, before any model loads
        if callbacks and args.rollout_workers:
            raise ValueError(
                "callbacks are not supported with rollout_workers (a generator rank cannot end the run early)"
            )
        args.check_processes(distributed.planned_world())
        # The run lifecycle; nothing is written before everything has loaded.
        self.run = lifecycle.Run(args, callbacks=callbacks)
        self.config = args = self.run.args
        self.out_dir = self.run.out_dir
        training.seed_everything(args.seed)  # the same initial weights (critic and value heads too) on every process
        self.models = build_models(
            model, processing_class, part(ModelLoading, args), peft_config, ref_model, teacher_model
        )
        if distributed.role_size() > 1:  # then each process samples its own completions
            training.seed_everything(args.seed + 1_000_003 * distributed.role_rank())
        if args.sync_ref_model:
            self._keep_reference_in_sync()
        self.tokenizer = self.models.tokenizer
        use_chat_template(self.tokenizer, args.chat_template)
        source = build.episode_source(args, self.models, model, tools, environment_factory, agent_program)
        self.sampler, self.eval_set = build.build_sampler(
            args, self.models, train_rows, reward_funcs, reward_weights, source, self.eval_rows
        )
        if not distributed.is_generator():  # the activation policy; a row that cannot fit is refused now
            longest = max((len(p) for p in self.sampler.prompt_ids), default=0) + args.max_new_tokens
            self.memory = self.models.plan_memory()
            self.memory.check_row(longest, "prompt + completion")
        self.run.open(
            model,
            {"train_dataset": (train_dataset, train_rows), "eval_dataset": (eval_dataset, self.eval_rows)},
            reward_funcs=reward_funcs,
            reward_weights=reward_weights,
            ref_model=ref_model,
            teacher_model=teacher_model,
            peft_config=peft_config,
            tools=tools,
            environment_factory=environment_factory,
        )
        self.weights_version = 0  # optimizer steps taken (none on a generator rank): a vLLM engine syncs on a change
        # A generator rank (rollout_workers) holds its Sampler only: phases 1-3, nothing of the update side.
        self.generator = (
            pipeline.GeneratorRank(self.sampler, args.max_staleness) if distributed.is_generator() else None
        )
        if self.generator is None:
            self._start_update_side()

    @property
    def args(self) -> RLConfig:
        """The run's ``RLConfig`` (``config``), under ``transformers.Trainer``'s name."""
        return self.config

    @args.setter
    def args(self, value: RLConfig) -> None:
        self.config = value

    def _start_update_side(self) -> None:
        """β, the loop's step, the optimizer and schedule (``Run.start``), and a resumed
        run's counters: what a training process holds besides its Sampler."""
        args = self.config
        self.kl_ctl = (
            AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon)
            if args.adaptive_kl
            else FixedKLController(args.kl_coef)
        )
        self.entropy_ctl = (
            AdaptiveEntropyController(
                args.entropy_coef,
                args.entropy_target,
                args.entropy_coef_delta,
                args.entropy_coef_min,
                args.entropy_coef_max,
            )
            if args.use_adaptive_entropy
            else None
        )
        self.step = 0
        mini = args.mini_batch_size or args.batch_size  # the schedule counts optimizer steps: K passes x minibatches
        counters = self.run.start(
            self._modules(),
            args.max_steps,
            param_groups=self._param_groups(),
            schedule_steps=max(1, args.max_steps * args.num_iterations * math.ceil(args.batch_size / mini)),
        )
        if counters is not None:
            self._restore(counters)
        self.memory.optimizer = self.run.optimizer  # its moments count once they exist

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict]:
        """The loop, until ``max_steps``: each step samples prompts, generates, scores, makes the
        experience and updates the policy (and critic), then logs, evaluates and checkpoints."""
        if self.generator is not None:  # rollout_workers: this rank generates the batches, phases 1-3
            return self.generator.train()
        self.sampler.start(self._counters())  # generator ranks, if any, start on the first batches
        if self.eval_rows is not None and self.step == 0:
            with trace.span("evaluate", step=0):
                metrics = self.evaluate()
            self.run.log(0, metrics)
        while self.step < self.config.max_steps:
            timings: dict[str, float] = {}
            self.run.step_begin()
            counters = efficiency.Counters()  # this step's: the model calls of its passes add to them
            with counters.counted():
                with efficiency.counting("generate"):
                    batch = self.sampler.batch(self.step, self.weights_version, timings)  # 1, 2, 3
                if batch.samples is not None:  # some steps' samples, for the report
                    write_samples(self.out_dir, self.step + 1, *batch.samples, limit=self.config.num_logged_samples)
                metrics = batch.metrics
                with training.timer(timings, "logprobs"):
                    exp = self.make_experience(batch.rollout, batch.scores, batch.valid, metrics)  # 4, 5
                with training.timer(timings, "update"):
                    if bool(distributed.reduce_sum(exp.mask.sum()) > 0):  # nothing scored anywhere: no step
                        metrics.update(self.update(exp))  # 6
            metrics.update(counters.metrics(distributed.reduce_sum))  # perf/*_efficiency: positions needed/computed
            self.step += 1
            self.sampler.publish(self.step, timings)  # generator ranks go on with the weights of this step
            stop = self.run.step_end(self.step)  # a callback's should_training_stop: this step is the last
            if self._eval_due(last=stop):
                with trace.span("evaluate", step=self.step):
                    metrics.update(self.evaluate())
            self._log(metrics, exp, timings)  # 7
            self.run.step_done(self.step, self._counters)  # checkpoint
            if stop:
                break
        if self.sampler.agent is not None:
            self.sampler.agent.close()  # an agent program's endpoint stops
        return self.run.finish(self.save_model)  # final/, plots, trackers closed

    # ---------------------------------------------------------------- the phases (rlhfkit/rl/)
    def make_experience(self, rollout: Rollout, scores, valid, metrics: dict) -> experience.Experience:
        """Phases 4–5 (``rl.experience.make_experience``): old / reference log-probs and values,
        token rewards and advantages, with this step's β."""
        return experience.make_experience(
            self.models,
            part(experience.ExperienceMaking, self.config),
            rollout,
            scores,
            valid,
            self.kl_ctl.value,
            metrics,
        )

    def update(self, exp: experience.Experience) -> dict:
        """Phase 6 (``rl.update.update``): K passes of minibatch updates, each closed by
        ``optimizer_step``; returns the update's metrics."""
        return update.update(
            self.models,
            part(update.MinibatchUpdate, self.config),
            exp,
            self.kl_ctl.value,
            self.step,
            self.optimizer_step,
            self.entropy_ctl,
        )

    def optimizer_step(self) -> dict:
        """One optimizer step of the run (a non-finite gradient norm is skipped: ``NonFiniteGuard``);
        the engine's weights are then out of date."""
        grad_norm = self.run.optimizer_step()["perf/grad_norm"]
        self.weights_version += 1  # a skipped step changes nothing, but the engine resyncs: harmless
        if self.config.sync_ref_model and self.weights_version % self.config.ref_model_sync_steps == 0:
            self._sync_reference()
        return {"perf/grad_norm": grad_norm}

    def _keep_reference_in_sync(self) -> None:
        """``sync_ref_model``: the reference must be a model of its own (not a LoRA policy's base), and
        its weights become state the checkpoints hold (marked trainable; no optimizer holds them and it
        is scored under ``no_grad``)."""
        if self.models.reference is None:
            raise ValueError(
                "sync_ref_model=True with a LoRA (PEFT) policy is not supported: its reference is the base model "
                "with the adapter disabled, no separate model to synchronise; train the full model or set "
                "sync_ref_model=False"
            )
        self.models.reference.requires_grad_(True)

    def _sync_reference(self) -> None:
        """TR-DPO's soft update (``sync_ref_model``): ``ref ← α policy + (1 - α) ref``, parameter by parameter
        (Gorbatovski et al. 2024, arXiv:2404.09656, §3; TRL's ``SyncRefModelCallback``)."""
        reference = self.models.reference
        assert reference is not None  # _keep_reference_in_sync refused a run without one
        soft_update(reference, self.models.policy, self.config.ref_model_mixup_alpha)

    def evaluate(self) -> dict:
        """Greedy completions of the eval prompts scored by the training reward sources:
        ``eval/<source>_mean``, ``eval/score_mean``, length and truncation (as ``rlhfkit eval``);
        with tools or an environment factory, greedy agent episodes (``eval/turns_mean``,
        ``eval/tool_calls_mean``)."""
        if self.eval_rows is None or self.eval_set is None:  # build_sampler: an EvalSet of the eval rows, if any
            raise ValueError("evaluate() needs an eval_dataset")
        # Every process evaluates the whole set with the current weights (greedy: the same numbers).
        rows, prompt_ids, sampling = self.eval_set
        return self.sampler.evaluate(rows, prompt_ids, sampling, self.weights_version)

    def _eval_due(self, last: bool = False) -> bool:
        every = self.config.eval_every
        last = last or self.step == self.config.max_steps
        return self.eval_rows is not None and (last or bool(every and self.step % every == 0))

    # ---------------------------------------------------------------- set-up and bookkeeping
    def _param_groups(self) -> list[dict]:
        """AdamW's groups: the policy at ``learning_rate``, a critic at ``critic_learning_rate``."""
        args = self.config
        groups = [{"params": [p for p in self.models.policy.parameters() if p.requires_grad], "lr": args.learning_rate}]
        if self.models.critic_module is not None:
            groups.append(
                {
                    "params": [p for p in self.models.critic_module.parameters() if p.requires_grad],
                    "lr": args.critic_learning_rate or args.learning_rate,
                }
            )
        return groups

    def _log(self, metrics: dict, exp: experience.Experience, timings: dict) -> None:
        """Global metrics (every process computes the same row); rank 0 writes and prints it."""
        tokens = distributed.reduce_sum(exp.rollout.response_mask.sum().float())
        metrics.update(
            {
                **advantages.rollout_metrics(exp.rollout),
                "kl/coef": self.kl_ctl.value,
                "perf/lr": self.run.scheduler.get_last_lr()[0],
                "perf/skipped_steps": float(self.run.guard.skipped),
                **{f"perf/time_{k}": v for k, v in timings.items()},
                "perf/tokens_per_s": float(tokens) / max(sum(timings.values()), 1e-9),
                **self.memory.metrics(),
            }
        )
        row = self.run.log(self.step, metrics)
        if "kl/k1" in row:  # KL per sequence drives the adaptive controller
            seq_kl = row["kl/k1"] * row["rollout/response_length_mean"]
            self.kl_ctl.update(seq_kl, self.config.batch_size)

    def _modules(self) -> dict[str, torch.nn.Module]:
        mods = {"policy": self.models.policy}
        if self.models.critic_module is not None:
            mods["critic"] = self.models.critic_module
        if self.config.sync_ref_model:  # its weights change during the run: checkpoints hold them
            mods["reference"] = self.models.reference
        return mods

    def save_checkpoint(self, path: Path) -> None:
        """Every process calls this: DCP shards of the weights and optimizer, per-rank RNG, counters."""
        self.run.save_checkpoint(path, self._counters())

    def _counters(self) -> dict:
        data_epoch, data_pos = self.sampler.position()
        counters = {"step": self.step, "data_epoch": data_epoch, "data_pos": data_pos, "kl_coef": self.kl_ctl.value}
        if self.entropy_ctl is not None:
            counters.update({f"entropy_{k}": v for k, v in self.entropy_ctl.state_dict().items()})
        return counters

    def _restore(self, counters: dict) -> None:
        self.step = counters["step"]
        self.sampler.restore((counters["data_epoch"], counters["data_pos"]))
        self.kl_ctl.value = (
            counters["kl_coef"] if self.config.adaptive_kl else self.kl_ctl.value
        )  # fixed β: the config's
        if self.entropy_ctl is not None and "entropy_coef" in counters:
            self.entropy_ctl.load_state_dict(
                {"coef": counters["entropy_coef"], "last_entropy": counters["entropy_last_entropy"]}
            )

    def save_model(self, path: Path) -> None:
        """The policy as a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA merged, or the
        adapter alone with ``save_adapter``)."""
        self.models.save_policy(Path(path), self.tokenizer)  # every process takes part in gathering the weights


def teacher_only_rewards(reward_funcs, args: RLConfig) -> list:
    """The run's reward sources as a list: ``reward_funcs`` as given, or, when there are none and a teacher
    gives the signal (``distillation_coef`` > 0), the registered ``no_reward`` (0 for every completion)."""
    empty = reward_funcs is None or (isinstance(reward_funcs, (list, tuple)) and not reward_funcs)
    if empty and distillation_weight(args) > 0:
        return ["no_reward"]
    if reward_funcs is None:  # an empty list is allowed: an agent program or environment may bring the rewards
        raise ValueError(
            "reward_funcs is required: reward functions and/or reward-model directories "
            "(or a teacher: teacher_model with distillation_coef > 0)"
        )
    return list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]


__all__ = ["RLTrainer", "teacher_only_rewards"]
