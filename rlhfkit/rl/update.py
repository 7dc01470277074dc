"""Phase 6 of the RL loop (generate → score → make experience → **update**): K passes of
minibatch updates on an experience, and the loss of one micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

from .. import distributed
from ..algorithms import (
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdaptiveEntropyController,
    LossInputs,
    Metric,
    StepMetrics,
    aggregate,
    as_metric,
    global_values,
    high_entropy_mask,
    loss_hyperparameters,
    masked_mean,
    metric_values,
    off_policy_sequence_mask,
    reduce_steps,
    token_mean,
    value_loss,
)
from ..config import takes
from ..config.teacher import distillation_weight
from ..models import efficiency
from ..models.rl_models import RLModels
from ..models.teacher import teacher_divergence
from ..rollout import Rollout
from .advantages import RolloutCorrection, kl_metrics, rollout_correction
from .experience import Experience
from .minibatches import (  # noqa: F401  (group_by_prompt, micro_batch_split: re-exported, the update's own)
    Minibatch,
    MinibatchSplit,
    group_by_prompt,
    loss_weights,
    micro_batch_split,
    minibatch_generator,
    minibatch_rows,
    plan_minibatch,
)


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


@takes("num_iterations", "max_tokens_per_micro_batch", "skip_zero_gradient_rows")
class MinibatchUpdate(UpdateLoss, MinibatchSplit):
    """The fields of ``RLConfig`` that phase 6 reads (``update``): the passes, the token budget of a
    micro-batch, whether rows without gradient run, the split into minibatches and micro-batches
    (``MinibatchSplit``), and the loss's."""


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
    permutation that every process draws alike (``minibatches.minibatch_rows``), so one update of a
    batch gives the same weights on any number of processes; each process trains on its own rows of
    each minibatch, in micro-batches of at most ``micro_batch_size`` rows and the token budget
    (``micro_batch_split``; their number may differ between minibatches and processes). A
    micro-batch's loss is weighted by its share of the global minibatch (tokens for token-mean, rows
    otherwise) times the number of processes (FSDP2 and DDP average gradients over them), so
    accumulation gives the gradient of one batch (``run_minibatch``). Processes with fewer
    micro-batches run zero-weight ones, so every process runs the same number of (collective)
    forward and backward passes.

    Metrics are declared by kind (``algorithms/metrics.py``): each micro-batch reports sufficient
    statistics (a token mean's sum and count, a maximum, a spread's sums of squares), merged over the
    micro-batches of an optimizer step and over the processes, so each logged value is the
    minibatch's own whatever the micro-batch split or process count, averaged over the optimizer
    steps that ran rows (the maximum for a maximum). The TRL-compatible losses (``policy/loss``,
    ``critic/loss``, ``policy/total_loss``: the whole loss each optimizer step minimised — the policy
    loss, the KL and value terms, minus the entropy bonus; TRL's logged ``loss``) and
    ``perf/grad_norm`` are per optimizer step, averaged over every optimizer step.

    Rows without gradient (``zero_gradient_rows``) keep their share of each minibatch's loss
    denominator but are not run; the other metrics average over the rows that ran. A minibatch
    none of whose rows has a gradient still runs one zero-weight pass, so the optimizer steps on
    zero gradients (AdamW's moments and weight decay move, as they would after running the rows).

    ``entropy``: Skywork-OR1's adaptive entropy coefficient (``use_adaptive_entropy``): each step's
    bonus uses its ``applied`` coefficient, and after each optimizer step it is updated with the step's
    entropy (the token mean over every process's micro-batches); ``policy/entropy_coef`` is its mean
    over the optimizer steps. None: ``args.entropy_coef``, fixed.

    ``kl_coef``: β of this step; ``step``: RL steps done (it seeds the minibatch order,
    ``minibatch_generator``); ``optimizer_step``: clips, steps and zeroes the gradients, returning
    ``{"perf/grad_norm": ...}`` (the trainer's, on its run's optimizer). The loss of each
    micro-batch is ``loss``."""
    B, world = exp.mask.shape[0], distributed.role_size()
    gen = minibatch_generator(args.seed, step)
    skip = zero_gradient_rows(args, exp, kl_coef)
    split = micro_batch_split(args, exp, models.token_budget(exp.rollout))
    steps: list[dict[str, Metric]] = []
    ran: list[bool] = []
    coefs: list[float] = []  # the adaptive entropy coefficient after each optimizer step
    for _ in range(args.num_iterations):
        for rows in minibatch_rows(B, args.mini_batch_size, gen):
            mb = plan_minibatch(args, exp, rows, args.loss_agg, skip, split)
            metrics = run_minibatch(models, args, exp, mb, kl_coef, entropy)
            if entropy is not None:
                coefs.append(entropy.update(step_entropy(metrics)))
            metrics.add({"perf/grad_norm": Metric.step(optimizer_step()["perf/grad_norm"])}, 1 / world)
            steps.append(metrics.metrics)
            ran.append(mb.ran)
    out: dict[str, torch.Tensor | float] = {
        **reduce_steps(steps, ran, distributed.reduce_sum, distributed.reduce_tensor_max)
    }
    if coefs:
        out["policy/entropy_coef"] = sum(coefs) / len(coefs)
    if skip is not None:
        out["policy/zero_gradient_rows_frac"] = distributed.reduce_sum(skip.sum().float()) / (B * world)
    return out


def step_entropy(metrics: StepMetrics) -> float:
    """An optimizer step's entropy: the token mean over every process's micro-batches (0 on none)."""
    entropy = {"policy/entropy": metrics.metrics["policy/entropy"]}
    return float(global_values(entropy, distributed.reduce_sum, None)["policy/entropy"])


def run_minibatch(
    models: RLModels,
    args: MinibatchUpdate,
    exp: Experience,
    mb: Minibatch,
    kl_coef: float,
    entropy: AdaptiveEntropyController | None,
) -> StepMetrics:
    """The forward and backward passes of one minibatch (``mb.passes``: this process's micro-batches,
    then zero-weight fillers), the gradients accumulated (synchronised on the last pass); returns
    the step's metrics on this process, each micro-batch's merged (a ``step`` metric by its share)."""
    world = distributed.role_size()
    metrics = StepMetrics()
    for i in range(mb.passes):
        real = i < len(mb.chunks)
        rows = mb.chunks[i] if real else torch.zeros(1, dtype=torch.long)  # zero-weight filler
        sync = nullcontext() if i == mb.passes - 1 else distributed.no_sync(models.train_policy, models.train_critic)
        with sync, efficiency.counting("update"):
            share = loss_weights(exp.mask[rows], args.loss_agg) / mb.weight if real else torch.zeros(())
            value, m = micro_batch_loss(
                models,
                args,
                exp,
                rows.to(models.device),
                kl_coef,
                weight=share * world,
                micro_steps=mb.micro_steps if real else 0,
                entropy_coef=None if entropy is None else entropy.applied,
            )
            value.backward()
        metrics.add(m, share, counted=real)
        # the optimizer step's whole loss (policy, KL, entropy, value terms; a filler adds 0)
        metrics.add({"policy/total_loss": Metric.step(value)}, 1 / world)
    return metrics


def loss(
    models: RLModels,
    args: UpdateLoss,
    exp: Experience,
    rows: torch.Tensor,
    kl_coef: float,
    *,
    weight: float | torch.Tensor = 1.0,
    micro_steps: float = 1,
    entropy_coef: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of one micro-batch of phase 6 and its metrics' values on these rows
    (``micro_batch_loss``, whose ``Metric`` statistics the update merges). Returns ``(loss, metrics)``."""
    value, metrics = micro_batch_loss(
        models, args, exp, rows, kl_coef, weight=weight, micro_steps=micro_steps, entropy_coef=entropy_coef
    )
    return value, metric_values(metrics)


def micro_batch_loss(
    models: RLModels,
    args: UpdateLoss,
    exp: Experience,
    rows: torch.Tensor,
    kl_coef: float,
    *,
    weight: float | torch.Tensor = 1.0,
    micro_steps: float = 1,
    entropy_coef: float | None = None,
) -> tuple[torch.Tensor, dict[str, Metric]]:
    """The loss of one micro-batch of phase 6 (``update``) and its metrics: the policy loss
    ``args.policy_loss`` (weighted by the rollout correction), minus the entropy bonus, plus β·KL
    to the reference when the KL is not in the reward, plus λ times the divergence to the teacher
    (``distillation_mode`` 'full': ``models.teacher.teacher_divergence``), plus the critic's value loss. Returns
    ``(loss, metrics)``, ``rows``: the experience's rows of the micro-batch; ``metrics``: name -> ``Metric``
    (``algorithms/metrics.py``), the losses (``policy/loss``, ``critic/loss``) as ``step`` metrics.

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
    mask = exp.mask[rows]
    horizon = args.loss_horizon or args.max_new_tokens
    logprobs, values, entropy, kept_mass, hidden = models.train_outputs(
        r, with_values=args.use_critic, entropy_grad=coef > 0
    )
    loss, metrics, bonus_mask = policy_term(args, exp, rows, r, logprobs, entropy, kept_mass, horizon)
    metrics["policy/entropy"] = token_mean(entropy, mask)
    per_micro_batch = args.entropy_agg == "micro-batch-token-mean"
    if coef > 0 and not per_micro_batch:
        loss = loss - coef * aggregate(entropy, bonus_mask, args.loss_agg, horizon)
    loss = reference_terms(loss, models, args, exp, rows, r, logprobs, hidden, kl_coef, horizon, metrics)
    if args.use_critic:
        assert exp.old_values is not None and exp.returns is not None  # make_experience gives them with a critic
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
        metrics.update(v_metrics, **{"critic/loss": Metric.step(v_loss)})
    loss = loss * weight
    if coef > 0 and per_micro_batch and micro_steps:
        loss = loss - coef * masked_mean(entropy, bonus_mask) / micro_steps
    return loss, metrics


def policy_term(
    args: UpdateLoss,
    exp: Experience,
    rows: torch.Tensor,
    r: Rollout,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    kept_mass: torch.Tensor | None,
    horizon: int,
) -> tuple[torch.Tensor, dict[str, Metric], torch.Tensor]:
    """The policy loss of a micro-batch (``args.policy_loss`` from ``POLICY_LOSSES``) with the
    rollout correction's weights (computed here in the one on-policy pass, ``Experience.correct_in_loss``)
    and the token filters (``token_filters``). Returns ``(loss, metrics, bonus_mask)``: the loss's
    metrics (``as_metric``) with ``policy/loss``, the correction's and ``policy/kept_token_frac``; the
    tokens of the entropy bonus. ``r``: the rows' rollout (``Rollout.select``)."""
    mask, adv = exp.mask[rows], exp.advantages[rows]
    old = exp.old_logprobs[rows] if exp.old_logprobs is not None else logprobs.detach()
    weights = exp.is_weights[rows] if exp.is_weights is not None else None
    metrics: dict[str, Metric] = {}
    if exp.correct_in_loss:  # one on-policy pass: its detached log-probs are the old ones
        weights, _, metrics = rollout_correction(args, old, r.logprobs, mask, kept_mass, local=True)
    behaviour = r.logprobs if r.logprobs is not None else old  # the sampler's log-probs
    weights, kept, bonus_mask = token_filters(args, weights, entropy, logprobs, behaviour, adv, mask)
    if kept is not None:
        metrics["policy/kept_token_frac"] = token_mean(kept.to(logprobs.dtype), mask)
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
    metrics = {**{k: as_metric(v, mask) for k, v in out.metrics.items()}, **metrics}
    metrics["policy/loss"] = Metric.step(out.loss)
    return out.loss, metrics, bonus_mask


def reference_terms(
    loss: torch.Tensor,
    models: RLModels,
    args: UpdateLoss,
    exp: Experience,
    rows: torch.Tensor,
    r: Rollout,
    logprobs: torch.Tensor,
    hidden: torch.Tensor | None,
    kl_coef: float,
    horizon: int,
    metrics: dict[str, Metric],
) -> torch.Tensor:
    """``loss`` plus β·KL to the reference when the KL is not in the reward (``kl/*`` into
    ``metrics``) and λ times the divergence to the teacher with ``distillation_mode`` 'full'
    (``distill/divergence``)."""
    mask = exp.mask[rows]
    if exp.ref_logprobs is not None and not args.kl_in_reward:
        kl = KL_ESTIMATORS.get(args.kl_estimator)(logprobs, exp.ref_logprobs[rows])
        loss = loss + kl_coef * aggregate(kl, mask, args.loss_agg, horizon)
        metrics.update(kl_metrics(logprobs, exp.ref_logprobs[rows], mask))
    if models.full_distillation and models.teacher is not None:  # λ D(π ‖ π_teacher), whole vocabulary, each token
        assert hidden is not None  # train_outputs gives the hidden states with full_distillation
        with models.autocast():
            teacher_hidden = models.teacher_hidden(r)
            div = teacher_divergence(
                models.policy, models.teacher, hidden, teacher_hidden, mask, args.distillation_beta, args.temperature
            )
        loss = loss + distillation_weight(args) * aggregate(div, mask, args.loss_agg, horizon)
        metrics["distill/divergence"] = token_mean(div, mask)
    return loss


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
