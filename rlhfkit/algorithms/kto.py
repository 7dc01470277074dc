"""Unpaired preference losses: KTO and APO-zero on rows that each hold one completion and a
thumbs-up or thumbs-down label, on sequence log-probabilities (sums over the completion's tokens,
EOS included).

With ``r = log π(y|x) - log π_ref(y|x)`` a row's log-ratio, ``λ_D`` / ``λ_U`` the weights of
desirable / undesirable rows and ``z0`` the reference point (``kto_kl``):

- ``kto``: KTO (Ethayarajh et al. 2024, arXiv:2402.01306, eq. 8, as TRL 1.16 computes it):
  ``λ_D (1 - σ(β (r - z0)))`` for a desirable row, ``λ_U (1 - σ(β (z0 - r)))`` for an undesirable
  one. The paper's ``λ_y - v(x, y)`` is this loss: ``v`` is ``λ_D σ(β (r - z0))`` or
  ``λ_U σ(β (z0 - r))``.
- ``apo_zero_unpaired``: the unpaired APO-zero loss (D'Oosterlinck et al. 2024, arXiv:2408.06266,
  eq. 7 with its two terms apart, as TRL): ``λ_D (1 - σ(β r))`` for a desirable row (raise its
  likelihood) and ``λ_U σ(β r)`` for an undesirable one (lower it); no reference point.

The reference point ``z0`` is KTO's estimate of ``KL(π || π_ref)``: the mean log-ratio of
*mismatched* pairs — each row's prompt with another row's completion of the same batch — clamped
at 0 and detached (the paper: no gradient flows through it; it only shifts the sigmoid).

The implicit rewards (TRL's ``rewards/chosen``, ``rewards/rejected``) are ``β r``, detached.
Each loss is an entry of ``KTO_LOSS_TYPES`` declaring whether it reads ``z0`` (trait ``kl``); a
new unpaired loss is one entry.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._checks import check_same_shape, check_tensor
from .registry import Registry

# ``f(logratios, z0, *, beta) -> (desirable losses, undesirable losses)``, each (B,) and unweighted.
KTO_LOSS_TYPES = Registry("KTO loss", ("logratios", "z0"), ("beta",), traits=("kl",))


@KTO_LOSS_TYPES.register("kto", kl=True)
def _kto(logratios, z0, *, beta):
    return 1 - torch.sigmoid(beta * (logratios - z0)), 1 - torch.sigmoid(beta * (z0 - logratios))


@KTO_LOSS_TYPES.register("apo_zero_unpaired", kl=False)
def _apo_zero_unpaired(logratios, z0, *, beta):
    return 1 - torch.sigmoid(beta * logratios), torch.sigmoid(beta * logratios)


def kto_needs_kl(loss_type: str) -> bool:
    """Whether ``loss_type`` reads the reference point ``z0`` (then the batch's mismatched pairs are scored)."""
    return KTO_LOSS_TYPES.traits(loss_type)["kl"]


def kto_kl(
    kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """KTO's reference point ``z0 = max(0, mean(kl_logps - ref_kl_logps))``, detached, a 0-dim tensor.

    ``kl_logps`` / ``ref_kl_logps`` (B,): the policy's and the reference's summed log-probs of the
    mismatched pairs (row i's prompt with another row's completion). ``reduce``: sums a tensor over
    the processes that share the batch (``distributed.reduce_sum``), so the mean is the whole
    batch's; None: these rows are the whole batch. An empty batch (every process) gives 0."""
    check_tensor("kl_logps", kl_logps, ndim=1)
    check_same_shape(kl_logps=kl_logps, ref_kl_logps=ref_kl_logps)
    dtype = torch.promote_types(kl_logps.dtype, torch.float32)
    ratios = kl_logps.detach().to(dtype) - ref_kl_logps.detach().to(dtype)
    total = torch.stack([ratios.sum(), torch.tensor(float(ratios.numel()), dtype=dtype, device=ratios.device)])
    if reduce is not None:
        total = reduce(total)
    return (total[0] / total[1].clamp(min=1)).clamp(min=0)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    z0: torch.Tensor | float = 0.0,
    *,
    beta: float = 0.1,
    loss_type: str = "kto",
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row losses (B,) — each weighted by ``desirable_weight`` or ``undesirable_weight`` — and
    implicit rewards ``β r`` (B,, detached) of ``loss_type`` (see the module docstring).

    ``logps``, ``ref_logps`` (B,): summed completion log-probs of the policy and the reference
    (no gradient reaches the reference); ``labels`` (B,) bool: True for a desirable completion;
    ``z0``: the reference point (``kto_kl``), read by ``kto`` only. TRL's loss of a batch is the
    mean of these losses. Computed in float32 (or the inputs' wider dtype)."""
    if loss_type not in KTO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(KTO_LOSS_TYPES)}, got {loss_type!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    for name, weight in (("desirable_weight", desirable_weight), ("undesirable_weight", undesirable_weight)):
        if not weight >= 0:
            raise ValueError(f"{name} must be >= 0, got {weight!r}")
    check_tensor("logps", logps, ndim=1)
    labels = torch.as_tensor(labels, device=logps.device)
    if labels.dtype != torch.bool:
        raise ValueError(f"labels must be a bool tensor (True: desirable), got dtype {labels.dtype}")
    check_same_shape(logps=logps, ref_logps=ref_logps, labels=labels)
    dtype = torch.promote_types(logps.dtype, torch.float32)
    logratios = logps.to(dtype) - ref_logps.detach().to(dtype)
    z0 = torch.as_tensor(z0, dtype=dtype, device=logps.device).detach()
    desirable, undesirable = KTO_LOSS_TYPES.get(loss_type)(logratios, z0, beta=beta)
    losses = torch.where(labels, desirable_weight * desirable, undesirable_weight * undesirable)
    return losses, (beta * logratios).detach()
