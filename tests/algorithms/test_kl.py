"""KL estimators (k1 / k2 / k3 / abs) and the fixed / adaptive KL controllers."""

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlhfkit.algorithms import AdaptiveKLController, FixedKLController, kl_penalty

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


LOGP = [-1.0, -0.5, -2.0, -0.1]
REF = [-1.5, -0.5, -1.0, -0.4]
# d = log p - log q = [0.5, 0.0, -1.0, 0.3]


def test_k1_k2_abs_by_hand():
    lp, ref = t([LOGP]), t([REF])
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), t([[0.5, 0.0, -1.0, 0.3]]))
    torch.testing.assert_close(kl_penalty(lp, ref), t([[0.5, 0.0, -1.0, 0.3]]))  # k1 is the default
    # k2 = 0.5 d^2
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), t([[0.125, 0.0, 0.5, 0.045]]))
    torch.testing.assert_close(kl_penalty(lp, ref, "abs"), t([[0.5, 0.0, 1.0, 0.3]]))


def test_k3_by_hand():
    # k3 = exp(log q - log p) - (log q - log p) - 1 with log r = -d
    lp, ref = t([LOGP]), t([REF])
    expected = [math.exp(-d) + d - 1 for d in (0.5, 0.0, -1.0, 0.3)]
    # e.g. d = -1: e^1 - 1 - 1 = 0.718281828...
    assert expected[2] == pytest.approx(0.718281828459045)
    torch.testing.assert_close(kl_penalty(lp, ref, "k3"), t([expected]))


def test_k3_is_clamped_for_huge_log_ratios():
    # log r = log q - log p = 100 is clamped to 20: exp(20) - 20 - 1, finite in float32.
    k3 = kl_penalty(torch.tensor([-100.0, 0.0]), torch.tensor([0.0, -100.0]), "k3")
    assert torch.isfinite(k3).all()
    torch.testing.assert_close(k3, torch.tensor([math.exp(20) - 21.0, math.exp(-20) + 19.0]))


def test_unknown_estimator():
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'; valid: 'k1', 'k2', 'k3', 'abs'"):
        kl_penalty(torch.zeros(2), torch.zeros(2), "k4")


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"logprobs=\(2, 3\), ref_logprobs=\(2, 4\)"):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 4))


_finite = st.floats(min_value=-30.0, max_value=30.0, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(_finite, _finite), min_size=1, max_size=64))
@example([(0.0, 1e-6)])
def test_k3_non_negative_float32(pairs):
    """k3 = (r - 1) - log r ≥ 0 for every r > 0 (documented: "always ≥ 0"), also in float32."""
    lp = torch.tensor([p for p, _ in pairs], dtype=torch.float32)
    ref = torch.tensor([q for _, q in pairs], dtype=torch.float32)
    assert (kl_penalty(lp, ref, "k3") >= 0).all()


def test_k3_non_negative_float32_tiny_log_ratio():
    """Policy and reference agree closely early in training; a tiny log-ratio must not give k3 < 0.

    log p = 0, log q = 1e-6: the true k3 is ~5e-13; ``exp(1e-6)`` rounds in float32 so that
    ``exp(x) - x - 1`` comes out as -5.96e-8 (one float32 ulp below 0). ``expm1(x) - x`` does not.
    """
    k3 = kl_penalty(torch.tensor([0.0, 0.0, -2.5]), torch.tensor([1e-6, -1e-4, -2.5001]), "k3")
    assert (k3 >= 0).all(), k3.tolist()
    torch.testing.assert_close(k3, torch.tensor([0.5e-12, 0.5e-8, 0.5e-8]), rtol=1e-3, atol=1e-7)


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(_finite, _finite), min_size=1, max_size=64))
def test_k3_non_negative_float64_and_k2_abs_formulas(pairs):
    lp = torch.tensor([p for p, _ in pairs], dtype=F64)
    ref = torch.tensor([q for _, q in pairs], dtype=F64)
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    d = lp - ref
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), 0.5 * d * d)
    torch.testing.assert_close(kl_penalty(lp, ref, "abs"), torch.sqrt(d * d))
    assert (kl_penalty(lp, ref, "k2") >= 0).all()


def test_k1_and_k3_sample_means_approach_exact_kl():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=F64)
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist()))
    # 0.5 ln 2.5 + 0.3 ln 0.6 + 0.2 ln(2/3) = 0.458145 - 0.153248 - 0.081093 = 0.223804
    assert exact == pytest.approx(0.2238, abs=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    lp, lq = p.log()[x], q.log()[x]
    k1 = kl_penalty(lp, lq, "k1").mean().item()
    k3 = kl_penalty(lp, lq, "k3").mean().item()
    assert k1 == pytest.approx(exact, abs=0.01)
    assert k3 == pytest.approx(exact, abs=0.01)
    # k2 is biased: its mean is 0.5·E[(log p/q)^2], not KL (here clearly different)
    exact_k2 = sum(0.5 * pi * math.log(pi / qi) ** 2 for pi, qi in zip(p.tolist(), q.tolist()))
    assert kl_penalty(lp, lq, "k2").mean().item() == pytest.approx(exact_k2, abs=0.01)


def test_kl_penalty_gradients():
    lp = t([0.3, -0.2]).requires_grad_()
    ref = t([0.0, 0.0])
    kl_penalty(lp, ref, "k3").sum().backward()
    # d/dlp [exp(-d) + d - 1] = 1 - exp(-d)
    torch.testing.assert_close(lp.grad, t([1 - math.exp(-0.3), 1 - math.exp(0.2)]))


# --------------------------------------------------------------------------------------------
# Controllers
# --------------------------------------------------------------------------------------------


def test_fixed_controller_is_constant():
    c = FixedKLController(0.05)
    assert c.value == 0.05
    for kl in (0.0, 1.0, 100.0):
        assert c.update(kl, 256) == 0.05
    assert c.value == 0.05
    assert c.state_dict() == {"value": 0.05}
    c2 = FixedKLController(0.0)
    c2.load_state_dict({"value": 0.3})
    assert c2.value == 0.3
    with pytest.raises(ValueError, match=r"kl_coef must be >= 0, got -0.1"):
        FixedKLController(-0.1)


def test_adaptive_controller_by_hand():
    c = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    # KL = 7: e = 7/6 - 1 = 1/6 (inside ±0.2); β = 0.1 · (1 + (1/6)·256/10000) = 0.1 · 1.0042666...
    assert c.update(7.0, 256) == pytest.approx(0.1 * (1 + 256 / 60_000), rel=1e-12)
    assert c.value == pytest.approx(0.100426666666667, rel=1e-12)


def test_adaptive_controller_clips_error_high():
    c = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    # KL = 12: e = 1 → clipped to 0.2; β = 0.1 · (1 + 0.2·256/10000) = 0.1 · 1.00512
    assert c.update(12.0, 256) == pytest.approx(0.100512, rel=1e-12)
    # the clip holds for any larger KL too
    c2 = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    assert c2.update(1e9, 256) == pytest.approx(0.100512, rel=1e-12)


def test_adaptive_controller_clips_error_low():
    c = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    # KL = 0: e = -1 → clipped to -0.2; β = 0.1 · (1 - 0.2·256/10000) = 0.099488
    assert c.update(0.0, 256) == pytest.approx(0.099488, rel=1e-12)
    # KL = 5.4: e = -0.1 (inside); β = 0.099488 · (1 - 0.1·100/10000) = 0.099488 · 0.999
    assert c.update(5.4, 100) == pytest.approx(0.099488 * 0.999, rel=1e-12)


def test_adaptive_controller_at_target_is_unchanged_and_accepts_tensor_kl():
    c = AdaptiveKLController(0.2, target=0.5, horizon=1000)
    assert c.update(torch.tensor(0.5), 64) == pytest.approx(0.2, rel=1e-12)


def test_adaptive_controller_state_dict_round_trip():
    c = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    for kl in (7.0, 12.0, 3.0):
        c.update(kl, 256)
    state = c.state_dict()
    fresh = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    fresh.load_state_dict(state)
    assert fresh.value == c.value
    assert fresh.update(8.0, 512) == c.update(8.0, 512)


def test_adaptive_controller_validation():
    with pytest.raises(ValueError, match=r"target and horizon must be > 0, got target=0.0, horizon=10"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match=r"horizon=-1"):
        AdaptiveKLController(0.1, target=1.0, horizon=-1)
    with pytest.raises(ValueError, match=r"kl_coef must be >= 0"):
        AdaptiveKLController(-1.0, target=1.0, horizon=1)


def test_kl_estimators_in_the_loss_follow_the_documented_gradients():
    """Exact expectation over a 5-token categorical π_θ = softmax(θ) against a fixed reference: the
    gradient of E_{x~π}[k(x)] taken through log π(x) only (the samples are fixed, as in a loss) is
    0 for k1, ∇KL(π‖ref) for k2 and ∇KL(ref‖π) for k3 (registry traits and RLConfig.kl_estimator)."""
    from rlhfkit.algorithms import KL_ESTIMATORS

    torch.manual_seed(0)
    theta0 = torch.randn(5, dtype=torch.float64)
    ref = torch.log_softmax(torch.randn(5, dtype=torch.float64), -1)

    def surrogate_grad(name):
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(theta, -1)
        weights = logp.detach().exp()  # the sampling distribution: not differentiated
        (weights * KL_ESTIMATORS.get(name)(logp, ref)).sum().backward()
        return theta.grad

    def true_grad(direction):
        theta = theta0.clone().requires_grad_(True)
        logp = torch.log_softmax(theta, -1)
        kl = (logp.exp() * (logp - ref)).sum() if direction == "pi||ref" else (ref.exp() * (ref - logp)).sum()
        kl.backward()
        return theta.grad

    torch.testing.assert_close(surrogate_grad("k1"), torch.zeros(5, dtype=torch.float64))
    torch.testing.assert_close(surrogate_grad("k2"), true_grad("pi||ref"))
    torch.testing.assert_close(surrogate_grad("k3"), true_grad("ref||pi"))
    assert not torch.allclose(surrogate_grad("k3"), true_grad("pi||ref"))
