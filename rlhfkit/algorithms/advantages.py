"""Advantage estimators: GAE (per token), group-relative (GRPO / Dr.GRPO), leave-one-out (RLOO),
REINFORCE baselines, and masked whitening.

Shapes follow docs/architecture.md ("Notation"): ``B`` sequences, ``T`` response positions, ``G`` = ``group_size``; rows
``g*G .. g*G+G-1`` share prompt ``g``. Sequence-level estimators return ``(B,)``; the caller
broadcasts them over the response tokens.
"""

from __future__ import annotations

import torch

from ._checks import check_groups, check_mask, check_same_shape, check_tensor, masked_mean, masked_sum


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, eq. 11–16).

    ``δ_t = r_t + γ V_{t+1} - V_t`` and ``A_t = δ_t + γλ A_{t+1}``, run backwards over the response
    positions of each row. Masked positions are skipped whatever they hold (NaN included): the
    "next" step of a response token is the next *unmasked* position, and the value after the last
    response token is 0 (the episode ends there). No whitening happens here.

    Args: ``token_rewards``, ``values``, ``response_mask`` of shape (B, T).
    Returns: ``(advantages, returns)``, both (B, T), with ``returns = advantages + values`` on
    response tokens and 0 on masked positions.
    """
    check_same_shape(token_rewards=token_rewards, values=values)
    check_tensor("token_rewards", token_rewards, ndim=2)
    mask = check_mask(response_mask, token_rewards.shape)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    rewards = torch.where(mask, token_rewards, zero)
    vals = torch.where(mask, values, zero)

    B, T = rewards.shape
    advantages = torch.zeros_like(vals)
    next_value = torch.zeros(B, dtype=vals.dtype, device=vals.device)
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        adv_t = delta + gamma * lam * next_adv
        # On a masked position nothing changes: the recursion carries over it untouched.
        advantages[:, t] = torch.where(m, adv_t, zero)
        next_value = torch.where(m, vals[:, t], next_value)
        next_adv = torch.where(m, adv_t, next_adv)
    returns = torch.where(mask, advantages + vals, zero)
    return advantages, returns


def group_advantages(
    scores: torch.Tensor, group_size: int, scale: str = "std", eps: float = 1e-6, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024, arXiv:2402.03300, §4.1.2).

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with the unbiased sample std of the ``G`` rewards of
    the group (as TRL and verl). ``scale="none"`` is Dr.GRPO (Liu et al. 2025, arXiv:2503.20783):
    ``A_i = r_i - mean_g``, removing the question-difficulty bias of the std division.

    ``valid`` (B,) bool, optional: only valid samples enter their group's mean and std, so the
    result on valid rows equals that of the batch with the invalid rows removed; invalid rows, and
    every row of a group with fewer than 2 valid samples (no baseline), get 0.

    Args: ``scores`` (B,), B divisible by ``group_size`` ≥ 2. Returns: (B,).
    """
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    grouped, ok, n = _grouped_valid(scores, group_size, valid)
    zero = torch.zeros((), dtype=grouped.dtype, device=grouped.device)
    mean = torch.where(ok, grouped, zero).sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = torch.where(ok, grouped - mean, zero)
    if scale == "std":
        std = (centred.square().sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
        centred = centred / (std + eps)
    return torch.where(n >= 2, centred, zero).reshape(-1)


def group_normalized_sum(
    per_function: torch.Tensor, weights: torch.Tensor, group_size: int, eps: float = 1e-4
) -> torch.Tensor:
    """GDPO's multi-reward aggregation (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization
    Policy Optimization for Multi-reward RL Optimization", arXiv:2601.05242; TRL's
    ``multi_objective_aggregation="normalize_then_sum"``): each reward function's scores normalised
    within each group, ``(r_k - mean_g,k) / (std_g,k + eps)`` (unbiased std over the group's scored
    samples), then summed with the ``weights`` — so a function with a larger scale does not drown the
    others' signal, as it does in the weighted sum normalised after.

    ``per_function`` (B, F): NaN where a function did not score a sample (left out of its group's
    statistics and of the sum); ``weights`` (F,). Returns (B,): NaN where no function scored. A group
    whose function scored fewer than two samples contributes 0 for it (no spread to normalise by).
    """
    check_tensor("per_function", per_function, ndim=2)
    n_groups = check_groups(per_function.shape[0], group_size, "per_function")
    grouped = per_function.reshape(n_groups, group_size, -1)
    ok = ~torch.isnan(grouped)
    zero = torch.zeros((), dtype=grouped.dtype, device=grouped.device)
    n = ok.sum(1, keepdim=True).to(grouped.dtype)
    mean = torch.where(ok, grouped, zero).sum(1, keepdim=True) / n.clamp(min=1)
    centred = torch.where(ok, grouped - mean, zero)
    std = (centred.square().sum(1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
    normalised = torch.where(ok & (n >= 2), centred / (std + eps), zero)
    total = (normalised * weights.to(grouped.dtype)).sum(-1).reshape(-1)
    scored = ok.reshape(per_function.shape).any(-1)
    return torch.where(scored, total, torch.full_like(total, float("nan")))


def group_batch_std_advantages(
    scores: torch.Tensor, group_size: int, eps: float = 1e-6, valid: torch.Tensor | None = None, reduce=None
) -> torch.Tensor:
    """Group-centred advantages scaled by the *batch's* reward std (Liu et al. 2025, "Part I: Tricks or
    Traps? A Deep Dive into RL for LLM Reasoning", arXiv:2508.08221, §4.1, the "group mean, batch
    std" normalisation of their Lite PPO; TRL's ``scale_rewards="batch"``):

    ``A_i = (r_i - mean_g) / (std_batch + eps)``, ``std_batch`` the unbiased std of every valid
    reward of the batch — over every process's rows with ``reduce`` (``distributed.reduce_sum``).

    Like ``group_advantages``, invalid rows and the rows of a group with fewer than 2 valid samples
    get 0. Args: ``scores`` (B,), B divisible by ``group_size`` ≥ 2. Returns: (B,).
    """
    centred = group_advantages(scores, group_size, scale="none", valid=valid)
    ok = torch.ones_like(scores, dtype=torch.bool) if valid is None else check_mask(valid, scores.shape, "valid")
    _, std, _ = _batch_mean_std(scores, ok, reduce)
    return centred / (std + eps)


def rloo_advantages(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    ``A_i = r_i - (1/(G-1)) Σ_{j≠i} r_j``, which equals ``G/(G-1) (r_i - mean_g)``. With ``valid``
    (B,) bool, the sum and G run over the valid samples of the group only; invalid rows, and every
    row of a group with fewer than 2 valid samples, get 0.

    Args: ``scores`` (B,), B divisible by ``group_size`` ≥ 2. Returns: (B,).
    """
    grouped, ok, n = _grouped_valid(scores, group_size, valid)
    zero = torch.zeros((), dtype=grouped.dtype, device=grouped.device)
    kept = torch.where(ok, grouped, zero)
    baseline = (kept.sum(dim=1, keepdim=True) - kept) / (n - 1).clamp(min=1)
    return torch.where(ok & (n >= 2), grouped - baseline, zero).reshape(-1)


def standardize(x: torch.Tensor, valid: torch.Tensor | None = None, eps: float = 1e-4, reduce=None) -> torch.Tensor:
    """``(x_i - mean) / (std + eps)`` over the valid entries of the (B,) ``x`` (unbiased std; over
    every process's rows with ``reduce``), 0 on the others: TRL's ``RLOOTrainer`` with
    ``normalize_advantages=True`` standardises its sequence advantages so (whitening by sequence, not
    by token as ``whiten`` over a (B, T) mask weighs them). Fewer than two valid entries: 0."""
    check_tensor("x", x, ndim=1)
    ok = torch.ones_like(x, dtype=torch.bool) if valid is None else check_mask(valid, x.shape, "valid")
    mean, std, count = _batch_mean_std(x, ok, reduce)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(ok & (count >= 2), (x - mean) / (std + eps), zero)


def _batch_mean_std(x: torch.Tensor, ok: torch.Tensor, reduce=None) -> tuple:
    """``(mean, unbiased std, count)`` of the entries of the (B,) ``x`` where ``ok``, over every
    process's rows with ``reduce`` (``distributed.reduce_sum``)."""
    total = torch.stack([masked_sum(x, ok), ok.sum().to(x.dtype)])
    total = total if reduce is None else reduce(total)
    mean = total[0] / total[1].clamp(min=1)
    squares = masked_sum((x - mean).square(), ok)
    squares = squares if reduce is None else reduce(squares)
    return mean, (squares / (total[1] - 1).clamp(min=1)).sqrt(), total[1]


def reinforce_advantages(
    scores: torch.Tensor, baseline="batch_mean", valid: torch.Tensor | None = None, reduce=None
) -> torch.Tensor:
    """REINFORCE with a baseline (Williams 1992; reference "REINFORCE and RLOO for LLMs").

    ``A_i = r_i - b`` where ``b`` is the batch mean (``"batch_mean"``), nothing (``"none"``), or a
    number / 0-d tensor the caller holds (e.g. a running mean across steps). With ``valid`` (B,)
    bool, the batch mean runs over the valid samples only and invalid rows get 0. ``reduce``: sums a
    tensor over the processes that share the batch (``distributed.reduce_sum``; None: this batch is
    the whole batch), so the mean is the global batch's.

    Args: ``scores`` (B,). Returns: (B,).
    """
    check_tensor("scores", scores, ndim=1)
    ok = torch.ones_like(scores, dtype=torch.bool) if valid is None else check_mask(valid, scores.shape, "valid")
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    if isinstance(baseline, str):
        if baseline == "batch_mean":
            total = torch.stack([masked_sum(scores, ok), ok.sum().to(scores.dtype)])
            total = total if reduce is None else reduce(total)
            baseline = total[0] / total[1].clamp(min=1)
        elif baseline == "none":
            baseline = zero
        else:
            raise ValueError(f"baseline must be 'batch_mean', 'none' or a number, got {baseline!r}")
    elif isinstance(baseline, torch.Tensor) and baseline.numel() != 1:
        raise ValueError(f"baseline tensor must hold one number, got shape {tuple(baseline.shape)}")
    return torch.where(ok, scores - baseline, zero)


def whiten(
    x: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True, eps: float = 1e-8, reduce=None
) -> torch.Tensor:
    """Masked whitening ``(x - mean) / sqrt(var + eps)`` over the positions in ``mask``.

    The variance is the unbiased (Bessel-corrected) one, as in TRL's ``masked_whiten``.
    ``shift_mean=False`` adds the mean back, so only the scale changes (used for PPO rewards).
    Masked positions come back as 0. Needs at least 2 unmasked values. ``reduce``: sums a tensor
    over the processes that share the batch (``distributed.reduce_sum``), so mean and variance are
    the global batch's; None: ``x`` is the whole batch.

    Args: ``x`` of any shape, ``mask`` of the same shape or None. Returns: same shape as ``x``.
    """
    check_tensor("x", x)
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else check_mask(mask, x.shape, "mask")
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if reduce is None:
        count = m.sum()
        mean = masked_mean(x, m)
    else:
        total = reduce(torch.stack([masked_sum(x, m), m.sum().to(x.dtype)]))
        count, mean = total[1], total[0] / total[1].clamp(min=1)
    if bool(count < 2):
        raise ValueError(f"whiten needs at least 2 unmasked values, got {int(count)} in shape {tuple(x.shape)}")
    centred = torch.where(m, x - mean, zero)
    squares = masked_sum(centred.square(), m)
    var = (squares if reduce is None else reduce(squares)) / (count - 1).to(x.dtype)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros((), dtype=x.dtype, device=x.device))


def broadcast_sequence_advantages(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence-level advantages → (B, T), equal on every response token and 0 elsewhere."""
    check_tensor("advantages", advantages, ndim=1)
    check_tensor("response_mask", response_mask, ndim=2)
    mask = check_mask(response_mask, (advantages.shape[0], response_mask.shape[1]))
    return torch.where(mask, advantages[:, None], torch.zeros((), dtype=advantages.dtype, device=advantages.device))


def _grouped_valid(scores: torch.Tensor, group_size: int, valid: torch.Tensor | None):
    """``(scores (n_groups, G), valid (n_groups, G) bool, valid count per group (n_groups, 1))``."""
    check_tensor("scores", scores, ndim=1)
    n_groups = check_groups(scores.shape[0], group_size)
    ok = torch.ones_like(scores, dtype=torch.bool) if valid is None else check_mask(valid, scores.shape, "valid")
    ok = ok.reshape(n_groups, group_size)
    return scores.reshape(n_groups, group_size), ok, ok.sum(dim=1, keepdim=True).to(scores.dtype)
