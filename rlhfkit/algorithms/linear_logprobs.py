"""Per-token log-probs, entropies and kept mass straight from the last hidden states, through the
output layer in chunks: no tensor of tokens × vocabulary exists, forward or backward.

The logits ``z = (h Wᵀ + b) / τ`` of a 150k-token vocabulary are the largest tensors of a step on
long completions (8 rows × 1,024 tokens × 151,936 × 4 bytes = 5 GB, and as much again for their
gradient). ``linear_logprobs`` walks the hidden rows in chunks, computes one chunk's logits in the
compute dtype, upcasts them to float32, reduces them to what the loss reads (``log p_y = z_y −
logsumexp z``; the entropy ``H = logsumexp z − Σ softmax(z) z``; the log of the mass top-k/top-p
keep) and drops them. Backward recomputes each chunk's logits from the saved hidden states and
weight, forms the gradient on the logits (``∂ log p_y/∂z = onehot(y) − p``, ``∂H/∂z = −p (log p +
H)``, both over ``τ``) and multiplies it straight into ``∂h = g W`` and ``∂W = gᵀ h`` (``∂b = Σ g``).
The head's matrix product runs once more than an unstreamed pass (in backward), the price every
fused-linear loss pays (Liger's ``fused_linear_cross_entropy``; Wijmans et al. 2024, "Cut Your
Losses in Large-Vocabulary Language Models").

The formulas are those of ``algorithms.logprobs`` (one chunk's logits go through them), applied to
logits that are never stored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .logprobs import DEFAULT_CHUNK_ELEMENTS, log_kept_mass


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output layer's matrix product runs in: autocast's where it is on for the device
    (as ``nn.Linear`` would under it), else the weight's."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def chunk_logits(h, weight, bias, temperature):
    """(rows, V) logits over the temperature, the matrix product in ``weight``'s dtype, the result in
    float32 (float64 for a float64 weight)."""
    z = F.linear(h.to(weight.dtype), weight, bias).to(torch.promote_types(weight.dtype, torch.float32))
    return z / temperature if temperature != 1.0 else z


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, entropy, entropy_grad, support, chunk_rows, dtype):
        """Returns (log p_y, H or empty, log kept mass or empty), each (N,) float32."""
        n = hidden.shape[0]
        device = hidden.device
        with torch.autocast(device.type, enabled=False):
            w = weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            lse = torch.empty(n, dtype=torch.promote_types(dtype, torch.float32), device=device)
            logp = torch.empty_like(lse)
            ent = torch.empty_like(lse) if entropy else lse.new_empty(0)
            kept = torch.empty_like(lse) if support is not None else lse.new_empty(0)
            for s in range(0, n, chunk_rows):
                rows = slice(s, min(s + chunk_rows, n))
                z = chunk_logits(hidden[rows], w, b, temperature)
                lse[rows] = torch.logsumexp(z, -1)
                logp[rows] = z.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
                if entropy:  # 0 · (-inf) would be NaN for tokens masked with -inf logits: they add nothing
                    p = torch.exp(z - lse[rows, None])
                    ent[rows] = lse[rows] - torch.where(p > 0, p * z, 0.0).sum(-1)
                if support is not None:
                    kept[rows] = log_kept_mass(z, targets[rows], *support)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent if entropy_grad else lse.new_empty(0))
        ctx.temperature, ctx.entropy_grad, ctx.chunk_rows, ctx.dtype = temperature, entropy_grad, chunk_rows, dtype
        ctx.mark_non_differentiable(kept)
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent, kept

    @staticmethod
    def backward(ctx, grad_logp, grad_ent, _grad_kept):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, device = hidden.shape[0], hidden.device
        tau = ctx.temperature
        with torch.autocast(device.type, enabled=False):
            w = weight.to(ctx.dtype)
            b = None if bias is None else bias.to(ctx.dtype)
            grad_h = torch.empty_like(hidden) if need_h else None
            acc = lse.dtype  # float32 (float64 for float64 weights)
            grad_w = torch.zeros(weight.shape, dtype=acc, device=device) if need_w else None
            grad_b = torch.zeros(bias.shape, dtype=acc, device=device) if need_b else None
            g_lp = grad_logp.to(acc) if grad_logp is not None else None
            g_ent = grad_ent.to(acc) if (ctx.entropy_grad and grad_ent is not None) else None
            for s in range(0, n, ctx.chunk_rows):
                rows = slice(s, min(s + ctx.chunk_rows, n))
                z = chunk_logits(hidden[rows], w, b, tau)
                logp = z - lse[rows, None]
                p = torch.exp(logp)
                if g_lp is not None:  # d log p_y / dz = onehot(y) - p
                    g = -p * g_lp[rows, None]
                    g.scatter_add_(-1, targets[rows, None], g_lp[rows, None])
                else:
                    g = torch.zeros_like(z)
                if g_ent is not None:  # dH/dz = -p (log p + H)
                    g += torch.where(p > 0, -p * (logp + ent[rows, None]), 0.0) * g_ent[rows, None]
                if tau != 1.0:
                    g /= tau
                g_c = g.to(ctx.dtype)
                if grad_h is not None:
                    grad_h[rows] = (g_c @ w).to(hidden.dtype)
                if grad_w is not None:
                    grad_w += (g_c.t() @ hidden[rows].to(ctx.dtype)).to(acc)
                if grad_b is not None:
                    grad_b += g.sum(0)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    support: tuple[int, float] | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``log softmax((h Wᵀ + b) / τ)[y]`` per row of ``hidden``, differentiable in ``hidden``,
    ``weight`` and ``bias``, without materialising the (N, V) logits.

    Args: ``hidden`` (N, H); ``weight`` (V, H) and ``bias`` (V,) or None, the output layer;
    ``targets`` (N,) token ids; ``temperature`` τ, the sampling temperature; ``with_entropy``: also
    the entropy of each row's distribution (differentiable only with ``entropy_grad``);
    ``support`` ``(top_k, top_p)``: also ``algorithms.log_kept_mass`` (no gradient). The matrix
    product runs in autocast's dtype where autocast is on, else in ``weight``'s; everything after it
    in float32. ``chunk_elements``: float32 logits held at once (rows × V).

    Returns ``(logprobs, entropy or None, log_kept_mass or None)``, each (N,) float32 (float64 when
    the product runs in float64). Equal to
    ``selective_logprobs(F.linear(h, W, b) / τ, y)`` (and ``entropy_from_logits``,
    ``log_kept_mass``) within float tolerance, gradients included.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden (N, H) and weight (V, H) must agree on H, got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if tuple(targets.shape) != (hidden.shape[0],):
        raise ValueError(f"targets must have shape ({hidden.shape[0]},), got {tuple(targets.shape)}")
    chunk_rows = max(1, chunk_elements // max(weight.shape[0], 1))
    logp, ent, kept = _LinearLogprobs.apply(
        hidden,
        weight,
        bias,
        targets.long(),
        float(temperature),
        with_entropy,
        with_entropy and entropy_grad,
        support,
        chunk_rows,
        compute_dtype(hidden, weight),
    )
    return logp, (ent if with_entropy else None), (kept if support is not None else None)
