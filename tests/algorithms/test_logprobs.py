"""selective_logprobs and entropy_from_logits against the straightforward full-vocabulary versions."""

import math

import pytest
import torch

from rlhfkit.algorithms import entropy_from_logits, log_kept_mass, selective_logprobs
from rlhfkit.algorithms.logprobs import DEFAULT_CHUNK_ELEMENTS, _row_chunks

B, T, V = 3, 5, 11
TINY_CHUNK = 2 * V + 3  # → 2 rows per chunk: 15 rows in 8 chunks, the last one short


def _logits(seed=0, dtype=torch.float32, scale=3.0, shape=(B, T, V)):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _tokens(seed=0, shape=(B, T), vocab=V):
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randint(0, vocab, shape, generator=g)


def naive_logprobs(logits, tokens):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


def naive_entropy(logits):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_row_chunks_cover_every_row_once():
    rows = [r for s in _row_chunks(15, V, TINY_CHUNK) for r in range(15)[s]]
    assert rows == list(range(15))
    assert len(list(_row_chunks(15, V, TINY_CHUNK))) == 8
    # a chunk budget smaller than one row still makes progress, one row at a time
    assert len(list(_row_chunks(4, 100, 1))) == 4
    assert len(list(_row_chunks(4, 100, DEFAULT_CHUNK_ELEMENTS))) == 1


@pytest.mark.parametrize("chunk", [TINY_CHUNK, 1, DEFAULT_CHUNK_ELEMENTS])
def test_selective_logprobs_matches_log_softmax_gather(chunk):
    logits, tokens = _logits(), _tokens()
    out = selective_logprobs(logits, tokens, chunk_elements=chunk)
    assert out.dtype == torch.float32 and out.shape == (B, T)
    torch.testing.assert_close(out, naive_logprobs(logits, tokens), rtol=1e-5, atol=1e-5)


def test_selective_logprobs_by_hand():
    # logits [0, ln 2, ln 3, ln 4]: softmax = [1, 2, 3, 4] / 10
    logits = torch.tensor([[0.0, math.log(2), math.log(3), math.log(4)]])
    out = selective_logprobs(logits, torch.tensor([2]))
    assert out.item() == pytest.approx(math.log(0.3), abs=1e-6)


@pytest.mark.parametrize("chunk", [TINY_CHUNK, 1])
def test_selective_logprobs_gradient_matches_autograd(chunk):
    logits, tokens = _logits(1), _tokens(1)
    w = torch.randn(B, T, generator=torch.Generator().manual_seed(7))  # a non-uniform upstream gradient
    a = logits.clone().requires_grad_()
    (selective_logprobs(a, tokens, chunk_elements=chunk) * w).sum().backward()
    b = logits.clone().requires_grad_()
    (naive_logprobs(b, tokens) * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    # the rows of d log p_y / dz sum to 0 (onehot - softmax)
    torch.testing.assert_close(a.grad.sum(-1), torch.zeros(B, T), rtol=0, atol=1e-5)


def test_selective_logprobs_double_input_upcasts_to_float32():
    # The Function computes in float32 whatever comes in, so gradcheck at float64 precision does not
    # apply; compare against autograd of the float64 reference within float32 tolerance instead.
    logits, tokens = _logits(2, dtype=torch.float64), _tokens(2)
    a = logits.clone().requires_grad_()
    out = selective_logprobs(a, tokens, chunk_elements=TINY_CHUNK)
    assert out.dtype == torch.float32
    out.sum().backward()
    assert a.grad.dtype == torch.float64
    b = logits.clone().requires_grad_()
    ref = torch.log_softmax(b, -1).gather(-1, tokens[..., None]).squeeze(-1)
    ref.sum().backward()
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_selective_logprobs_bfloat16():
    logits, tokens = _logits(3, dtype=torch.bfloat16), _tokens(3)
    a = logits.clone().requires_grad_()
    out = selective_logprobs(a, tokens, chunk_elements=TINY_CHUNK)
    assert out.dtype == torch.float32
    # bf16 → float32 is exact, so the result equals the float32 computation on the same values
    torch.testing.assert_close(out, naive_logprobs(logits, tokens), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert a.grad.dtype == torch.bfloat16
    b = logits.float().requires_grad_()
    naive_logprobs(b, tokens).sum().backward()
    torch.testing.assert_close(a.grad.float(), b.grad, rtol=1e-2, atol=1e-2)


def test_selective_logprobs_int32_tokens_and_extra_dims():
    logits = _logits(4, shape=(2, 2, 3, V))
    tokens = _tokens(4, shape=(2, 2, 3)).to(torch.int32)
    torch.testing.assert_close(selective_logprobs(logits, tokens, 5), naive_logprobs(logits, tokens.long()))


def test_selective_logprobs_large_logits_are_stable():
    logits = _logits(5) * 1e4
    tokens = _tokens(5)
    out = selective_logprobs(logits, tokens, TINY_CHUNK)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, naive_logprobs(logits, tokens), rtol=1e-5, atol=1e-3)


def test_selective_logprobs_validation():
    logits = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"tokens must have shape \(2, 3\) \(logits without V\), got \(2, 4\)"):
        selective_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tokens must hold integer ids, got dtype torch.float32"):
        selective_logprobs(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"tokens must hold integer ids, got dtype torch.bool"):
        selective_logprobs(logits, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"logits must be a torch.Tensor, got list"):
        selective_logprobs([[0.0]], torch.zeros(1, dtype=torch.long))


# --------------------------------------------------------------------------------------------
# entropy
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [TINY_CHUNK, 1, DEFAULT_CHUNK_ELEMENTS])
def test_entropy_matches_minus_sum_p_log_p(chunk):
    logits = _logits(6)
    out = entropy_from_logits(logits, chunk_elements=chunk)
    assert out.dtype == torch.float32 and out.shape == (B, T)
    torch.testing.assert_close(out, naive_entropy(logits), rtol=1e-5, atol=1e-5)


def test_entropy_by_hand():
    # uniform over 4 → ln 4; p = [1/2, 1/4, 1/4] (logits ln 2, 0, 0) → 1.5 ln 2
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4), abs=1e-6)
    h = entropy_from_logits(torch.tensor([math.log(2), 0.0, 0.0]))
    assert h.item() == pytest.approx(1.5 * math.log(2), abs=1e-6)
    # a (near-)deterministic distribution has (near-)zero entropy
    assert entropy_from_logits(torch.tensor([1000.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("chunk", [TINY_CHUNK, 1])
def test_entropy_gradient_matches_autograd(chunk):
    logits = _logits(7)
    w = torch.randn(B, T, generator=torch.Generator().manual_seed(8))
    a = logits.clone().requires_grad_()
    (entropy_from_logits(a, chunk_elements=chunk) * w).sum().backward()
    b = logits.clone().requires_grad_()
    (naive_entropy(b) * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_entropy_double_input():
    logits = _logits(8, dtype=torch.float64)
    a = logits.clone().requires_grad_()
    out = entropy_from_logits(a, TINY_CHUNK)
    out.sum().backward()
    b = logits.clone().requires_grad_()
    ref = -(torch.softmax(b, -1) * torch.log_softmax(b, -1)).sum(-1)
    ref.sum().backward()
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)
    assert a.grad.dtype == torch.float64
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_entropy_bfloat16():
    logits = _logits(9, dtype=torch.bfloat16)
    a = logits.clone().requires_grad_()
    out = entropy_from_logits(a, TINY_CHUNK)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, naive_entropy(logits), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert a.grad.dtype == torch.bfloat16 and torch.isfinite(a.grad.float()).all()


def test_entropy_with_minus_inf_logits_is_finite():
    # tokens masked out with -inf (e.g. top-k / vocabulary padding) contribute nothing
    logits = torch.tensor([[0.0, -math.inf, 0.0, -math.inf], [math.log(2), 0.0, 0.0, -math.inf]])
    a = logits.clone().requires_grad_()
    h = entropy_from_logits(a, chunk_elements=1)
    assert not torch.isnan(h).any()
    torch.testing.assert_close(h, torch.tensor([math.log(2), 1.5 * math.log(2)]))
    h.sum().backward()
    assert not torch.isnan(a.grad).any()
    assert a.grad[0, 1] == 0 and a.grad[0, 3] == 0 and a.grad[1, 3] == 0
    # the finite part of the gradient matches autograd over the finite logits only
    b = torch.tensor([math.log(2), 0.0, 0.0]).requires_grad_()
    naive_entropy(b).backward()
    torch.testing.assert_close(a.grad[1, :3], b.grad, rtol=1e-5, atol=1e-6)


def test_selective_logprobs_with_minus_inf_logits_elsewhere():
    logits = torch.tensor([[0.0, -math.inf, 0.0, -math.inf]]).requires_grad_()
    lp = selective_logprobs(logits, torch.tensor([0]))
    assert lp.item() == pytest.approx(math.log(0.5))
    lp.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[0.5, 0.0, -0.5, 0.0]]))


def test_entropy_validation():
    with pytest.raises(ValueError, match=r"logits must have a vocabulary dimension, got shape \(\)"):
        entropy_from_logits(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"logits must have a vocabulary dimension, got shape \(2, 0\)"):
        entropy_from_logits(torch.zeros(2, 0))
    with pytest.raises(ValueError, match=r"logits must be a torch.Tensor, got list"):
        entropy_from_logits([1.0, 2.0])


def test_gradcheck_with_float32_tolerances():
    # Both Functions compute in float32 even for float64 input, so the default gradcheck (eps=1e-6,
    # atol=1e-5) sees float32 rounding in its finite differences; with eps and tolerances suited to
    # float32 the analytic backward agrees with the numerical Jacobian.
    x = _logits(10, dtype=torch.float64, shape=(2, 3, 5), scale=1.0).requires_grad_()
    tok = _tokens(10, shape=(2, 3), vocab=5)
    kw = dict(eps=1e-3, atol=1e-3, rtol=1e-2)
    assert torch.autograd.gradcheck(lambda z: selective_logprobs(z, tok, 7).double(), (x,), **kw)
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, 7).double(), (x,), **kw)


def test_non_contiguous_logits_slice():
    # the usual call: logits[:, :-1] predicts tokens[:, 1:]
    full = _logits(11, shape=(2, 5, V)).requires_grad_()
    tokens = _tokens(11, shape=(2, 4))
    lp = selective_logprobs(full[:, :-1], tokens, TINY_CHUNK)
    ent = entropy_from_logits(full[:, :-1], TINY_CHUNK)
    (lp.sum() + ent.sum()).backward()
    got = full.grad.clone()
    full.grad = None
    (naive_logprobs(full[:, :-1], tokens).sum() + naive_entropy(full[:, :-1]).sum()).backward()
    torch.testing.assert_close(got, full.grad, rtol=1e-5, atol=1e-5)
    assert (got[:, -1] == 0).all()


# ----------------------------------------------------------------------------- log_kept_mass


# Probabilities 0.5, 0.3, 0.15, 0.05 over a vocabulary of four.
_P = torch.tensor([0.5, 0.3, 0.15, 0.05])


@pytest.mark.parametrize(
    "top_k, top_p, token, kept",
    [
        (0, 1.0, 3, 1.0),  # no truncation: log S = 0 exactly
        (0, 0.7, 0, 0.8),  # ascending cumsum 0.05, 0.2, 0.5, 1: those <= 0.3 go -> {0.5, 0.3}
        (1, 1.0, 0, 0.5),  # top-1 keeps the argmax alone
        (1, 1.0, 2, 0.65),  # ... and a sampled token outside it is counted in: 0.5 + 0.15
        (3, 0.6, 1, 0.8),  # top-3 renormalised: .5/.95, .3/.95, .15/.95; cumsum .158 <= .4 goes -> {0.5, 0.3}
        (3, 0.5, 0, 0.5),  # ... .158, .474 <= .5 go -> {0.5}
        (2, 1.0, 1, 0.8),  # top-2
        (4, 1.0, 3, 1.0),  # k >= V: off
    ],
)
def test_log_kept_mass_hand_computed(top_k, top_p, token, kept):
    logits = (_P.log() + 1.7)[None, None]  # a shift changes no probability
    got = log_kept_mass(logits, torch.tensor([[token]]), top_k=top_k, top_p=top_p)
    assert got.shape == (1, 1) and got.dtype == torch.float32
    assert got.item() == pytest.approx(math.log(kept), abs=1e-6)


def test_log_kept_mass_is_the_mass_transformers_warpers_keep():
    """The kept set is the one Hugging Face's TopK + TopP warpers leave finite (the sampler that
    draws the HF engine's tokens), chunked or not."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    logits, tokens = _logits(seed=3), _tokens(seed=3)
    for top_k, top_p in [(0, 0.7), (5, 1.0), (4, 0.6), (1, 0.9)]:
        flat = logits.reshape(-1, V)
        warped = flat
        if top_k:
            warped = TopKLogitsWarper(top_k)(None, warped)
        if top_p < 1:
            warped = TopPLogitsWarper(top_p)(None, warped)
        kept = torch.isfinite(warped)
        kept[torch.arange(len(flat)), tokens.reshape(-1)] = True
        probs = flat.softmax(-1)
        expected = torch.where(kept, probs, 0.0).sum(-1).log().reshape(B, T)
        for chunk in (DEFAULT_CHUNK_ELEMENTS, TINY_CHUNK):
            got = log_kept_mass(logits, tokens, top_k, top_p, chunk_elements=chunk)
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_log_kept_mass_rejects_bad_arguments():
    with pytest.raises(ValueError, match="top_p"):
        log_kept_mass(_logits(), _tokens(), top_p=0.0)
    with pytest.raises(ValueError, match="tokens must have shape"):
        log_kept_mass(_logits(), _tokens()[:, :2], top_k=2)


# ---------------------------------------------------------------- the temperature, applied in float32
@pytest.mark.parametrize("chunk", [TINY_CHUNK, DEFAULT_CHUNK_ELEMENTS])
def test_the_temperature_divides_float32_logits_as_a_sampler_does(chunk):
    """bfloat16 logits at τ = 0.7: log-probs, entropy and kept mass are those of float32 logits / τ (what
    transformers' warpers and vLLM sample from), not of bfloat16 logits / τ rounded to bfloat16 again."""
    logits, tokens, tau = _logits(dtype=torch.bfloat16, scale=8.0), _tokens(), 0.7
    scaled = logits.float() / tau
    got = selective_logprobs(logits, tokens, chunk, temperature=tau)
    torch.testing.assert_close(got, naive_logprobs(scaled, tokens), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(entropy_from_logits(logits, chunk, temperature=tau), naive_entropy(scaled))
    torch.testing.assert_close(
        log_kept_mass(logits, tokens, 3, 0.9, chunk, temperature=tau), log_kept_mass(scaled, tokens, 3, 0.9, chunk)
    )
    rounded = selective_logprobs(logits / tau, tokens, chunk)  # the old order: divided in bfloat16
    assert (rounded - got).abs().max() > 1e-2


def test_the_temperature_gradients_match_the_numerical_jacobian():
    """As ``test_gradcheck_with_float32_tolerances``: the chunks are float32 whatever the input."""
    x = _logits(10, dtype=torch.float64, shape=(2, 3, 5), scale=1.0).requires_grad_()
    tok = _tokens(10, shape=(2, 3), vocab=5)
    kw = dict(eps=1e-3, atol=1e-3, rtol=1e-2)
    assert torch.autograd.gradcheck(lambda z: selective_logprobs(z, tok, 7, temperature=0.7).double(), (x,), **kw)
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits(z, 7, temperature=1.3).double(), (x,), **kw)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        selective_logprobs(x, tok, temperature=0.0)
