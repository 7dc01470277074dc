"""``aggregate`` (the one place where a (B, T) loss matrix becomes a scalar), the clipped value
loss and the reward model's Bradley–Terry loss. The policy losses are in ``policy_losses.py``.

All losses are negated objectives (for gradient descent) and return ``(loss, metrics)`` where
``metrics`` holds, for the value loss, ``Metric`` statistics of declared kinds (``metrics.py``), and for
the reward model's loss detached 0-d tensors (no ``.item()``; the caller decides when to synchronise).
"""

from __future__ import annotations

import torch

from ._checks import check_mask, check_same_shape, check_tensor, masked_mean, masked_sum
from .logprobs import entropy_from_logits  # noqa: F401  (re-exported: the entropy bonus lives with the losses)
from .metrics import explained_variance, token_mean

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
    "micro-batch-token-mean",
)


def aggregate(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", horizon: int | None = None):
    """Reduce a per-token loss ``loss_mat`` (B, T) under ``mask`` (B, T) to a scalar.

    - ``token-mean``: ``Σ(l·m) / Σm`` — every token weighs the same (DAPO, arXiv:2503.14476).
    - ``seq-mean-token-mean``: mean over rows of ``Σ_t(l·m) / Σ_t m`` — every sequence weighs the
      same (original GRPO).
    - ``seq-mean-token-sum``: mean over rows of ``Σ_t(l·m)`` — the bandit form of REINFORCE/RLOO,
      where a sequence's log-probability is the sum of its tokens'.
    - ``seq-mean-token-sum-norm``: ``Σ(l·m) / (B · horizon)`` with a constant ``horizon``
      (Dr.GRPO, arXiv:2503.20783; defaults to T), free of any length bias.
    - ``micro-batch-token-mean``: ``token-mean`` of the one micro-batch given; the update then
      weighs every micro-batch of an optimizer step alike (``rl/update.py``), so each token weighs
      ``1 / (tokens of its micro-batch x micro-batches)`` — TRL's ``loss_type="bnpo"``, whose
      normaliser is the local batch's token count.

    Rows without any unmasked token count for nothing: they are left out of the "mean over rows"
    and of ``B``, so adding them never changes the result, and an all-zero mask gives 0, not NaN.
    """
    check_tensor("loss_mat", loss_mat, ndim=2)
    m = check_mask(mask, loss_mat.shape, "mask")
    if mode in ("token-mean", "micro-batch-token-mean"):
        return masked_mean(loss_mat, m)
    row_tokens = m.sum(dim=1)
    n_rows = (row_tokens > 0).sum().clamp(min=1).to(loss_mat.dtype)
    row_sums = masked_sum(loss_mat, m, dim=1)
    if mode == "seq-mean-token-mean":
        return (row_sums / row_tokens.clamp(min=1).to(loss_mat.dtype)).sum() / n_rows
    if mode == "seq-mean-token-sum":
        return row_sums.sum() / n_rows
    if mode == "seq-mean-token-sum-norm":
        horizon = loss_mat.shape[1] if horizon is None else horizon
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        return row_sums.sum() / (n_rows * horizon)
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(AGGREGATIONS)}")


def corrected_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    mode: str = "token-mean",
    horizon: int | None = None,
) -> torch.Tensor:
    """The rollout correction around a per-token policy loss: ``loss_mat`` (B, T) times the
    correction's ``weights`` (B, T) — detached (constants of the loss) and 0 off the mask (a NaN there
    would otherwise reach the gradient of the padding); None: 1 — then ``aggregate``d. The one place
    the weights meet a loss: ``POLICY_LOSSES`` applies it around every loss that does not declare it
    applies them itself (``loss_registry.py``), and the built-in losses' scalar forms call it."""
    m = check_mask(mask, loss_mat.shape, "mask")
    if weights is not None:
        check_tensor("weights", weights)
        if tuple(weights.shape) != tuple(loss_mat.shape):
            raise ValueError(f"weights must have shape {tuple(loss_mat.shape)}, got {tuple(weights.shape)}")
        zero = torch.zeros((), dtype=weights.dtype, device=weights.device)
        loss_mat = loss_mat * torch.where(m, weights.detach(), zero)
    return aggregate(loss_mat, m, mode, horizon)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip: float | None = None,
    agg: str = "token-mean",
    horizon: int | None = None,
):
    """Critic loss ``0.5 · max((v - R)^2, (v_clipped - R)^2)`` with
    ``v_clipped = old_v + clip(v - old_v, -clip, clip)`` (``cliprange_value`` of Ziegler et al.
    2019 / "The N Implementation Details of RLHF with PPO"); ``clip=None`` gives ``0.5 (v - R)^2``.

    Args: (B, T) tensors. Returns ``(loss, metrics)``: ``critic/value_clip_frac``,
    ``critic/values_mean`` (token means), ``critic/explained_variance`` (``1 - Var(R - v) / Var(R)``,
    0 for constant returns; ``metrics.explained_variance``).
    """
    check_same_shape(values=values, old_values=old_values, returns=returns)
    check_tensor("values", values, ndim=2)
    mask = check_mask(response_mask, values.shape)
    err = (values - returns).square()
    if clip is None:
        loss_mat, clipped = 0.5 * err, torch.zeros_like(err)
    else:
        if clip <= 0:
            raise ValueError(f"value clip must be > 0 or None, got {clip}")
        v_clipped = old_values + (values - old_values).clamp(-clip, clip)
        err_clipped = (v_clipped - returns).square()
        loss_mat = 0.5 * torch.maximum(err, err_clipped)
        clipped = (err_clipped > err).to(values.dtype)
    loss = aggregate(loss_mat, mask, agg, horizon)
    with torch.no_grad():
        metrics = {
            "critic/value_clip_frac": token_mean(clipped, mask),
            "critic/values_mean": token_mean(values, mask),
            "critic/explained_variance": explained_variance(returns, values, mask),
        }
    return loss, metrics


def bradley_terry_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    center_coefficient: float | None = None,
):
    """Pairwise reward-model loss: the negative log-likelihood of the Bradley–Terry model
    (Bradley & Terry 1952; the reward-model loss of Ouyang et al. 2022, arXiv:2203.02155, eq. 1):

    ``loss = mean_i -log σ(r_c,i - r_r,i - m_i)``

    with the margin ``m_i`` of Llama 2 (Touvron et al. 2023, arXiv:2307.09288, eq. 2): a pair
    labelled "much better" must be separated by at least about ``m`` before its loss fades.
    ``margin=None`` is ``m = 0``; a float applies to every pair; a (B,) tensor is per pair.
    ``center_coefficient`` c adds ``c * mean_i (r_c,i + r_r,i)²``, which pulls the scores toward 0
    (Eisenstein et al. 2023, arXiv:2312.09244; TRL's ``center_rewards_coefficient``); None: off.

    Args: ``chosen``, ``rejected`` (B,) rewards of the preferred and the other completion.
    Returns ``(loss, metrics)``: ``rm/accuracy`` (share of pairs with ``r_c > r_r``; a tie counts
    as wrong), ``rm/margin_mean`` (mean ``r_c - r_r``), ``rm/chosen_mean``, ``rm/rejected_mean``,
    ``rm/reward_mean`` and ``rm/reward_std`` (over all 2B rewards, unbiased std).
    """
    check_same_shape(chosen=chosen, rejected=rejected)
    check_tensor("chosen", chosen, ndim=1)
    if chosen.shape[0] == 0:
        raise ValueError("bradley_terry_loss needs at least one pair, got chosen of shape (0,)")
    diff = chosen - rejected
    if margin is not None:
        if isinstance(margin, torch.Tensor) and tuple(margin.shape) not in ((), tuple(chosen.shape)):
            raise ValueError(f"margin must be a number or have shape {tuple(chosen.shape)}, got {tuple(margin.shape)}")
        diff = diff - margin
    # logsigmoid, not log(sigmoid(.)): finite for any difference (log σ(-100) would be -inf in float32).
    loss = -torch.nn.functional.logsigmoid(diff).mean()
    if center_coefficient is not None:
        loss = loss + center_coefficient * ((chosen + rejected) ** 2).mean()
    with torch.no_grad():
        both = torch.cat([chosen, rejected])
        metrics = {
            "rm/accuracy": (chosen > rejected).to(chosen.dtype).mean(),
            "rm/margin_mean": (chosen - rejected).mean(),
            "rm/chosen_mean": chosen.mean(),
            "rm/rejected_mean": rejected.mean(),
            "rm/reward_mean": both.mean(),
            "rm/reward_std": both.std(),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}
