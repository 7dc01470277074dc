"""The one RL loop for every algorithm (DESIGN.md, "The RL loop").

Each step reads like the paper pseudocode: 1. sample prompts; 2. generate G completions each;
3. score them; 4. old / reference log-probs and values; 5. token rewards and advantages through the
registries; 6. K passes of minibatch updates; 7. log and checkpoint. Algorithms differ only by
their config preset (``config.PRESETS``) — there is no ``if algorithm == ...`` below.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import distributed
from ..algorithms import (KL_ESTIMATORS, POLICY_LOSSES, ROLLOUT_IS_MODES, AdaptiveKLController, FixedKLController,
                          aggregate, masked_mean, value_loss)
from ..config import RLConfig
from ..rollout import Rollout, SamplingParams, decode_completions
from ..run.lifecycle import Run
from ..run.metrics import write_samples
from ..run.training import epoch_order, seed_everything, timer
from .evaluate import run_evaluation
from ..data import load_prompt_dataset
from .rl_advantages import compute_advantages, kl_metrics, rollout_correction, rollout_metrics, shape_scores
from .rl_setup import build_engine, build_models, build_rewards, engine_ready, prompt_limit, tokenize_prompts


@dataclass
class Experience:
    """Everything phase 6 trains on; all (B, T) except ``rollout``."""

    rollout: Rollout
    mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    old_values: torch.Tensor | None
    advantages: torch.Tensor
    returns: torch.Tensor | None
    is_weights: torch.Tensor | None = None  # rollout correction (vLLM): per-token weights of the policy loss
    correct_in_loss: bool = False  # the correction is computed in the loss (one on-policy pass, no old pass)


class RLTrainer:
    """``RLTrainer(model=..., reward_funcs=[...], args=RLConfig(algorithm="grpo"), train_dataset=...).train()``

    ``model``: a local HF directory or a causal-LM object; ``processing_class``: its tokenizer
    (loaded from the directory when omitted); ``reward_funcs``: callables of TRL's shape, names of
    registered functions, or reward-model directories; ``train_dataset``: a ``datasets.Dataset``,
    a list of dicts or a JSONL path with a ``prompt`` column (text or chat messages);
    ``peft_config``: a ``peft`` config to train a LoRA adapter (the reference is then the base model
    with the adapter disabled — no second copy); ``eval_dataset``: held-out prompts (same format)
    greedily evaluated before the first step, every ``eval_every`` steps and after the last.
    """

    def __init__(self, model, reward_funcs, args: RLConfig | None = None, train_dataset=None,
                 processing_class=None, reward_weights=None, peft_config=None, ref_model=None, eval_dataset=None):
        args = args or RLConfig()
        if train_dataset is None:
            raise ValueError("train_dataset is required (a datasets.Dataset, a list of dicts or a JSONL path)")
        train_rows = load_prompt_dataset(train_dataset)  # data errors before any model is loaded
        self.eval_rows = load_prompt_dataset(eval_dataset, name="eval dataset") if eval_dataset is not None else None
        if reward_funcs is None:
            raise ValueError("reward_funcs is required: reward functions and/or reward-model directories")
        reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if args.rollout_engine == "vllm":
            from ..rollout.vllm import import_vllm

            import_vllm()  # not installed: one line now, before any model loads
        world = distributed.planned_world()
        if args.prompts_per_step % world:
            raise ValueError(f"prompts_per_step={args.prompts_per_step} must be divisible by the number of "
                             f"processes ({world}): each process samples its share, and a group never spans two")
        self.run = Run(args)  # the run lifecycle; nothing is written before everything has loaded
        self.args = args = self.run.args
        self.out_dir = self.run.out_dir
        seed_everything(args.seed)  # the same initial weights (critic and value heads too) on every process
        self.m = build_models(model, processing_class, args, peft_config, ref_model)
        if distributed.world() > 1:  # then each process samples its own completions
            seed_everything(args.seed + 1_000_003 * distributed.rank())
        self.tokenizer = self.m.tokenizer
        self.rewards = build_rewards(reward_funcs, reward_weights, self.tokenizer, self.m.device)
        limit, cut = prompt_limit(args.max_prompt_length, args.max_new_tokens, self.m.policy.config), args.truncate_prompts
        self.rows, self.prompt_ids = train_rows, tokenize_prompts(train_rows, self.tokenizer, limit, cut)
        self.eval_prompt_ids = (tokenize_prompts(self.eval_rows, self.tokenizer, limit, cut, "eval_dataset")
                                if self.eval_rows is not None else None)
        self.engine = build_engine(args, self.m, self.prompt_ids + (self.eval_prompt_ids or []))
        self.run.open(model, {"train_dataset": (train_dataset, train_rows), "eval_dataset": (eval_dataset, self.eval_rows)},
                      reward_funcs=reward_funcs, reward_weights=reward_weights, ref_model=ref_model, peft_config=peft_config)
        self.weights_version = 0  # optimizer steps taken: a vLLM engine syncs when it holds an older version
        self.sampling = SamplingParams.from_config(args)
        self.kl_ctl = (AdaptiveKLController(args.kl_coef, args.kl_target, args.kl_horizon) if args.adaptive_kl
                       else FixedKLController(args.kl_coef))
        self.step, self.data_epoch, self.data_pos = 0, 0, 0
        self.order = self._epoch_order(0)
        mini = args.mini_batch_size or args.batch_size  # the schedule counts optimizer steps: K passes x minibatches
        counters = self.run.start(self._modules(), args.max_steps, param_groups=self._param_groups(),
                                  schedule_steps=max(1, args.max_steps * args.num_iterations * math.ceil(args.batch_size / mini)))
        if counters is not None:
            self._restore(counters)

    # ---------------------------------------------------------------- the loop
    def train(self) -> list[dict]:
        args = self.args
        if self.eval_rows is not None and self.step == 0:
            self.run.log(0, self.evaluate())
        while self.step < args.max_steps:
            timings: dict[str, float] = {}
            rows = self._sample_prompts()                                          # 1
            with timer(timings, "generate"), self._engine_ready(timings):
                rollout = self.engine.generate([self.prompt_ids[i] for i in rows],     # 2
                                               args.group_size, self.sampling, seed=self._sampling_seed())
            self.engine.sleep()  # a vLLM engine with vllm_sleep frees its memory for the update
            with timer(timings, "reward"):
                scores, valid, metrics = self._score(rows, rollout)                # 3
            with timer(timings, "logprobs"):
                exp = self._make_experience(rollout, scores, valid, metrics)      # 4, 5
            with timer(timings, "update"):
                if bool(distributed.reduce_sum(exp.mask.sum()) > 0):  # nothing scored anywhere: no step
                    metrics.update(self._update(exp))                              # 6
            self.step += 1
            if self._eval_due():
                metrics.update(self.evaluate())
            self._log(metrics, exp, timings)                                       # 7
            self.run.step_done(self.step, self._counters)                          # checkpoint
        return self.run.finish(self.save_model)  # final/, plots, trackers closed

    def evaluate(self) -> dict:
        """Greedy completions of the eval prompts scored by the training reward sources:
        ``eval/<source>_mean``, ``eval/score_mean``, length and truncation (as ``rlhfkit eval``)."""
        if self.eval_rows is None:
            raise ValueError("evaluate() needs an eval_dataset")
        args = self.args
        sampling = SamplingParams.from_config(args, max_new_tokens=args.eval_max_new_tokens or args.max_new_tokens,
                                              greedy=True)
        # Every process evaluates the whole set with the current weights (greedy: the same numbers).
        with self._engine_ready({}):
            result = run_evaluation(self.m.policy, None, self.tokenizer, self.rewards, self.eval_rows,
                                    self.eval_prompt_ids, 1, sampling, batch_size=64, engine=self.engine)
        self.engine.sleep()
        return result["metrics"]

    def _engine_ready(self, timings: dict):
        return engine_ready(self.engine, self.m, self.weights_version, timings)

    def _sampling_seed(self) -> int:
        """The seed of this step's sampling on this process (an engine that takes one: vLLM), fixed by
        (seed, step, rank) so a resumed run samples what the uninterrupted one did."""
        # Below 2**62, so vLLM's per-request seeds (this + g·n) fit its 64-bit seed for any config seed.
        return (((self.args.seed * 1_000_003 + self.step) * 4099 + distributed.rank()) * 100_003) % 2**62

    def _eval_due(self) -> bool:
        every = self.args.eval_every
        return self.eval_rows is not None and ((every and self.step % every == 0) or self.step == self.args.max_steps)

    def _sample_prompts(self) -> list[int]:
        """This process's share of the next ``prompts_per_step`` prompts of a seeded per-epoch
        shuffle (every process walks the same order; process r takes the r-th slice)."""
        rows = []
        while len(rows) < self.args.prompts_per_step:
            if self.data_pos >= len(self.order):
                self.data_epoch, self.data_pos = self.data_epoch + 1, 0
                self.order = self._epoch_order(self.data_epoch)
            rows.append(self.order[self.data_pos])
            self.data_pos += 1
        share = len(rows) // distributed.world()
        return rows[distributed.rank() * share:(distributed.rank() + 1) * share]

    def _score(self, rows: list[int], rollout: Rollout):
        """Phase 3: reward functions / models on the decoded completions, then the EOS trick,
        clipping and normalisation. Samples no function scored are masked out (``valid``)."""
        G, args = self.args.group_size, self.args
        data = [self.rows[i] for i in rows for _ in range(G)]
        completions = decode_completions(rollout, self.tokenizer)
        columns = {k: [d.get(k) for d in data] for k in data[0] if k != "prompt"}
        out = self.rewards([d["prompt"] for d in data], completions, columns)
        metrics = {f"reward/{name}_mean": distributed.global_nanmean(v) for name, v in out.per_function.items()}
        valid = out.valid.to(rollout.has_eos.device)
        scores, score_metrics = shape_scores(out.scores.to(rollout.has_eos.device), valid, rollout.has_eos, args,
                                             reduce=distributed.reduce_sum)
        metrics.update(score_metrics)
        if self._sample_step():
            write_samples(self.out_dir, self.step + 1, [d["prompt"] for d in data], completions, out.scores,
                          args.num_logged_samples)
        return scores, valid, metrics

    def _sample_step(self) -> bool:
        every = max(1, self.args.max_steps // 10)
        return (self.step + 1) % every == 0 or self.step == 0 or self.step + 1 == self.args.max_steps

    @torch.no_grad()
    def _make_experience(self, rollout: Rollout, scores, valid, metrics) -> Experience:
        """Phases 4–5: old / reference log-probs and values, token rewards, advantages."""
        args, device = self.args, self.m.device
        rollout = rollout.to(device)
        mask, scores = rollout.response_mask.bool(), scores.to(device)
        behaviour = rollout.logprobs  # the engine's own log-probs (vLLM); None: it sampled from the policy itself
        # Old log-probs are computed when something else needs them (the KL in the reward, a critic,
        # more than one pass) or a mask mode must know the kept tokens before the update; then the
        # correction is computed here, else in the one on-policy pass of the loss — exactly once.
        masks = behaviour is not None and ROLLOUT_IS_MODES.traits(args.rollout_is)["masks"]
        need_old = (args.kl_in_reward and args.kl_coef > 0) or not self._single_pass or args.use_critic or masks
        old_logprobs, old_values, kept_mass = (self.m.policy_outputs(rollout, with_values=args.use_critic)
                                               if need_old else (None, None, None))
        ref = self.m.reference_logprobs(rollout) if args.kl_coef > 0 else None
        valid = valid.to(device)
        kl = None
        if ref is not None and old_logprobs is not None:
            kl = KL_ESTIMATORS.get(args.kl_estimator)(old_logprobs, ref)
            metrics.update(kl_metrics(old_logprobs, ref, mask, distributed.global_mean))  # scored or not
        advantages, returns, rewards, mask = compute_advantages(args, scores, valid, mask, kl, old_values,
                                                                self.kl_ctl.value, reduce=distributed.reduce_sum)
        metrics["reward/token_reward_sum"] = distributed.global_mean(rewards.sum(-1), valid)
        metrics["policy/advantages_mean"] = distributed.global_mean(advantages, mask)
        correct_in_loss, is_weights = behaviour is not None and old_logprobs is None, None
        if not correct_in_loss:
            is_weights, mask, is_metrics = rollout_correction(args, old_logprobs, behaviour, mask, kept_mass)
            metrics.update(is_metrics)
        return Experience(rollout, mask, old_logprobs, ref, old_values, advantages, returns, is_weights,
                          correct_in_loss)

    @property
    def _single_pass(self) -> bool:
        """One on-policy pass: old log-probs equal the current ones, so they are not recomputed."""
        mini = self.args.mini_batch_size or self.args.batch_size
        return self.args.num_iterations == 1 and mini >= self.args.batch_size

    def _update(self, exp: Experience) -> dict:
        """Phase 6: K passes over shuffled minibatches with gradient accumulation over micro-batches.

        Minibatches are drawn from the *global* batch (every process's rows, in process order) by one
        permutation that every process draws alike, so one update of a batch gives the same weights
        on any number of processes; each process trains on its own rows of each minibatch. A
        micro-batch's loss is weighted by its share of the global minibatch (tokens for token-mean,
        rows otherwise) times the number of processes (FSDP2 and DDP average gradients over them), so
        accumulation gives the gradient of one batch. Its metrics are weighted the same way — the
        losses by that share, the per-token means (KL, entropy, clip fraction) by its share of the
        minibatch's tokens — and summed over processes: a logged metric (and the KL the adaptive
        controller reads) is the minibatch's own, whatever the micro-batch size or process count.
        Processes with fewer micro-batches run zero-weight ones, so every process runs the same
        number of (collective) forward and backward passes."""
        args, B, world = self.args, exp.mask.shape[0], distributed.world()
        first = distributed.rank() * B  # this process's rows are global rows first .. first + B - 1
        mini = args.mini_batch_size or B * world
        gen = self._minibatch_generator()
        sums: dict[str, torch.Tensor] = {}
        n_steps = 0
        for _ in range(args.num_iterations):
            for global_rows in torch.randperm(B * world, generator=gen).split(mini):
                mb_rows = global_rows[(global_rows >= first) & (global_rows < first + B)] - first
                mb_rows = self._group_by_prompt(exp, mb_rows)
                weight = distributed.reduce_sum(self._loss_weights(exp.mask[mb_rows])).clamp(min=1)
                tokens = distributed.reduce_sum(exp.mask[mb_rows].sum()).clamp(min=1)
                chunks = list(mb_rows.split(args.micro_batch_size or mini)) if len(mb_rows) else []
                n_micro = distributed.reduce_max(len(chunks))
                for i in range(n_micro):
                    real = i < len(chunks)
                    rows = chunks[i] if real else torch.zeros(1, dtype=torch.long)  # zero-weight filler
                    with distributed.no_sync(self.m.train_policy, self.m.train_critic) if i < n_micro - 1 else nullcontext():
                        loss, m = self._loss(exp, rows.to(self.m.device))
                        share = self._loss_weights(exp.mask[rows]) / weight if real else torch.zeros(())
                        (loss * share * world).backward()
                    token_share = exp.mask[rows].sum() / tokens if real else torch.zeros(())
                    for k, v in m.items():
                        if k.endswith("_max"):  # a maximum over micro-batches, minibatches and processes
                            sums[k] = torch.maximum(sums[k], v) if k in sums else v
                        else:
                            sums[k] = sums.get(k, 0) + v * (share if k.endswith("/loss") else token_share)
                sums["perf/grad_norm"] = sums.get("perf/grad_norm", 0) + self._optimizer_step()["perf/grad_norm"] / world
                n_steps += 1
        return {k: distributed.reduce_tensor_max(v) if k.endswith("_max") else distributed.reduce_sum(v) / n_steps
                for k, v in sums.items()}

    def _minibatch_generator(self) -> torch.Generator:
        """The generator of this step's minibatch order: the same on every process, fixed by
        (seed, step) so a resumed run draws the same order and the rollout's RNG is untouched."""
        return torch.Generator().manual_seed(self.args.seed * 1_000_003 + self.step)

    def _group_by_prompt(self, exp: Experience, rows: torch.Tensor) -> torch.Tensor:
        """A minibatch's rows ordered by prompt, so micro-batches hold whole groups whose prompt
        pass is shared (gradient accumulation over a minibatch does not depend on the order)."""
        index = exp.rollout.prompt_index
        if not self.args.share_prompt or index is None:
            return rows
        return rows[torch.sort(index[rows.to(index.device)].cpu(), stable=True).indices]

    def _loss_weights(self, mask: torch.Tensor) -> torch.Tensor:
        """The share of a micro-batch in its minibatch's loss: tokens for token-mean, else rows."""
        if self.args.loss_agg == "token-mean":
            return mask.sum().float()
        return (mask.sum(-1) > 0).sum().float()

    def _loss(self, exp: Experience, rows: torch.Tensor):
        args = self.args
        r = exp.rollout.select(rows)
        mask, adv = exp.mask[rows], exp.advantages[rows]
        horizon = args.loss_horizon or args.max_new_tokens
        logprobs, values, entropy, kept_mass = self.m.train_outputs(r, with_values=args.use_critic,
                                                                    entropy_grad=args.entropy_coef > 0)
        old = exp.old_logprobs[rows] if exp.old_logprobs is not None else logprobs.detach()
        weights, is_metrics = exp.is_weights[rows] if exp.is_weights is not None else None, {}
        if exp.correct_in_loss:  # one on-policy pass: its detached log-probs are the old ones
            weights, _, is_metrics = rollout_correction(args, old, r.logprobs, mask, kept_mass, local=True)
        loss, metrics = POLICY_LOSSES.get(args.policy_loss)(
            logprobs, old, adv, mask, agg=args.loss_agg, horizon=horizon,
            clip_low=args.clip_low, clip_high=args.clip_high, dual_clip=args.dual_clip, weights=weights)
        metrics.update(is_metrics, **{"policy/loss": loss.detach()})
        metrics["policy/entropy"] = masked_mean(entropy.detach(), mask)
        if args.entropy_coef > 0:
            loss = loss - args.entropy_coef * aggregate(entropy, mask, args.loss_agg, horizon)
        if exp.ref_logprobs is not None and not args.kl_in_reward:
            kl = KL_ESTIMATORS.get(args.kl_estimator)(logprobs, exp.ref_logprobs[rows])
            loss = loss + self.kl_ctl.value * aggregate(kl, mask, args.loss_agg, horizon)
            metrics.update(kl_metrics(logprobs, exp.ref_logprobs[rows], mask))
        if args.use_critic:
            v_loss, v_metrics = value_loss(values, exp.old_values[rows], exp.returns[rows], mask,
                                           clip=args.value_clip, agg=args.loss_agg, horizon=horizon)
            loss = loss + args.vf_coef * v_loss
            metrics.update(v_metrics, **{"critic/loss": v_loss.detach()})
        return loss, metrics

    def _optimizer_step(self) -> dict:  # a non-finite gradient norm is skipped (NonFiniteGuard)
        grad_norm = self.run.optimizer_step()["perf/grad_norm"]
        self.weights_version += 1  # a skipped step changes nothing, but the engine resyncs: harmless
        return {"perf/grad_norm": grad_norm}

    # ---------------------------------------------------------------- set-up and bookkeeping
    def _param_groups(self) -> list[dict]:
        """AdamW's groups: the policy at ``learning_rate``, a critic at ``critic_learning_rate``."""
        args = self.args
        groups = [{"params": [p for p in self.m.policy.parameters() if p.requires_grad], "lr": args.learning_rate}]
        if self.m.critic_module is not None:
            groups.append({"params": [p for p in self.m.critic_module.parameters() if p.requires_grad],
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
        mods = {"policy": self.m.policy}
        if self.m.critic_module is not None:
            mods["critic"] = self.m.critic_module
        return mods

    def save_checkpoint(self, path: Path) -> None:
        """Every process calls this: DCP shards of the weights and optimizer, per-rank RNG, counters."""
        self.run.save_checkpoint(path, self._counters())

    def _counters(self) -> dict:
        return {"step": self.step, "data_epoch": self.data_epoch, "data_pos": self.data_pos, "kl_coef": self.kl_ctl.value}

    def _restore(self, counters: dict) -> None:
        self.step, self.data_epoch, self.data_pos = counters["step"], counters["data_epoch"], counters["data_pos"]
        self.order = self._epoch_order(self.data_epoch)
        self.kl_ctl.value = counters["kl_coef"] if self.args.adaptive_kl else self.kl_ctl.value  # fixed β: the config's

    def save_model(self, path: Path) -> None:
        """The policy as a directory ``AutoModelForCausalLM.from_pretrained`` loads (LoRA merged, or the
        adapter alone with ``save_adapter``)."""
        self.m.save_policy(Path(path), self.tokenizer)  # every process takes part in gathering the weights


__all__ = ["RLTrainer", "Experience"]
