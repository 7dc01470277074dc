"""Preference losses without a reward model: DPO and its descendants, on per-pair sequence
log-probabilities (sums over the completion's tokens, EOS included).

With ``c̃ = c - c_ref`` and ``r̃ = r - r_ref`` (each completion's log-ratio of policy over reference)
and ``h = c̃ - r̃``, losses of the margin ``h``:

- ``sigmoid``: DPO (Rafailov et al. 2023, arXiv:2305.18290, eq. 7), ``-log σ(β h)``; with
  ``label_smoothing`` ε, conservative DPO (Mitchell 2023, "A note on DPO with noisy
  preferences"): ``-(1-ε) log σ(β h) - ε log σ(-β h)`` — the expected DPO loss when each label is
  flipped with probability ε.
- ``hinge``: SLiC's calibration loss (Zhao et al. 2023, arXiv:2305.10425, eq. 3) with the
  reference log-ratio subtracted (as TRL): ``max(0, 1 - β h)``.
- ``ipo``: IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17; β plays τ): ``(h̄ - 1/(2β))²`` where
  ``h̄`` uses log-ratios divided by the completion lengths (as TRL computes IPO).
- ``sigmoid_norm``: DPO on those per-token log-ratios, ``-log σ(β h̄)`` (length-normalised DPO,
  as Tülu 3 trains: Lambert et al. 2024, arXiv:2411.15124, eq. 4).
- ``robust``: robust DPO (Chowdhury et al. 2024, arXiv:2403.00409, eq. 7), unbiased under labels
  flipped with probability ε (``label_smoothing``): ``((1-ε) ℓ(h) - ε ℓ(-h)) / (1 - 2ε)``,
  ``ℓ(h) = -log σ(β h)``.
- ``exo_pair``: EXO (Ji et al. 2024, arXiv:2402.00856, eq. 16 for K = 2), the reverse KL from the
  model's pair distribution ``(σ(β h), σ(-β h))`` to the smoothed labels ``(1-ε, ε)``:
  ``σ(β h) (log σ(β h) - log(1-ε)) + σ(-β h) (log σ(-β h) - log ε)``; ε > 0 (1e-3 in the paper).
- ``discopop``: DiscoPOP (Lu et al. 2024, arXiv:2406.08414, eq. 5), the log-ratio modulated loss
  ``(1 - m) (-log σ(β h)) + m e^{-β h}``, ``m = σ(β h / τ)`` (``discopop_tau`` τ, 0.05).
- ``aot``: AOT (Melnyk et al. 2024, arXiv:2406.05882), paired: the sigmoid loss (with ε) of
  ``sort(c - r) - sort(c_ref - r_ref)``, the two sorted over the batch (quantiles, not pairs);
  ``aot_unpaired`` of ``sort(c̃) - sort(r̃)``.

Losses that score the two completions apart rather than only their difference:

- ``nca_pair``: NCA (Chen et al. 2024, arXiv:2402.05369, eq. 12 for K = 2):
  ``-log σ(β c̃) - ½ log σ(-β c̃) - ½ log σ(-β r̃)``.
- ``bco_pair``: BCO (Jung et al. 2024, arXiv:2404.04656, eq. 7) on pairs, without the paper's reward
  shift δ (as TRL): ``-log σ(β c̃) - log σ(-β r̃)`` — chosen classified 1, rejected 0.
- ``sppo_hard``: SPPO (Wu et al. 2024, arXiv:2405.00675, eq. 4.7) with the hard win probability (1
  for the chosen, 0 for the rejected): ``(c̃ - 1/(2β))² + (r̃ + 1/(2β))²``.
- ``apo_zero``, ``apo_down``: anchored preference optimisation (D'Oosterlinck et al. 2024,
  arXiv:2408.06266, eqs. 5–6): ``1 - σ(β c̃) + σ(β r̃)`` (raise the chosen, lower the rejected)
  and ``σ(β c̃) + 1 - σ(β (c̃ - r̃))`` (lower both, the rejected more).
- ``simpo``: SimPO (Meng et al. 2024, arXiv:2405.14734, eq. 6), reference-free and
  length-normalised: ``-log σ(β c/|c| - β r/|r| - γ)``.
- ``sft``: the chosen completions' negative log-likelihood per token over the batch,
  ``-Σc / Σ|c|`` (each pair carries the batch's value, so their mean is it), reference-free; with
  a preference loss it is MPO's recipe (Wang et al. 2024, arXiv:2411.10442, eq. 1: sigmoid +
  bco_pair + sft).

A list of loss types is their sum, weighted by ``loss_weights`` (default 1 each), as TRL combines
them. ``f_divergence_type`` replaces each log-ratio ``u`` by the derivative ``f'(e^u)`` of an
f-divergence (f-DPO: Wang et al. 2023, arXiv:2309.16240, Table 1; ``F_DIVERGENCES``) in the losses of
the margin (``sigmoid``, ``sigmoid_norm``, ``hinge``, ``ipo``, ``exo_pair``, ``robust``,
``discopop``; ``sft`` reads no log-ratio): reverse KL is DPO itself.

The implicit rewards (TRL's ``rewards/chosen`` and ``rewards/rejected``) are ``β c̃`` and ``β r̃`` —
on per-token log-probs when every loss is length-normalised (``ipo``, ``sigmoid_norm``, ``simpo``,
``sft``) — and ``β c``, ``β r`` (per token) without a reference; they are returned detached. The
reference log-probs are detached too: the reference is a fixed baseline, and no gradient reaches it.

Each loss is an entry of the ``DPO_LOSS_TYPES`` registry (``registry.Registry``) declaring what it
needs as traits; ``dpo_loss`` checks the arguments against them, so a new loss is one entry.
Log-prob corrections applied before the loss (LD-DPO's ``ld_alpha``, WPO's weights) are in
``dpo_terms.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._checks import check_same_shape, check_tensor
from .registry import Registry

# ``f(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing, simpo_gamma, discopop_tau,
# score, chosen_lengths, rejected_lengths) -> losses (B,)`` on the summed log-probs (the reference
# ones None when the loss takes no reference); ``score`` maps a log-ratio to its f-divergence score.
DPO_LOSS_TYPES = Registry(
    "DPO loss",
    ("chosen", "rejected", "ref_chosen", "ref_rejected"),
    ("beta", "label_smoothing", "simpo_gamma", "discopop_tau", "score", "chosen_lengths", "rejected_lengths"),
    traits=("reference", "length_normalised", "smoothing", "f_divergence"),
)


def _alpha_score(alpha: float):
    """f'(t) = (t^(α-1) - 1) / (α - 1) of the α-divergence, TRL's convention (the paper's α is 1 - α;
    the two agree at TRL's default 0.5); the exponent is clamped below float32's overflow, as TRL."""
    if abs(alpha - 1.0) < 1e-6:  # the limit is log t: reverse KL
        return lambda u: u
    return lambda u: (torch.exp(torch.clamp((alpha - 1.0) * u, max=80.0)) - 1.0) / (alpha - 1.0)


# The derivative f'(t) of each f-divergence at t = π/π_ref = e^u, as a function of the log-ratio u
# (f-DPO, Table 1; a constant added to f' cancels in h).
F_DIVERGENCES = {
    "reverse_kl": lambda alpha: lambda u: u,  # f'(t) = log t + 1
    "forward_kl": lambda alpha: lambda u: 1 - torch.exp(-u),  # f'(t) = -1/t
    "js_divergence": lambda alpha: lambda u: math.log(2) + F.logsigmoid(u),  # f'(t) = log(2t / (1 + t))
    "alpha_divergence": _alpha_score,
}


def _scores(chosen, rejected, ref_chosen, ref_rejected, score, chosen_lengths=None, rejected_lengths=None):
    """Each completion's f-divergence score of its log-ratio (``s(c̃)``, ``s(r̃)``), per token when
    lengths are given."""
    sc, sr = score(chosen - ref_chosen), score(rejected - ref_rejected)
    if chosen_lengths is not None:
        sc, sr = sc / chosen_lengths, sr / rejected_lengths
    return sc, sr


def _smoothed_sigmoid(x, eps):
    """``-(1-ε) log σ(x) - ε log σ(-x)``."""
    losses = -(1 - eps) * F.logsigmoid(x)
    return losses - eps * F.logsigmoid(-x) if eps else losses


_MARGIN = dict(reference=True, length_normalised=False, f_divergence=True)  # losses of h
_APART = dict(reference=True, length_normalised=False, smoothing=False, f_divergence=False)  # of c̃, r̃ apart


@DPO_LOSS_TYPES.register("sigmoid", smoothing=True, **_MARGIN)
def _sigmoid(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, score, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score)
    return _smoothed_sigmoid(beta * (sc - sr), label_smoothing)


@DPO_LOSS_TYPES.register("ipo", reference=True, length_normalised=True, smoothing=False, f_divergence=True)
def _ipo(chosen, rejected, ref_chosen, ref_rejected, *, beta, score, chosen_lengths, rejected_lengths, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score, chosen_lengths, rejected_lengths)
    return (sc - sr - 1 / (2 * beta)) ** 2


@DPO_LOSS_TYPES.register("hinge", smoothing=False, **_MARGIN)
def _hinge(chosen, rejected, ref_chosen, ref_rejected, *, beta, score, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score)
    return torch.relu(1 - beta * (sc - sr))


@DPO_LOSS_TYPES.register("simpo", reference=False, length_normalised=True, smoothing=False, f_divergence=False)
def _simpo(chosen, rejected, ref_chosen, ref_rejected, *, beta, simpo_gamma=0.5, chosen_lengths, rejected_lengths, **_):
    return -F.logsigmoid(beta * chosen / chosen_lengths - beta * rejected / rejected_lengths - simpo_gamma)


@DPO_LOSS_TYPES.register("robust", smoothing=True, **_MARGIN)
def _robust(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, score, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score)
    h, eps = beta * (sc - sr), label_smoothing
    return (-(1 - eps) * F.logsigmoid(h) + eps * F.logsigmoid(-h)) / (1 - 2 * eps)


@DPO_LOSS_TYPES.register("nca_pair", **_APART)
def _nca_pair(chosen, rejected, ref_chosen, ref_rejected, *, beta, **_):
    c, r = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
    return -F.logsigmoid(c) - 0.5 * F.logsigmoid(-c) - 0.5 * F.logsigmoid(-r)


@DPO_LOSS_TYPES.register("sppo_hard", **_APART)
def _sppo_hard(chosen, rejected, ref_chosen, ref_rejected, *, beta, **_):
    return (chosen - ref_chosen - 0.5 / beta) ** 2 + (rejected - ref_rejected + 0.5 / beta) ** 2


@DPO_LOSS_TYPES.register("apo_zero", **_APART)
def _apo_zero(chosen, rejected, ref_chosen, ref_rejected, *, beta, **_):
    return 1 - torch.sigmoid(beta * (chosen - ref_chosen)) + torch.sigmoid(beta * (rejected - ref_rejected))


@DPO_LOSS_TYPES.register("apo_down", **_APART)
def _apo_down(chosen, rejected, ref_chosen, ref_rejected, *, beta, **_):
    c, r = chosen - ref_chosen, rejected - ref_rejected
    return torch.sigmoid(beta * c) + 1 - torch.sigmoid(beta * (c - r))


@DPO_LOSS_TYPES.register("bco_pair", **_APART)
def _bco_pair(chosen, rejected, ref_chosen, ref_rejected, *, beta, **_):
    return -F.logsigmoid(beta * (chosen - ref_chosen)) - F.logsigmoid(-beta * (rejected - ref_rejected))


@DPO_LOSS_TYPES.register("exo_pair", smoothing=True, **_MARGIN)
def _exo_pair(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, score, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score)
    h, eps = beta * (sc - sr), label_smoothing
    win, lose = F.logsigmoid(h), F.logsigmoid(-h)  # log q_w, log q_l
    return win.exp() * (win - math.log1p(-eps)) + lose.exp() * (lose - math.log(eps))


@DPO_LOSS_TYPES.register("discopop", smoothing=False, **_MARGIN)
def _discopop(chosen, rejected, ref_chosen, ref_rejected, *, beta, discopop_tau=0.05, score, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score)
    h = beta * (sc - sr)
    m = torch.sigmoid(h / discopop_tau)
    return (1 - m) * -F.logsigmoid(h) + m * torch.exp(-h)


@DPO_LOSS_TYPES.register("aot", reference=True, length_normalised=False, smoothing=True, f_divergence=False)
def _aot(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, **_):
    delta = torch.sort(chosen - rejected).values - torch.sort(ref_chosen - ref_rejected).values
    return _smoothed_sigmoid(beta * delta, label_smoothing)


@DPO_LOSS_TYPES.register("aot_unpaired", reference=True, length_normalised=False, smoothing=True, f_divergence=False)
def _aot_unpaired(chosen, rejected, ref_chosen, ref_rejected, *, beta, label_smoothing=0.0, **_):
    delta = torch.sort(chosen - ref_chosen).values - torch.sort(rejected - ref_rejected).values
    return _smoothed_sigmoid(beta * delta, label_smoothing)


@DPO_LOSS_TYPES.register("sft", reference=False, length_normalised=True, smoothing=False, f_divergence=True)
def _sft(chosen, rejected, ref_chosen, ref_rejected, *, chosen_lengths, **_):
    return (-chosen.sum() / chosen_lengths.sum().clamp(min=1)).expand(chosen.shape[0])


@DPO_LOSS_TYPES.register("sigmoid_norm", reference=True, length_normalised=True, smoothing=False, f_divergence=True)
def _sigmoid_norm(chosen, rejected, ref_chosen, ref_rejected, *, beta, score, chosen_lengths, rejected_lengths, **_):
    sc, sr = _scores(chosen, rejected, ref_chosen, ref_rejected, score, chosen_lengths, rejected_lengths)
    return -F.logsigmoid(beta * (sc - sr))


def _check_types(loss_type) -> list[str]:
    """The loss types named by ``loss_type`` (one name or several): each registered, none twice."""
    types = [loss_type] if isinstance(loss_type, str) else list(loss_type)
    if not types:
        raise ValueError("loss_type must name at least one loss")
    for name in types:
        if name not in DPO_LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {', '.join(DPO_LOSS_TYPES)}, got {name!r}")
    if len(set(types)) != len(types):
        raise ValueError(f"loss_type names a loss twice: {types}")
    return types


def _check_smoothing(types, label_smoothing, loss_type) -> list[str]:
    """The loss types that take ``label_smoothing`` ε, checked: ε in [0, 0.5), given only to a loss
    that takes it, and given (> 0) to ``exo_pair``, whose loss has log ε."""
    takes = [name for name in types if DPO_LOSS_TYPES.traits(name)["smoothing"]]
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if label_smoothing and not takes:
        takes_any = " or ".join(f"loss_type={n!r}" for n in DPO_LOSS_TYPES if DPO_LOSS_TYPES.traits(n)["smoothing"])
        raise ValueError(f"label_smoothing applies to {takes_any} only, got loss_type={loss_type!r}")
    if "exo_pair" in types and not label_smoothing:
        raise ValueError(  # TRL's message
            "Label smoothing must be greater than 0.0 when using 'exo_pair' loss. The EXO paper recommends a "
            "value of 1e-3."
        )
    return takes


def _check_f_divergence(types, f_divergence_type) -> None:
    """``f_divergence_type`` one of ``F_DIVERGENCES``, and other than reverse KL only when every loss
    type reads its log-ratios through it."""
    if f_divergence_type not in F_DIVERGENCES:
        raise ValueError(f"f_divergence_type must be one of {', '.join(F_DIVERGENCES)}, got {f_divergence_type!r}")
    if f_divergence_type != "reverse_kl" and not all(DPO_LOSS_TYPES.traits(n)["f_divergence"] for n in types):
        supported = sorted(n for n in DPO_LOSS_TYPES if DPO_LOSS_TYPES.traits(n)["f_divergence"])
        raise ValueError(  # TRL's message
            f"`f_divergence_type='{f_divergence_type}'` is only supported for the following loss types: "
            f"{supported}. You provided {types}. Use the default `f_divergence_type='reverse_kl'` with these losses."
        )


def check_loss_settings(loss_type, loss_weights=None, label_smoothing=0.0, f_divergence_type="reverse_kl"):
    """``(loss types, weights, each one's ε)`` of a loss setting, checked against the registry's traits
    (one line naming the setting otherwise): the configs and ``dpo_loss`` call this."""
    types = _check_types(loss_type)
    weights = [1.0] * len(types) if loss_weights is None else [float(w) for w in loss_weights]
    if len(weights) != len(types):
        raise ValueError(f"loss_weights must give one weight per loss type ({len(types)}), got {list(loss_weights)}")
    takes = _check_smoothing(types, label_smoothing, loss_type)
    _check_f_divergence(types, f_divergence_type)
    return types, weights, [label_smoothing if name in takes else 0.0 for name in types]


def needs_reference(loss_type) -> bool:
    """Whether any of the loss types reads the reference's log-probs."""
    types = [loss_type] if isinstance(loss_type, str) else list(loss_type)
    return any(DPO_LOSS_TYPES.traits(name)["reference"] for name in types)


def dpo_loss(
    chosen_logps,
    rejected_logps,
    ref_chosen_logps=None,
    ref_rejected_logps=None,
    *,
    beta: float = 0.1,
    loss_type: str | Sequence[str] = "sigmoid",
    loss_weights: Sequence[float] | None = None,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    discopop_tau: float = 0.05,
    f_divergence_type: str = "reverse_kl",
    f_alpha_divergence_coef: float = 0.5,
    chosen_lengths=None,
    rejected_lengths=None,
):
    """Per-pair losses (B,) and implicit rewards (B,), (B,) of ``loss_type`` — one name, or several
    summed with ``loss_weights`` — (see the module docstring). Log-probs are (B,) sums over each
    completion's tokens; ``*_lengths`` (B,) their token counts, needed by the length-normalised
    losses; the reference log-probs are needed when any loss reads them and refused when none does
    (nothing is silently ignored). ``label_smoothing`` ε reaches each listed loss that takes one.
    Computed in float32 (or the inputs' wider dtype)."""
    types, weights, smoothing = check_loss_settings(loss_type, loss_weights, label_smoothing, f_divergence_type)
    traits = [DPO_LOSS_TYPES.traits(name) for name in types]
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if not discopop_tau > 0:
        raise ValueError(f"discopop_tau must be > 0, got {discopop_tau!r}")
    named = types[0] if len(types) == 1 else types
    tensors = _given_tensors(
        named,
        traits,
        chosen_logps,
        rejected_logps,
        ref_chosen_logps,
        ref_rejected_logps,
        chosen_lengths,
        rejected_lengths,
    )
    with_ref, lengths = "ref_chosen_logps" in tensors, "chosen_lengths" in tensors
    dtype = torch.promote_types(chosen_logps.dtype, torch.float32)
    c, r = chosen_logps.to(dtype), rejected_logps.to(dtype)
    # The reference is a fixed baseline: no gradient reaches it, whatever its inputs require.
    c_ref = ref_chosen_logps.detach().to(dtype) if with_ref else None
    r_ref = ref_rejected_logps.detach().to(dtype) if with_ref else None
    n_c = tensors["chosen_lengths"].to(c) if lengths else None
    n_r = tensors["rejected_lengths"].to(c) if lengths else None
    score = F_DIVERGENCES[f_divergence_type](f_alpha_divergence_coef)
    losses = 0.0
    for name, weight, eps in zip(types, weights, smoothing):
        loss = DPO_LOSS_TYPES.get(name)(
            c,
            r,
            c_ref,
            r_ref,
            beta=beta,
            label_smoothing=eps,
            simpo_gamma=simpo_gamma,
            discopop_tau=discopop_tau,
            score=score,
            chosen_lengths=n_c,
            rejected_lengths=n_r,
        )
        losses = losses + weight * loss
    per_token = lengths and all(t["length_normalised"] for t in traits)
    chosen_rewards, rejected_rewards = _implicit_rewards(beta, c, r, c_ref, r_ref, (n_c, n_r) if per_token else None)
    return losses, chosen_rewards, rejected_rewards


def _given_tensors(
    named, traits, chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths, rejected_lengths
) -> dict:
    """``dpo_loss``'s tensors by name, checked against what its loss types read (``traits``): the
    reference log-probs when any reads them and none when none does, the lengths when any is
    length-normalised; all (B,). The reference's and the lengths' are absent when not given."""
    with_ref = ref_chosen_logps is not None or ref_rejected_logps is not None
    if not any(t["reference"] for t in traits) and with_ref:
        raise ValueError(f"loss_type={named!r} is reference-free: pass no reference log-probs")
    if any(t["reference"] for t in traits) and (ref_chosen_logps is None or ref_rejected_logps is None):
        raise ValueError(f"loss_type={named!r} needs ref_chosen_logps and ref_rejected_logps")
    lengths = chosen_lengths is not None and rejected_lengths is not None
    if any(t["length_normalised"] for t in traits) and not lengths:
        raise ValueError(f"loss_type={named!r} needs chosen_lengths and rejected_lengths (completion tokens)")
    tensors = {"chosen_logps": chosen_logps, "rejected_logps": rejected_logps}
    if with_ref:
        tensors.update(ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)
    if lengths:
        tensors.update(
            chosen_lengths=torch.as_tensor(chosen_lengths), rejected_lengths=torch.as_tensor(rejected_lengths)
        )
    check_tensor("chosen_logps", chosen_logps, ndim=1)
    check_same_shape(**tensors)
    return tensors


def _implicit_rewards(beta, c, r, c_ref, r_ref, lengths=None):
    """The implicit rewards of chosen and rejected, detached: ``β c̃`` and ``β r̃``, or ``β c`` and ``β r``
    without a reference (``c_ref`` None); per token when ``lengths`` ``(|c|, |r|)`` are given."""
    if lengths is not None:
        n_c, n_r = lengths
        c, r = c / n_c, r / n_r
        if c_ref is not None:
            c_ref, r_ref = c_ref / n_c, r_ref / n_r
    if c_ref is None:  # reference-free: the implicit rewards are the scaled log-probs themselves
        return (beta * c).detach(), (beta * r).detach()
    return (beta * (c - c_ref)).detach(), (beta * (r - r_ref)).detach()
