"""Preference losses without a reward model: DPO and its descendants, on per-pair sequence
log-probabilities (sums over the completion's tokens, EOS included).

With ``h = (c - r) - (c_ref - r_ref)`` — the policy's log-ratio of chosen over rejected minus the
reference's — every loss below is a function of ``β h`` or a length-normalised cousin:

- ``sigmoid``: DPO (Rafailov et al. 2023, arXiv:2305.18290, eq. 7), ``-log σ(β h)``; with
  ``label_smoothing`` ε, conservative DPO (Mitchell 2023, "A note on DPO with noisy
  preferences"): ``-(1-ε) log σ(β h) - ε log σ(-β h)`` — the expected DPO loss when each label is
  flipped with probability ε.
- ``hinge``: SLiC's calibration loss (Zhao et al. 2023, arXiv:2305.10425, eq. 3) with the
  reference log-ratio subtracted (as TRL): ``max(0, 1 - β h)``.
- ``ipo``: IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17; β plays τ): ``(h̄ - 1/(2β))²`` where
  ``h̄`` uses log-probs divided by the completion lengths (as TRL computes IPO).
- ``simpo``: SimPO (Meng et al. 2024, arXiv:2405.14734, eq. 6), reference-free and
  length-normalised: ``-log σ(β c/|c| - β r/|r| - γ)``.
- ``robust``: robust DPO (Chowdhury et al. 2024, arXiv:2403.00409, eq. 7), unbiased under labels
  flipped with probability ε (``label_smoothing``): ``((1-ε) ℓ(h) - ε ℓ(-h)) / (1 - 2ε)``,
  ``ℓ(h) = -log σ(β h)``.

With ``c̃ = c - c_ref`` and ``r̃ = r - r_ref`` (each completion's own log-ratio), losses that score the
two completions apart rather than only their difference:

- ``nca_pair``: NCA (Chen et al. 2024, arXiv:2402.05369, eq. 12 for K = 2):
  ``-log σ(β c̃) - ½ log σ(-β c̃) - ½ log σ(-β r̃)``.
- ``sppo_hard``: SPPO (Wu et al. 2024, arXiv:2405.00675, eq. 4.7) with the hard win probability (1
  for the chosen, 0 for the rejected): ``(c̃ - 1/(2β))² + (r̃ + 1/(2β))²``.
- ``apo_zero``, ``apo_down``: anchored preference optimisation (D'Oosterlinck et al. 2024,
  arXiv:2408.06266, eqs. 5–6): ``1 - σ(β c̃) + σ(β r̃)`` (raise the chosen, lower the rejected)
  and ``σ(β c̃) + 1 - σ(β (c̃ - r̃))`` (lower both, the rejected more).

The implicit rewards (TRL's ``rewards/chosen`` and ``rewards/rejected``) are ``β (c - c_ref)`` and
``β (r - r_ref)`` — on the length-normalised log-probs for ``ipo`` — and ``β c/|c|``, ``β r/|r|``
for ``simpo``; they are returned detached. The reference log-probs are detached too: the
reference is a fixed baseline, and no gradient reaches it.

Each loss is an entry of the ``DPO_LOSS_TYPES`` registry (``registry.Registry``) declaring what it
needs as traits; ``dpo_loss`` checks the arguments against them, so a new loss is one entry.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import check_same_shape, check_tensor
from .registry import Registry

# ``f(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing, simpo_gamma) -> losses (B,)``
# on the log-probs (per token when the loss is ``length_normalised``; the reference ones None when
# it takes no ``reference``).
DPO_LOSS_TYPES = Registry(
    "DPO loss",
    ("chosen", "rejected", "ref_chosen", "ref_rejected"),
    ("beta", "label_smoothing", "simpo_gamma"),
    traits=("reference", "length_normalised", "smoothing"),
)


def _margin(chosen, rejected, ref_chosen, ref_rejected):
    """``h``: the policy's log-ratio of chosen over rejected minus the reference's."""
    return (chosen - rejected) - (ref_chosen - ref_rejected)


@DPO_LOSS_TYPES.register("sigmoid", reference=True, length_normalised=False, smoothing=True)
def _sigmoid(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    h = _margin(chosen, rejected, ref_chosen, ref_rejected)
    losses = -(1 - label_smoothing) * F.logsigmoid(beta * h)
    if label_smoothing:
        losses = losses - label_smoothing * F.logsigmoid(-beta * h)
    return losses


@DPO_LOSS_TYPES.register("ipo", reference=True, length_normalised=True, smoothing=False)
def _ipo(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    return (_margin(chosen, rejected, ref_chosen, ref_rejected) - 1 / (2 * beta)) ** 2


@DPO_LOSS_TYPES.register("hinge", reference=True, length_normalised=False, smoothing=False)
def _hinge(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    return torch.relu(1 - beta * _margin(chosen, rejected, ref_chosen, ref_rejected))


@DPO_LOSS_TYPES.register("simpo", reference=False, length_normalised=True, smoothing=False)
def _simpo(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=0.5):
    return -F.logsigmoid(beta * chosen - beta * rejected - simpo_gamma)


@DPO_LOSS_TYPES.register("robust", reference=True, length_normalised=False, smoothing=True)
def _robust(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    h = _margin(chosen, rejected, ref_chosen, ref_rejected)
    eps = label_smoothing
    return (-(1 - eps) * F.logsigmoid(beta * h) + eps * F.logsigmoid(-beta * h)) / (1 - 2 * eps)


@DPO_LOSS_TYPES.register("nca_pair", reference=True, length_normalised=False, smoothing=False)
def _nca_pair(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    c, r = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
    return -F.logsigmoid(c) - 0.5 * F.logsigmoid(-c) - 0.5 * F.logsigmoid(-r)


@DPO_LOSS_TYPES.register("sppo_hard", reference=True, length_normalised=False, smoothing=False)
def _sppo_hard(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    return (chosen - ref_chosen - 0.5 / beta) ** 2 + (rejected - ref_rejected + 0.5 / beta) ** 2


@DPO_LOSS_TYPES.register("apo_zero", reference=True, length_normalised=False, smoothing=False)
def _apo_zero(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    return 1 - torch.sigmoid(beta * (chosen - ref_chosen)) + torch.sigmoid(beta * (rejected - ref_rejected))


@DPO_LOSS_TYPES.register("apo_down", reference=True, length_normalised=False, smoothing=False)
def _apo_down(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, simpo_gamma=None):
    h = _margin(chosen, rejected, ref_chosen, ref_rejected)
    return torch.sigmoid(beta * (chosen - ref_chosen)) + 1 - torch.sigmoid(beta * h)


def dpo_loss(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps=None,
    ref_rejected_logps=None,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    chosen_lengths=None,
    rejected_lengths=None,
):
    """Per-pair losses (B,) and implicit rewards (B,), (B,) of ``loss_type`` (see the module
    docstring). Log-probs are (B,) sums over each completion's tokens; ``*_lengths`` (B,) their
    token counts, needed by ``ipo`` and ``simpo``; the reference log-probs are needed by every
    loss but ``simpo``, which refuses them (nothing is silently ignored). Computed in float32
    (or the inputs' wider dtype)."""
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {loss_type!r}")
    loss, traits = DPO_LOSS_TYPES.get(loss_type), DPO_LOSS_TYPES.traits(loss_type)
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if label_smoothing and not traits["smoothing"]:
        takes = " or ".join(f"loss_type={n!r}" for n in DPO_LOSS_TYPES if DPO_LOSS_TYPES.traits(n)["smoothing"])
        raise ValueError(f"label_smoothing applies to {takes} only, got loss_type={loss_type!r}")
    with_ref = ref_chosen_logps is not None or ref_rejected_logps is not None
    if not traits["reference"] and with_ref:
        raise ValueError(f"loss_type={loss_type!r} is reference-free: pass no reference log-probs")
    if traits["reference"] and (ref_chosen_logps is None or ref_rejected_logps is None):
        raise ValueError(f"loss_type={loss_type!r} needs ref_chosen_logps and ref_rejected_logps")
    normalised = traits["length_normalised"]
    if normalised and (chosen_lengths is None or rejected_lengths is None):
        raise ValueError(f"loss_type={loss_type!r} needs chosen_lengths and rejected_lengths (completion tokens)")
    tensors = {"chosen_logps": chosen_logps, "rejected_logps": rejected_logps}
    if with_ref:
        tensors.update(ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    if normalised:
        tensors.update(
            chosen_lengths=torch.as_tensor(chosen_lengths), rejected_lengths=torch.as_tensor(rejected_lengths)
        )
    check_tensor("chosen_logps", chosen_logps, ndim=1)
    check_same_shape(**tensors)
    dtype = torch.promote_types(chosen_logps.dtype, torch.float32)
    c, r = chosen_logps.to(dtype), rejected_logps.to(dtype)
    # The reference is a fixed baseline: no gradient reaches it, whatever its inputs require.
    c_ref = ref_chosen_logps.detach().to(dtype) if with_ref else None
    r_ref = ref_rejected_logps.detach().to(dtype) if with_ref else None
    if normalised:  # mean log-prob per token
        n_c, n_r = tensors["chosen_lengths"].to(c), tensors["rejected_lengths"].to(c)
        c, r = c / n_c, r / n_r
        if with_ref:
            c_ref, r_ref = c_ref / n_c, r_ref / n_r
    losses = loss(c, r, c_ref, r_ref, beta=beta, label_smoothing=label_smoothing, simpo_gamma=simpo_gamma)
    if not with_ref:  # reference-free: the implicit rewards are the scaled log-probs themselves
        return losses, (beta * c).detach(), (beta * r).detach()
    return losses, (beta * (c - c_ref)).detach(), (beta * (r - r_ref)).detach()
