"""linear_divergence and divergence_from_logits (on-policy distillation's full-distribution divergence)
against independent references: F.kl_div over full softmaxes, values by hand on three tokens,
gradcheck, the unstreamed path, and a watch on every tensor the streamed path creates."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfkit.algorithms import divergence_from_logits, entropy_from_logits, linear_divergence

N, HS, HT, V = 7, 5, 6, 13
BETAS = [0.0, 0.3, 0.5, 1.0]


def _heads(seed=0, dtype=torch.float32, n=N, v=V, hs=HS, ht=HT, scale=1.5):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    return r(n, hs), r(v, hs), r(v), r(n, ht), r(v, ht), r(v)


def _kl(p_log_q, p):
    """KL(p ‖ q) per row, by F.kl_div (input log q, target p)."""
    return F.kl_div(p_log_q, p, reduction="none").sum(-1)


def kl_div_reference(zs, zt, beta, tau):
    p_s, p_t = torch.softmax(zs.double() / tau, -1), torch.softmax(zt.double() / tau, -1)
    if beta == 0.0:
        return _kl(p_s.log(), p_t)
    if beta == 1.0:
        return _kl(p_t.log(), p_s)
    m = (1 - beta) * p_s + beta * p_t
    return beta * _kl(m.log(), p_t) + (1 - beta) * _kl(m.log(), p_s)


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_both_paths_equal_kl_div_over_full_softmaxes(beta, tau):
    hs, ws, bs, ht, wt, bt = _heads()
    zs, zt = F.linear(hs, ws, bs), F.linear(ht, wt, bt)
    want = kl_div_reference(zs, zt, beta, tau).float()
    assert (want > 1e-3).all()
    torch.testing.assert_close(divergence_from_logits(zs, zt, beta, tau), want, rtol=1e-5, atol=1e-6)
    got, _ = linear_divergence(
        hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=beta, temperature=tau, chunk_elements=2 * V
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


# p_s = (1/2, 1/4, 1/4), p_t = (1/4, 1/4, 1/2); m = (1 − β) p_s + β p_t
LN2, LN3 = math.log(2), math.log(3)
HAND = {
    0.0: 0.25 * LN2,  # Σ p_t log(p_t / p_s) = 1/4 log(1/2) + 0 + 1/2 log 2
    1.0: 0.25 * LN2,  # Σ p_s log(p_s / p_t) = 1/2 log 2 + 0 + 1/4 log(1/2)
    0.5: 1.25 * LN2 - 0.75 * LN3,  # m = (3/8, 1/4, 3/8); both KLs = 1/4 log(2/3) + 1/2 log(4/3)
    # m = (7/16, 1/4, 5/16): 1/4 [1/4 log(4/7) + 1/2 log(8/5)] + 3/4 [1/2 log(8/7) + 1/4 log(4/5)]
    0.25: 0.25 * (0.25 * math.log(4 / 7) + 0.5 * math.log(8 / 5))
    + 0.75 * (0.5 * math.log(8 / 7) + 0.25 * math.log(4 / 5)),
}


@pytest.mark.parametrize("beta", sorted(HAND))
@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_three_token_vocabulary_by_hand(beta, tau):
    """Logits τ · log p give the same p at temperature τ: the temperature divides both models' logits."""
    p_s, p_t = torch.tensor([[0.5, 0.25, 0.25]]), torch.tensor([[0.25, 0.25, 0.5]])
    zs, zt = tau * p_s.log(), tau * p_t.log()
    want = torch.tensor([HAND[beta]])
    torch.testing.assert_close(divergence_from_logits(zs + 3.0, zt - 1.0, beta, tau), want)
    # identity heads: hidden = logits, weight = I
    eye = torch.eye(3)
    got, ent = linear_divergence(zs, eye, zt, eye, beta=beta, temperature=tau, with_entropy=True)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(ent, torch.tensor([1.5 * LN2]))  # 1/2 log 2 + 2 · 1/4 log 4


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gradcheck_float64(beta):
    hs, ws, bs, ht, wt, bt = _heads(seed=1, dtype=torch.float64, n=4, v=6)
    for t in (hs, ws, bs):
        t.requires_grad_(True)

    def f(hs, ws, bs):
        return linear_divergence(
            hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=beta, temperature=0.7, chunk_elements=12
        )[0]

    assert f(hs, ws, bs).dtype == torch.float64
    assert torch.autograd.gradcheck(f, (hs, ws, bs))
    assert torch.autograd.gradcheck(lambda z: divergence_from_logits(z, F.linear(ht, wt, bt), beta, 0.7), (hs @ ws.T,))


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("chunk_elements", [1, 3 * V, 10 * N * V])  # one row per chunk, 3 rows, all rows
def test_streamed_equals_unstreamed_values_and_gradients(beta, chunk_elements):
    tau = 0.8
    hs, ws, bs, ht, wt, bt = _heads(seed=2)
    leaves = [t.clone().requires_grad_(True) for t in (hs, ws, bs)]
    got, ent = linear_divergence(
        *leaves[:2], ht, wt, student_bias=leaves[2], teacher_bias=bt, beta=beta, temperature=tau,
        with_entropy=True, chunk_elements=chunk_elements,
    )  # fmt: skip
    weights = torch.linspace(0.5, 2.0, N)  # a non-uniform upstream gradient
    (got * weights).sum().backward()
    ref_leaves = [t.clone().requires_grad_(True) for t in (hs, ws, bs)]
    zs = F.linear(ref_leaves[0], ref_leaves[1], ref_leaves[2])
    want = divergence_from_logits(zs, F.linear(ht, wt, bt), beta, tau)
    (want * weights).sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(leaves, ref_leaves):
        # float32 rounding on gradients up to ~10 (both paths are 1e-6 of the float64 values)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5 * b.grad.abs().max().item())
    torch.testing.assert_close(ent, entropy_from_logits(zs.detach(), temperature=tau))
    assert not ent.requires_grad


@pytest.mark.parametrize("beta", BETAS)
def test_no_gradient_reaches_the_teacher(beta):
    hs, ws, bs, ht, wt, bt = (t.requires_grad_(True) for t in _heads(seed=3))
    got, _ = linear_divergence(hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=beta, chunk_elements=V)
    got.sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (hs, ws, bs))
    assert ht.grad is None and wt.grad is None and bt.grad is None
    zt = F.linear(ht.detach(), wt.detach()).requires_grad_(True)
    zs = F.linear(hs.detach(), ws.detach()).requires_grad_(True)
    divergence_from_logits(zs, zt, beta).sum().backward()
    assert zt.grad is None and zs.grad.abs().sum() > 0


@pytest.mark.parametrize("beta", BETAS)
def test_zero_when_student_equals_teacher(beta):
    hs, ws, bs, *_ = _heads(seed=4)
    bs[3] = -math.inf  # a masked token on both sides
    hs.requires_grad_(True)
    got, _ = linear_divergence(
        hs, ws, hs, ws, student_bias=bs, teacher_bias=bs, beta=beta, temperature=0.6, chunk_elements=2 * V
    )
    torch.testing.assert_close(got, torch.zeros(N), atol=2e-6, rtol=0)
    got.sum().backward()  # a minimum: the gradient vanishes too
    torch.testing.assert_close(hs.grad, torch.zeros_like(hs), atol=2e-6, rtol=0)


@pytest.mark.parametrize("beta", BETAS)
def test_minus_inf_logits_add_nothing(beta):
    """Tokens masked on both sides (a −inf bias) give the divergence over the other tokens, with no NaN
    in the value or any gradient; masked on the teacher's side only, the forward KL and the mixture stay
    finite (the reverse KL is +inf: the student puts mass where the teacher has none)."""
    hs, ws, bs, ht, wt, bt = _heads(seed=5)
    keep = torch.ones(V, dtype=torch.bool)
    keep[[0, 4, 9]] = False
    bs_m, bt_m = bs.masked_fill(~keep, -math.inf), bt.masked_fill(~keep, -math.inf)
    leaves = [t.clone().requires_grad_(True) for t in (hs, ws, bs_m)]
    got, ent = linear_divergence(
        *leaves[:2], ht, wt, student_bias=leaves[2], teacher_bias=bt_m, beta=beta, with_entropy=True,
        chunk_elements=2 * V,
    )  # fmt: skip
    got.sum().backward()
    want = kl_div_reference(F.linear(hs, ws[keep], bs[keep]), F.linear(ht, wt[keep], bt[keep]), beta, 1.0)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(ent).all()
    assert all(torch.isfinite(t.grad).all() for t in leaves)
    assert (leaves[1].grad[~keep] == 0).all()
    # the unstreamed path through autograd: no NaN either
    zs = F.linear(hs, ws, bs_m).requires_grad_(True)
    divergence_from_logits(zs, F.linear(ht, wt, bt_m), beta).sum().backward()
    assert torch.isfinite(zs.grad).all()
    # teacher-only mask
    zs = F.linear(hs, ws, bs).requires_grad_(True)
    d = divergence_from_logits(zs, F.linear(ht, wt, bt_m), beta)
    if beta == 1.0:
        assert torch.isinf(d).all() and (d > 0).all()
    else:
        d.sum().backward()
        assert torch.isfinite(d).all() and torch.isfinite(zs.grad).all()
        streamed, _ = linear_divergence(hs, ws, ht, wt, student_bias=bs, teacher_bias=bt_m, beta=beta)
        torch.testing.assert_close(streamed, d, rtol=1e-5, atol=1e-6)


def test_autocast_product_runs_in_autocast_dtype_then_float32():
    hs, ws, bs, ht, wt, bt = _heads(seed=6, scale=2.0)
    hs.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = linear_divergence(hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=0.5, chunk_elements=V)
        zs, zt = F.linear(hs, ws, bs), F.linear(ht, wt, bt)
    assert zs.dtype == torch.bfloat16 and got.dtype == torch.float32
    want = divergence_from_logits(zs, zt, 0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    full = divergence_from_logits(F.linear(hs, ws, bs), F.linear(ht, wt, bt), 0.5)
    assert (got - full).abs().max() > 1e-4  # the product did run in bfloat16
    got.sum().backward()
    g = torch.autograd.grad(divergence_from_logits(F.linear(hs, ws, bs), F.linear(ht, wt, bt), 0.5).sum(), hs)[0]
    torch.testing.assert_close(hs.grad, g, rtol=0.05, atol=0.02)


def test_teacher_weight_in_another_dtype():
    hs, ws, bs, ht, wt, bt = _heads(seed=7)
    for t_dtype in (torch.bfloat16, torch.float64):
        got, _ = linear_divergence(
            hs, ws, ht.to(t_dtype), wt.to(t_dtype), student_bias=bs, teacher_bias=bt.to(t_dtype), beta=0.3
        )
        assert got.dtype == torch.float32
        zt = F.linear(ht.to(t_dtype), wt.to(t_dtype), bt.to(t_dtype))
        torch.testing.assert_close(got, divergence_from_logits(F.linear(hs, ws, bs), zt, 0.3), rtol=1e-5, atol=1e-6)
    # a float64 student keeps float64 throughout, a float32 teacher beside it
    got, _ = linear_divergence(hs.double(), ws.double(), ht, wt, beta=0.3)
    assert got.dtype == torch.float64


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation creates (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest, self.ops = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        self.ops += 1
        return out


def test_no_rows_by_vocabulary_tensor_forward_or_backward():
    n, v, h, rows = 256, 1024, 8, 4  # N × V = 262,144; a chunk 4 × 1,024; the weight 8,192
    hs, ws, bs, ht, wt, bt = _heads(seed=8, n=n, v=v, hs=h, ht=h)
    hs.requires_grad_(True), ws.requires_grad_(True)
    for beta in BETAS:
        with _LargestTensor() as fwd:
            got, _ = linear_divergence(
                hs, ws, ht, wt, student_bias=bs, teacher_bias=bt, beta=beta, with_entropy=True,
                chunk_elements=rows * v,
            )  # fmt: skip
        with _LargestTensor() as bwd:
            got.sum().backward()
        assert bwd.ops > n // rows  # the watch sees backward's per-chunk work
        for watch in (fwd, bwd):
            assert watch.largest <= max(rows * v, v * h, n * h)  # ≪ n × v
    with _LargestTensor() as unstreamed:  # the watch does see an (N, V) tensor where one is built
        divergence_from_logits(F.linear(hs, ws, bs), F.linear(ht, wt, bt), 0.5)
    assert unstreamed.largest >= n * v


def test_refuses_mismatched_shapes_and_bad_arguments():
    hs, ws, bs, ht, wt, bt = _heads()
    with pytest.raises(ValueError, match="student_hidden"):
        linear_divergence(hs[:, :4], ws, ht, wt, beta=0.5)
    with pytest.raises(ValueError, match="teacher_hidden"):
        linear_divergence(hs, ws, ht[:, :4], wt, beta=0.5)
    with pytest.raises(ValueError, match="vocabulary"):
        linear_divergence(hs, ws, ht, wt[:-1], beta=0.5)
    with pytest.raises(ValueError, match="rows"):
        linear_divergence(hs, ws, ht[:-1], wt, beta=0.5)
    with pytest.raises(ValueError, match="student_bias"):
        linear_divergence(hs, ws, ht, wt, student_bias=bs[:-1], beta=0.5)
    with pytest.raises(ValueError, match="teacher_bias"):
        linear_divergence(hs, ws, ht, wt, teacher_bias=bt[:-1], beta=0.5)
    with pytest.raises(ValueError, match="beta"):
        linear_divergence(hs, ws, ht, wt, beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        divergence_from_logits(hs @ ws.T, ht @ wt.T, 0.5, temperature=0.0)
    with pytest.raises(ValueError, match="same shape"):
        divergence_from_logits(hs @ ws.T, (ht @ wt.T)[:, :-1], 0.5)
