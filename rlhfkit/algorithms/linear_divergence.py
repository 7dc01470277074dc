"""The divergence between a student's and a teacher's next-token distributions over the whole
vocabulary, straight from both models' last hidden states, through their output layers in chunks: no
tensor of tokens × vocabulary exists for either model, forward or backward.

On-policy distillation (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning
from Self-Generated Mistakes", arXiv:2306.13649, GKD; TRL's ``DistillationTrainer``) trains the
student on its own samples against the teacher's full next-token distribution at every response
position. With ``p_s = softmax(z_s / τ)`` and ``p_t = softmax(z_t / τ)`` (the temperature applied to
both), the generalized Jensen–Shannon divergence of the paper, with TRL's conventions:

- ``β = 0``: the forward KL, ``D = KL(p_t ‖ p_s) = Σ p_t (log p_t − log p_s)``;
- ``β = 1``: the reverse KL, ``D = KL(p_s ‖ p_t) = Σ p_s (log p_s − log p_t)``;
- ``0 < β < 1``: ``D = β KL(p_t ‖ m) + (1 − β) KL(p_s ‖ m)`` with the mixture
  ``m = (1 − β) p_s + β p_t``, formed in log space, ``log m = logaddexp(log(1 − β) + log p_s,
  log β + log p_t)``. (The mixture form tends to 0, not to a KL, as β → 0 or 1: the end points
  are the two KLs by definition, as in TRL and the paper.)

Terms ``p (log p − log q)`` with ``p = 0`` are 0 (tokens masked with −inf logits add nothing; a
token the divergence's first argument gives mass and the second none makes it +inf, as it should).

The gradient, with ``x = z_s / τ`` (only the student gets one; ``∂/∂z_s = (∂/∂x) / τ``):

- forward KL: ``∂D/∂x = p_s − p_t``;
- reverse KL: ``∂D/∂x = p_s (log p_s − log p_t − D)``;
- mixture: ``∂D/∂p_s = (1 − β) log(p_s / m)`` (the terms of ``∂ log m/∂p_s`` sum to
  ``−(1 − β) m / m`` and cancel the ``+(1 − β)`` of ``∂(p_s log p_s)``), so through the softmax
  ``∂D/∂x = (1 − β) p_s (log p_s − log m − KL(p_s ‖ m))``.

``linear_divergence`` walks the rows in chunks as ``linear_logprobs`` does: one chunk's logits of
each model ``(h Wᵀ + b) / τ``, the matrix product in the compute dtype, upcast to float32, reduced to
the divergence (and the student's entropy ``−Σ p_s log p_s``, for logging), and dropped; it keeps
for backward the inputs and three floats per row (both log-normalizers and ``KL(p_s ‖ m)`` or ``D``).
Backward recomputes both chunks' logits, forms ``∂D/∂z_s`` above and multiplies it straight into
``∂h = g W`` and ``∂W = gᵀ h`` (``∂b = Σ g``). ``divergence_from_logits`` is the same divergence
on logits that exist (a head that cannot be streamed), through autograd.
"""

from __future__ import annotations

import math

import torch

from .linear_logprobs import chunk_logits, compute_dtype
from .logprobs import DEFAULT_CHUNK_ELEMENTS


def _p_log_ratio(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Elementwise ``p (log p − log q)``, 0 where ``p = 0`` (no 0 · (−inf), no NaN in its gradient)."""
    alive = logp > -math.inf
    return logp.exp() * (torch.where(alive, logp, 0.0) - torch.where(alive, logq, 0.0))


def _log_mixture(log_ps: torch.Tensor, log_pt: torch.Tensor, beta: float) -> torch.Tensor:
    """``log m = log((1 − β) p_s + β p_t)``, −inf where both are 0 (with a finite gradient there)."""
    dead = (log_ps == -math.inf) & (log_pt == -math.inf)
    a = torch.where(dead, 0.0, log_ps + math.log1p(-beta))
    b = torch.where(dead, 0.0, log_pt + math.log(beta))
    return torch.where(dead, -math.inf, torch.logaddexp(a, b))


def _divergence(log_ps: torch.Tensor, log_pt: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, ``(D, aux)`` from (rows, V) log-probs: ``aux`` is what the gradient reads, ``D`` for
    the reverse KL, ``KL(p_s ‖ m)`` for the mixture (an empty tensor for the forward KL)."""
    if beta == 0.0:
        return _p_log_ratio(log_pt, log_ps).sum(-1), log_ps.new_empty(0)
    if beta == 1.0:
        d = _p_log_ratio(log_ps, log_pt).sum(-1)
        return d, d
    log_m = _log_mixture(log_ps, log_pt, beta)
    kl_s = _p_log_ratio(log_ps, log_m).sum(-1)
    return beta * _p_log_ratio(log_pt, log_m).sum(-1) + (1.0 - beta) * kl_s, kl_s


def _divergence_grad(log_ps: torch.Tensor, log_pt: torch.Tensor, beta: float, aux: torch.Tensor) -> torch.Tensor:
    """``∂D/∂x`` (rows, V), ``x = z_s / τ``: the module's formulas, ``aux`` from ``_divergence``."""
    p_s = log_ps.exp()
    if beta == 0.0:
        return p_s - log_pt.exp()
    if beta == 1.0:
        return _p_log_ratio(log_ps, log_pt) - p_s * aux[:, None]
    log_m = _log_mixture(log_ps, log_pt, beta)
    return (1.0 - beta) * (_p_log_ratio(log_ps, log_m) - p_s * aux[:, None])


def _entropy(log_p: torch.Tensor) -> torch.Tensor:
    return -_p_log_ratio(log_p, torch.zeros_like(log_p)).sum(-1)


def _check(beta: float, temperature: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be positive, got {temperature}")


def divergence_from_logits(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float, temperature: float = 1.0
) -> torch.Tensor:
    """The module's divergence between ``softmax(student_logits / τ)`` and ``softmax(teacher_logits
    / τ)``, (..., V) each → (...), float32 (float64 for float64 student logits), differentiable in
    the student's logits only (through autograd). The unstreamed twin of ``linear_divergence``."""
    _check(beta, temperature)
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits must have the same shape (..., V), got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    acc = torch.promote_types(student_logits.dtype, torch.float32)
    zs = student_logits.to(acc) / temperature
    zt = teacher_logits.detach().to(acc) / temperature
    return _divergence(torch.log_softmax(zs, -1), torch.log_softmax(zt, -1), beta)[0]


class _LinearDivergence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s_hidden, s_weight, s_bias, t_hidden, t_weight, t_bias, beta, tau, entropy, chunk_rows, dtypes):
        """Returns (D, H or empty), each (N,) float32 (float64 for a float64 student product)."""
        n, device = s_hidden.shape[0], s_hidden.device
        s_dtype, t_dtype = dtypes
        acc = torch.promote_types(s_dtype, torch.float32)
        with torch.autocast(device.type, enabled=False):
            sw, tw = s_weight.to(s_dtype), t_weight.to(t_dtype)
            sb = None if s_bias is None else s_bias.to(s_dtype)
            tb = None if t_bias is None else t_bias.to(t_dtype)
            lse_s = torch.empty(n, dtype=acc, device=device)
            lse_t, div = torch.empty_like(lse_s), torch.empty_like(lse_s)
            aux = lse_s.new_empty(0) if beta == 0.0 else torch.empty_like(lse_s)
            ent = torch.empty_like(lse_s) if entropy else lse_s.new_empty(0)
            for s in range(0, n, chunk_rows):
                rows = slice(s, min(s + chunk_rows, n))
                zs = chunk_logits(s_hidden[rows], sw, sb, tau)
                zt = chunk_logits(t_hidden[rows], tw, tb, tau).to(acc)
                lse_s[rows], lse_t[rows] = torch.logsumexp(zs, -1), torch.logsumexp(zt, -1)
                log_ps = zs - lse_s[rows, None]
                d, a = _divergence(log_ps, zt - lse_t[rows, None], beta)
                div[rows] = d
                if beta != 0.0:
                    aux[rows] = a
                if entropy:
                    ent[rows] = _entropy(log_ps)
        ctx.save_for_backward(s_hidden, s_weight, s_bias, t_hidden, t_weight, t_bias, lse_s, lse_t, aux)
        ctx.beta, ctx.tau, ctx.chunk_rows, ctx.dtypes = beta, tau, chunk_rows, dtypes
        ctx.mark_non_differentiable(ent)
        return div, ent

    @staticmethod
    def backward(ctx, grad_div, _grad_ent):
        s_hidden, s_weight, s_bias, t_hidden, t_weight, t_bias, lse_s, lse_t, aux = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, device = s_hidden.shape[0], s_hidden.device
        (s_dtype, t_dtype), tau = ctx.dtypes, ctx.tau
        acc = lse_s.dtype
        with torch.autocast(device.type, enabled=False):
            sw, tw = s_weight.to(s_dtype), t_weight.to(t_dtype)
            sb = None if s_bias is None else s_bias.to(s_dtype)
            tb = None if t_bias is None else t_bias.to(t_dtype)
            grad_h = torch.empty_like(s_hidden) if need_h else None
            grad_w = torch.zeros(s_weight.shape, dtype=acc, device=device) if need_w else None
            grad_b = torch.zeros(s_bias.shape, dtype=acc, device=device) if need_b else None
            g_div = grad_div.to(acc)
            for s in range(0, n, ctx.chunk_rows):
                rows = slice(s, min(s + ctx.chunk_rows, n))
                log_ps = chunk_logits(s_hidden[rows], sw, sb, tau) - lse_s[rows, None]
                log_pt = chunk_logits(t_hidden[rows], tw, tb, tau).to(acc) - lse_t[rows, None]
                g = _divergence_grad(log_ps, log_pt, ctx.beta, aux[rows] if aux.numel() else aux)
                g *= g_div[rows, None] / tau
                g_c = g.to(s_dtype)
                if grad_h is not None:
                    grad_h[rows] = (g_c @ sw).to(s_hidden.dtype)
                if grad_w is not None:
                    grad_w += (g_c.t() @ s_hidden[rows].to(s_dtype)).to(acc)
                if grad_b is not None:
                    grad_b += g.sum(0)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(s_weight.dtype),
            None if grad_b is None else grad_b.to(s_bias.dtype),
            *([None] * 8),
        )


def _check_head(name: str, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"{name}_hidden (N, H) and {name}_weight (V, H) must agree on H, "
            f"got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{name}_bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def linear_divergence(
    student_hidden: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    beta: float,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The module's divergence between ``softmax((h_s W_sᵀ + b_s) / τ)`` and ``softmax((h_t W_tᵀ +
    b_t) / τ)`` per row, differentiable in the student's hidden states, weight and bias only,
    without materialising either model's (N, V) logits.

    Args: ``student_hidden`` (N, Hs) and ``student_weight`` (V, Hs), ``student_bias`` (V,) or None,
    the student's last hidden states and output layer; ``teacher_hidden`` (N, Ht),
    ``teacher_weight`` (V, Ht), ``teacher_bias``, the teacher's (no gradient); ``beta`` β in [0, 1]:
    0 the forward KL(p_t ‖ p_s), 1 the reverse KL(p_s ‖ p_t), between them the generalized JSD;
    ``temperature`` τ, applied to both; ``with_entropy``: also the student's entropy per row (no
    gradient). Each model's product runs in autocast's dtype where autocast is on, else in its
    weight's; everything after it in float32 (float64 for a float64 student weight, the teacher's
    logits cast to it). ``chunk_elements``: float32 logits of one model held at once (rows × V).

    Returns ``(divergence, entropy or None)``, each (N,). Equal to ``divergence_from_logits(F.linear(
    h_s, W_s, b_s), F.linear(h_t, W_t, b_t), β, τ)`` within float tolerance, gradients included.
    """
    _check(beta, temperature)
    _check_head("student", student_hidden, student_weight, student_bias)
    _check_head("teacher", teacher_hidden, teacher_weight, teacher_bias)
    if student_weight.shape[0] != teacher_weight.shape[0]:
        raise ValueError(
            f"student and teacher must share the vocabulary, got V = {student_weight.shape[0]} and "
            f"{teacher_weight.shape[0]}"
        )
    if student_hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(
            f"student and teacher hidden states must have the same rows, got N = {student_hidden.shape[0]} "
            f"and {teacher_hidden.shape[0]}"
        )
    chunk_rows = max(1, chunk_elements // max(student_weight.shape[0], 1))
    div, ent = _LinearDivergence.apply(
        student_hidden,
        student_weight,
        student_bias,
        teacher_hidden.detach(),
        teacher_weight.detach(),
        None if teacher_bias is None else teacher_bias.detach(),
        float(beta),
        float(temperature),
        with_entropy,
        chunk_rows,
        (compute_dtype(student_hidden, student_weight), compute_dtype(teacher_hidden, teacher_weight)),
    )
    return div, (ent if with_entropy else None)
