"""Phase 6 of the RL loop (generate → score → make experience → **update**): K passes of
minibatch updates on an experience, and the loss of one micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import cast

import torch

from .. import distributed
from ..algorithms import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveEntropyController,
    LossInputs,
    aggregate,
    high_entropy_mask,
    loss_hyperparameters,
    masked_mean,
    off_policy_sequence_mask,
    value_loss,
)
from ..config import takes
from ..config.teacher import distillation_weight
from ..models import efficiency
from ..models.micro_batches import row_spans, split_rows
from ..models.rl_models import RLModels
from ..models.teacher import teacher_divergence
from .advantages import RolloutCorrection, kl_metrics, rollout_correction
from .experience import Experience


@takes(
    "policy_loss",
    "loss_agg",
    "loss_horizon",
    "max_new_tokens",
    "clip_low",
    "clip_high",
    "dual_clip",
    "loss_options",
    "importance_sampling_level",
    "entropy_coef",
    "use_adaptive_entropy",
    "entropy_agg",
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "kl_in_reward",
    "kl_estimator",
    "use_critic",
    "value_clip",
    "vf_coef",
    "distillation_coef",
    "distillation_mode",
    "distillation_beta",
    "temperature",
)
class UpdateLoss(RolloutCorrection):
    """The fields of ``RLConfig`` that the loss of a micro-batch reads (``loss``), the rollout
    correction's among them (with one on-policy pass it is computed in the loss)."""


@takes(
    "num_iterations",
    "mini_batch_size",
    "micro_batch_size",
    "max_tokens_per_micro_batch",
    "seed",
    "share_prompt",
    "skip_zero_gradient_rows",
)
class MinibatchUpdate(UpdateLoss):
    """The fields of ``RLConfig`` that phase 6 reads (``update``): the passes, minibatches and
    micro-batches (rows and tokens), the seed of the minibatch order, whether micro-batches keep groups together,
    and the loss's."""


def zero_gradient_rows(args: MinibatchUpdate, exp: Experience, kl_coef: float) -> torch.Tensor | None:
    """(B,) True for the rows whose loss has no gradient, which the update need not run: an
    advantage of exactly 0 on every token (or no token), when nothing else reaches the row — the
    policy loss declares ``zero_at_zero_advantage`` (the built-in ones are multiples of the
    advantage per token, clipped, weighted by the rollout correction or not), so such a row adds
    exact zeros. None (every row runs) with the option off, a loss that does not declare it, a
    critic (the value loss), an entropy bonus, or β·KL in the loss."""
    if not args.skip_zero_gradient_rows or args.use_critic or args.entropy_coef > 0 or args.use_adaptive_entropy:
        return None
    if distillation_weight(args) > 0 and args.distillation_mode == "full":  # the divergence reaches every row
        return None
    if args.top_entropy_quantile < 1.0:  # a row left out would move its micro-batch's entropy quantile
        return None
    if args.loss_agg == "micro-batch-token-mean":  # a row left out would change its micro-batch's normaliser
        return None
    if not POLICY_LOSSES.traits(args.policy_loss)["zero_at_zero_advantage"]:
        return None
    if exp.ref_logprobs is not None and not args.kl_in_reward and kl_coef != 0:
        return None
    return ((exp.advantages * exp.mask) == 0).all(-1)


def update(
    models: RLModels,
    args: MinibatchUpdate,
    exp: Experience,
    kl_coef: float,
    step: int,
    optimizer_step: Callable[[], dict],
    entropy: AdaptiveEntropyController | None = None,
) -> dict:
    """Phase 6: K passes over shuffled minibatches with gradient accumulation over micro-batches.

    Minibatches are drawn from the *global* batch (every process's rows, in process order) by one
    permutation that every process draws alike, so one update of a batch gives the same weights
    on any number of processes; each process trains on its own rows of each minibatch, in
    micro-batches of at most ``micro_batch_size`` rows and the token budget (``micro_batch_split``;
    their number may differ between minibatches and processes). A micro-batch's loss is weighted
    by its share of the global minibatch (tokens for token-mean,
    rows otherwise) times the number of processes (FSDP2 and DDP average gradients over them), so
    accumulation gives the gradient of one batch. Its metrics are weighted the same way — the
    losses by that share, the per-token means (KL, entropy, clip fraction) by its share of the
    minibatch's tokens — and summed over processes: a logged metric (and the KL the adaptive
    controller reads) is the minibatch's own, whatever the micro-batch size or process count.
    Processes with fewer micro-batches run zero-weight ones, so every process runs the same
    number of (collective) forward and backward passes.

    Rows without gradient (``zero_gradient_rows``) keep their share of each minibatch's loss
    denominator but are not run; the per-token metrics average over the rows that ran. A minibatch
    none of whose rows has a gradient still runs one zero-weight pass, so the optimizer steps on
    zero gradients (AdamW's moments and weight decay move, as they would after running the rows).

    ``entropy``: Skywork-OR1's adaptive entropy coefficient (``use_adaptive_entropy``): each step's
    bonus uses its ``applied`` coefficient, and after each optimizer step it is updated with the step's
    entropy (the token mean over every process's micro-batches); ``policy/entropy_coef`` is its mean
    over the optimizer steps. None: ``args.entropy_coef``, fixed.

    ``policy/total_loss`` is the whole loss each optimizer step minimised (the policy loss, the KL and
    value terms, minus the entropy bonus; TRL's logged ``loss``), averaged over the optimizer steps.

    ``kl_coef``: β of this step; ``step``: RL steps done (it seeds the minibatch order,
    ``minibatch_generator``); ``optimizer_step``: clips, steps and zeroes the gradients, returning
    ``{"perf/grad_norm": ...}`` (the trainer's, on its run's optimizer). The loss of each
    micro-batch is ``loss``."""
    B, world = exp.mask.shape[0], distributed.role_size()
    first = distributed.role_rank() * B  # this process's rows are global rows first .. first + B - 1
    mini = args.mini_batch_size or B * world
    gen = minibatch_generator(args.seed, step)
    skip = zero_gradient_rows(args, exp, kl_coef)
    skip_cpu = skip.cpu() if skip is not None else None
    split = micro_batch_split(args, exp, models.token_budget(exp.rollout))
    sums: dict[str, torch.Tensor] = {}
    coefs: list[float] = []  # the adaptive entropy coefficient after each optimizer step
    n_steps = n_ran = 0
    for _ in range(args.num_iterations):
        for global_rows in torch.randperm(B * world, generator=gen).split(mini):
            mb_rows = global_rows[(global_rows >= first) & (global_rows < first + B)] - first
            mb_rows = group_by_prompt(exp, mb_rows, share_prompt=args.share_prompt)
            counted = exp.counted_rows[mb_rows] if exp.counted_rows is not None else None
            weight = distributed.reduce_sum(loss_weights(exp.mask[mb_rows], args.loss_agg, counted)).clamp(min=1)
            if skip_cpu is not None:
                mb_rows = mb_rows[~skip_cpu[mb_rows]]
            tokens = distributed.reduce_sum(exp.mask[mb_rows].sum())  # the per-token metrics' denominator
            ran = bool(tokens > 0)
            chunks = split(mb_rows)
            if args.loss_agg == "micro-batch-token-mean":  # every micro-batch of the step alike
                weight = distributed.reduce_sum(torch.tensor(float(len(chunks)))).clamp(min=1)
            if len(mb_rows):
                efficiency.add_needed("update", efficiency.needed_tokens(exp.rollout, mb_rows))
            n_micro = max(distributed.reduce_max(len(chunks)), 1)
            # the micro-batches of the optimizer step, over every process (TRL's entropy term divides by their
            # number per process, gradient_accumulation_steps: equal on every process there)
            micro_steps = float(distributed.reduce_sum(torch.tensor(float(len(chunks))))) / world
            step_entropy = torch.zeros(())
            for i in range(n_micro):
                real = i < len(chunks)
                rows = chunks[i] if real else torch.zeros(1, dtype=torch.long)  # zero-weight filler
                with (
                    distributed.no_sync(models.train_policy, models.train_critic) if i < n_micro - 1 else nullcontext(),
                    efficiency.counting("update"),
                ):
                    share = loss_weights(exp.mask[rows], args.loss_agg) / weight if real else torch.zeros(())
                    loss_value, m = loss(
                        models,
                        args,
                        exp,
                        rows.to(models.device),
                        kl_coef,
                        weight=share * world,
                        micro_steps=micro_steps if real else 0,
                        entropy_coef=None if entropy is None else entropy.applied,
                    )
                    loss_value.backward()
                # the optimizer step's whole loss (policy, KL, entropy, value terms; a filler adds 0)
                sums["policy/total_loss"] = sums.get("policy/total_loss", 0) + loss_value.detach() / world
                token_share = exp.mask[rows].sum() / tokens.clamp(min=1) if real else torch.zeros(())
                step_entropy = step_entropy + m["policy/entropy"] * token_share
                for k, v in m.items():
                    if k.endswith("_max"):  # a maximum over micro-batches, minibatches and processes
                        v = v if real else torch.full_like(v, float("-inf"))
                        sums[k] = torch.maximum(sums[k], v) if k in sums else v
                    else:
                        sums[k] = sums.get(k, 0) + v * (share if k.endswith("/loss") else token_share)
            if entropy is not None:  # the step's entropy, token mean over every process's micro-batches (0 on none)
                coefs.append(entropy.update(float(distributed.reduce_sum(step_entropy))))
            sums["perf/grad_norm"] = sums.get("perf/grad_norm", 0) + optimizer_step()["perf/grad_norm"] / world
            n_steps, n_ran = n_steps + 1, n_ran + ran
    out = {}
    for k, v in sums.items():  # the losses and grad norm: per optimizer step; the rest: per minibatch that ran rows
        if k.endswith("/loss") or k in ("perf/grad_norm", "policy/total_loss"):
            out[k] = distributed.reduce_sum(v) / n_steps
        elif k.endswith("_max"):
            v = distributed.reduce_tensor_max(v)
            if n_ran:
                out[k] = v
        elif n_ran:
            out[k] = distributed.reduce_sum(v) / n_ran
    if coefs:
        out["policy/entropy_coef"] = sum(coefs) / len(coefs)
    if skip is not None:
        out["policy/zero_gradient_rows_frac"] = distributed.reduce_sum(skip.sum().float()) / (B * world)
    return out


def micro_batch_split(
    args: MinibatchUpdate, exp: Experience, budget: int | None
) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The micro-batches of a minibatch's rows (``models.micro_batches.split_rows``): at most
    ``micro_batch_size`` rows and ``budget`` tokens (``RLModels.token_budget``: the one of
    ``max_tokens_per_micro_batch``, capped by what fits in memory), a prompt's group kept whole with
    ``share_prompt`` when it fits. Without a budget, consecutive slices of ``micro_batch_size`` rows
    (the whole minibatch when None)."""
    if budget is None:
        return lambda rows: split_rows(rows, None, None, max_rows=args.micro_batch_size)
    rollout = exp.rollout
    T = rollout.response_mask.shape[1]
    lead, tail = row_spans(rollout.attention_mask, T)
    groups = rollout.prompt_index if args.share_prompt else None
    prompt_region = rollout.attention_mask.shape[1] > T
    return lambda rows: split_rows(
        rows, lead, tail, max_rows=args.micro_batch_size, max_tokens=budget, groups=groups, prompt_region=prompt_region
    )


def minibatch_generator(seed: int, step: int) -> torch.Generator:
    """The generator of this step's minibatch order: the same on every process, fixed by the run's
    ``seed`` and ``step`` so a resumed run draws the same order and the rollout's RNG is untouched."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def group_by_prompt(exp: Experience, rows: torch.Tensor, *, share_prompt: bool) -> torch.Tensor:
    """With ``share_prompt``, a minibatch's rows ordered by prompt, so micro-batches hold whole
    groups that pack into one row each (gradient accumulation over a minibatch does not depend on
    the order); else ``rows`` as they are."""
    index = exp.rollout.prompt_index
    if not share_prompt or index is None:
        return rows
    return rows[torch.sort(index[rows.to(index.device)].cpu(), stable=True).indices]


def loss_weights(mask: torch.Tensor, loss_agg: str, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The share of a micro-batch in its minibatch's loss: tokens for ``loss_agg`` token-mean, 1 for
    micro-batch-token-mean (``update`` divides by the step's micro-batches), else rows — ``rows``
    (B,) bool when given (``Experience.counted_rows``), else those with a token."""
    if loss_agg == "token-mean":
        return mask.sum().float()
    if loss_agg == "micro-batch-token-mean":
        return torch.ones(())
    return (rows if rows is not None else mask.sum(-1) > 0).sum().float()


def loss(
    models: RLModels,
    args: UpdateLoss,
    exp: Experience,
    rows: torch.Tensor,
    kl_coef: float,
    *,
    weight: float | torch.Tensor = 1.0,
    micro_steps: int = 1,
    entropy_coef: float | None = None,
):
    """The loss of one micro-batch of phase 6 (``update``) and its metrics: the policy loss
    ``args.policy_loss`` (weighted by the rollout correction), minus the entropy bonus, plus β·KL
    to the reference when the KL is not in the reward, plus λ times the divergence to the teacher
    (``distillation_mode`` 'full': ``models.teacher.teacher_divergence``), plus the critic's value loss. Returns
    ``(loss, metrics)``, ``rows``: the experience's rows of the micro-batch.

    ``weight``: the micro-batch's share of its optimizer step (``update`` backpropagates the loss
    as returned, so it is multiplied in here). The entropy bonus is aggregated as the policy loss
    (``loss_agg``) and weighted alike, unless ``args.entropy_agg`` is ``"micro-batch-token-mean"``
    (TRL's GRPOTrainer): ``entropy_coef x (token mean of this micro-batch's entropy) /
    micro_steps``, whatever ``weight``; ``update`` passes the micro-batches of the optimizer step
    over every process divided by the processes (TRL's ``gradient_accumulation_steps``), so the term
    is the mean of the micro-batches' token means on any number of processes.

    Formulas: the ``POLICY_LOSSES`` of ``rlhfkit/algorithms/loss_registry.py`` (one ``LossInputs``
    and the loss's declared knobs, ``loss_hyperparameters``: config fields or ``loss_options``) and
    the ``KL_ESTIMATORS`` of ``rlhfkit/algorithms/registry.py``
    (``algorithms/policy_losses.py``, with the importance ratio at ``args.importance_sampling_level``;
    ``algorithms/kl.py``), ``aggregate`` and ``value_loss`` in ``algorithms/losses.py``, the
    correction in ``algorithms/rollout_is.py``."""
    coef = args.entropy_coef if entropy_coef is None else entropy_coef
    r = exp.rollout.select(rows)
    mask, adv = exp.mask[rows], exp.advantages[rows]
    horizon = args.loss_horizon or args.max_new_tokens
    logprobs, values, entropy, kept_mass, hidden = models.train_outputs(
        r, with_values=args.use_critic, entropy_grad=coef > 0
    )
    old = exp.old_logprobs[rows] if exp.old_logprobs is not None else logprobs.detach()
    weights, is_metrics = exp.is_weights[rows] if exp.is_weights is not None else None, {}
    if exp.correct_in_loss:  # one on-policy pass: its detached log-probs are the old ones
        weights, _, is_metrics = rollout_correction(args, old, r.logprobs, mask, kept_mass, local=True)
    behaviour = r.logprobs if r.logprobs is not None else old  # the sampler's log-probs
    weights, kept, bonus_mask = token_filters(args, weights, entropy, logprobs, behaviour, adv, mask)
    if kept is not None:
        is_metrics = {**is_metrics, "policy/kept_token_frac": masked_mean(kept.to(logprobs.dtype), mask)}
    inputs = LossInputs(
        logprobs,
        old,
        adv,
        mask,
        agg=args.loss_agg,
        horizon=horizon,
        weights=weights,
        importance_sampling_level=args.importance_sampling_level,
    )
    out = POLICY_LOSSES.get(args.policy_loss)(inputs, **loss_hyperparameters(args.policy_loss, args))
    loss, metrics = out.loss, dict(out.metrics)
    metrics.update(is_metrics, **{"policy/loss": loss.detach()})
    metrics["policy/entropy"] = masked_mean(entropy.detach(), mask)
    per_micro_batch = args.entropy_agg == "micro-batch-token-mean"
    if coef > 0 and not per_micro_batch:
        loss = loss - coef * aggregate(entropy, bonus_mask, args.loss_agg, horizon)
    if exp.ref_logprobs is not None and not args.kl_in_reward:
        kl = KL_ESTIMATORS.get(args.kl_estimator)(logprobs, exp.ref_logprobs[rows])
        loss = loss + kl_coef * aggregate(kl, mask, args.loss_agg, horizon)
        metrics.update(kl_metrics(logprobs, exp.ref_logprobs[rows], mask))
    if models.full_distillation and models.teacher is not None:  # λ D(π ‖ π_teacher), whole vocabulary, each token
        with models.autocast():
            teacher_hidden = models.teacher_hidden(r)
            div = teacher_divergence(
                models.policy, models.teacher, hidden, teacher_hidden, mask, args.distillation_beta, args.temperature
            )
        loss = loss + distillation_weight(args) * aggregate(div, mask, cast(str, args.loss_agg), horizon)
        metrics["distill/divergence"] = masked_mean(div.detach(), mask)
    if args.use_critic:
        v_loss, v_metrics = value_loss(
            values,
            exp.old_values[rows],
            exp.returns[rows],
            mask,
            clip=args.value_clip,
            agg=args.loss_agg,
            horizon=horizon,
        )
        loss = loss + args.vf_coef * v_loss
        metrics.update(v_metrics, **{"critic/loss": v_loss.detach()})
    loss = loss * weight
    if coef > 0 and per_micro_batch and micro_steps:
        loss = loss - coef * masked_mean(entropy, bonus_mask) / micro_steps
    return loss, metrics


def token_filters(args: UpdateLoss, weights, entropy, logprobs, behaviour, advantages, mask):
    """The policy loss's token weights after the config's filters — the high-entropy tokens
    (``top_entropy_quantile`` < 1: ``algorithms.high_entropy_mask`` over the micro-batch) and the
    off-policy sequence mask (``off_policy_mask_threshold``: ``algorithms.off_policy_sequence_mask``
    against the sampler's log-probs, the old ones when the engine is the policy) — multiplied into the
    rollout correction's ``weights`` (None: 1). Returns ``(weights, kept, bonus)``: ``kept`` the (B, T)
    bool of the tokens still weighed, None without a filter (and ``weights`` as given); ``bonus`` the
    tokens of the entropy bonus: the high-entropy ones with that filter (TRL's rule), else ``mask``."""
    if args.top_entropy_quantile == 1.0 and args.off_policy_mask_threshold is None:
        return weights, None, mask
    keep, bonus = torch.ones_like(logprobs), mask
    if args.top_entropy_quantile < 1.0:
        bonus = high_entropy_mask(entropy.detach(), mask, 1.0 - args.top_entropy_quantile)
        keep = keep * bonus.to(keep.dtype)
    if args.off_policy_mask_threshold is not None:
        keep = keep * off_policy_sequence_mask(advantages, logprobs, behaviour, mask, args.off_policy_mask_threshold)
    weights = keep if weights is None else weights * keep
    return weights, (keep != 0) & mask, bonus
