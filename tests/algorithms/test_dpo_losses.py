"""The DPO-family losses against values computed by hand (the arithmetic is in the comments, with
math.log / math.exp, never the function under test), their gradients, their limits, and their
argument checks."""

import math

import pytest
import torch

from rlhfkit.algorithms import DPO_LOSS_TYPES, dpo_loss


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def test_sigmoid_is_dpo():
    # pair 0: h = (-5 - -7) - (-6 - -6) = 2, β h = 0.2 -> -log σ(0.2) = log(1 + e^-0.2) = 0.598139
    # pair 1: h = (-4 - -3) - (-4 - -4) = -1, β h = -0.1 -> log(1 + e^0.1) = 0.744397
    losses, chosen, rejected = dpo_loss(t(-5, -4), t(-7, -3), t(-6, -4), t(-6, -4), beta=0.1)
    assert losses.tolist() == pytest.approx([math.log1p(math.exp(-0.2)), math.log1p(math.exp(0.1))], rel=1e-6)
    assert losses.tolist() == pytest.approx([0.598139, 0.744397], abs=1e-6)
    # rewards: β (c - c_ref) = 0.1 * (-5 + 6) = 0.1, 0.1 * (-4 + 4) = 0; β (r - r_ref) = -0.1, 0.1
    assert chosen.tolist() == pytest.approx([0.1, 0.0], abs=1e-7)
    assert rejected.tolist() == pytest.approx([-0.1, 0.1], abs=1e-7)


def test_label_smoothing_is_conservative_dpo():
    # h = 2, β = 0.5 -> β h = 1; ε = 0.2: -(0.8) log σ(1) - 0.2 log σ(-1)
    #   = 0.8 * 0.313262 + 0.2 * 1.313262 = 0.513262
    losses, _, _ = dpo_loss(t(-5), t(-7), t(-6), t(-6), beta=0.5, label_smoothing=0.2)
    expected = -0.8 * log_sigmoid(1.0) - 0.2 * log_sigmoid(-1.0)
    assert losses.item() == pytest.approx(expected, rel=1e-6) and expected == pytest.approx(0.513262, abs=1e-6)


def test_label_smoothing_is_the_expected_loss_under_flipped_labels():
    # With probability ε the pair is reversed (h -> -h): E[loss] = (1-ε) L(h) + ε L(-h).
    c, r, cr, rr = t(-3, -8), t(-6, -2), t(-4, -5), t(-4, -5)
    eps = 0.3
    smoothed, _, _ = dpo_loss(c, r, cr, rr, beta=0.2, label_smoothing=eps)
    straight, _, _ = dpo_loss(c, r, cr, rr, beta=0.2)
    flipped, _, _ = dpo_loss(r, c, rr, cr, beta=0.2)
    assert torch.allclose(smoothed, (1 - eps) * straight + eps * flipped, atol=1e-6)


def test_hinge_is_slic():
    # β = 0.5: h = 2 -> max(0, 1 - 1) = 0; h = -1 -> max(0, 1 + 0.5) = 1.5; h = 0.4 -> 1 - 0.2 = 0.8
    losses, _, _ = dpo_loss(t(-5, -4, -1.0), t(-7, -3, -1.4), t(-6, -4, -2), t(-6, -4, -2), beta=0.5, loss_type="hinge")
    assert losses.tolist() == pytest.approx([0.0, 1.5, 0.8], abs=1e-6)


def test_ipo_on_length_normalised_log_probs():
    # c = -6 over 3 tokens -> -2; r = -8 over 4 -> -2; c_ref = -9/3 = -3; r_ref = -4/4 = -1
    # h̄ = (-2 - -2) - (-3 - -1) = 2; β = 0.25 -> 1/(2β) = 2 -> (2 - 2)^2 = 0
    # second pair: c = -2/2 = -1, r = -6/3 = -2, refs -1 and -1 -> h̄ = 1 - 0 = 1; β = 0.25 -> (1 - 2)^2 = 1
    losses, chosen, rejected = dpo_loss(
        t(-6, -2),
        t(-8, -6),
        t(-9, -2),
        t(-4, -3),
        beta=0.25,
        loss_type="ipo",
        chosen_lengths=t(3, 2),
        rejected_lengths=t(4, 3),
    )
    assert losses.tolist() == pytest.approx([0.0, 1.0], abs=1e-6)
    # rewards on the normalised log-probs: 0.25 * (-2 - -3) = 0.25; 0.25 * (-1 - -1) = 0
    assert chosen.tolist() == pytest.approx([0.25, 0.0], abs=1e-7)
    assert rejected.tolist() == pytest.approx([0.25 * (-2 + 1), 0.25 * (-2 + 1)], abs=1e-7)


def test_simpo_is_reference_free_and_length_normalised():
    # c = -6/3 = -2, r = -12/4 = -3; β = 2, γ = 0.5: -log σ(2*-2 - 2*-3 - 0.5) = -log σ(1.5) = 0.201413
    losses, chosen, rejected = dpo_loss(
        t(-6), t(-12), beta=2.0, loss_type="simpo", simpo_gamma=0.5, chosen_lengths=t(3), rejected_lengths=t(4)
    )
    assert losses.item() == pytest.approx(-log_sigmoid(1.5), rel=1e-6)
    assert losses.item() == pytest.approx(0.201413, abs=1e-6)
    assert (chosen.item(), rejected.item()) == pytest.approx((-4.0, -6.0))


def test_the_sigmoid_gradient_is_minus_beta_sigma_of_minus_beta_h():
    # d/dc [-log σ(β h)] = -β σ(-β h) (h grows with c); d/dr = +β σ(-β h)
    c, r = t(-5, -4).requires_grad_(), t(-7, -3).requires_grad_()
    losses, chosen, _ = dpo_loss(c, r, t(-6, -4), t(-6, -4), beta=0.1)
    losses.sum().backward()
    for i, h in enumerate([2.0, -1.0]):
        sig = 1 / (1 + math.exp(0.1 * h))  # σ(-β h)
        assert c.grad[i].item() == pytest.approx(-0.1 * sig, rel=1e-5)
        assert r.grad[i].item() == pytest.approx(0.1 * sig, rel=1e-5)
    assert not chosen.requires_grad  # rewards are detached


@pytest.mark.parametrize("loss_type", ["sigmoid", "hinge", "ipo"])
def test_the_reference_gets_no_gradient(loss_type):
    # Reference log-probs that require grad (e.g. computed without no_grad): only the policy learns.
    c, r = t(-5, -4).requires_grad_(), t(-7, -3).requires_grad_()
    c_ref, r_ref = t(-6, -4).requires_grad_(), t(-5, -2).requires_grad_()
    losses, _, _ = dpo_loss(
        c, r, c_ref, r_ref, beta=0.1, loss_type=loss_type, chosen_lengths=t(2, 3), rejected_lengths=t(3, 2)
    )
    losses.sum().backward()
    assert c_ref.grad is None and r_ref.grad is None
    assert c.grad.abs().sum() > 0 and r.grad.abs().sum() > 0


def test_large_margins_stay_finite():
    losses, _, _ = dpo_loss(t(1e4), t(-1e4), t(0.0), t(0.0), beta=1.0)
    assert torch.isfinite(losses).all() and losses.item() == pytest.approx(0.0, abs=1e-6)
    losses, _, _ = dpo_loss(t(-1e4), t(1e4), t(0.0), t(0.0), beta=1.0)
    assert losses.item() == pytest.approx(2e4, rel=1e-6)  # -log σ(-2e4) = 2e4, not inf
    for loss_type in DPO_LOSS_TYPES:
        refs = (t(0.0), t(0.0)) if DPO_LOSS_TYPES.traits(loss_type)["reference"] else (None, None)
        out, _, _ = dpo_loss(
            t(-1e4),
            t(1e4),
            *refs,
            beta=1.0,
            loss_type=loss_type,
            chosen_lengths=t(1),
            rejected_lengths=t(1),
            **_eps(loss_type),
        )
        if loss_type != "discopop":  # e^{-βh}: DiscoPOP's exponential arm is unbounded where the policy is wrong
            assert torch.isfinite(out).all(), loss_type


def _eps(loss_type):
    """EXO needs a label smoothing > 0 (TRL's rule)."""
    return {"label_smoothing": 1e-3} if loss_type == "exo_pair" else {}


def test_wider_inputs_keep_their_precision():
    losses, _, _ = dpo_loss(
        torch.tensor([-5.0], dtype=torch.float64),
        torch.tensor([-7.0], dtype=torch.float64),
        torch.tensor([-6.0], dtype=torch.float64),
        torch.tensor([-6.0], dtype=torch.float64),
    )
    assert losses.dtype == torch.float64
    half, _, _ = dpo_loss(t(-5).half(), t(-7).half(), t(-6).half(), t(-6).half())
    assert half.dtype == torch.float32


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(loss_type="kto"), "loss_type must be one of sigmoid, ipo, hinge, simpo"),
        (dict(beta=0.0), "beta must be > 0"),
        (dict(label_smoothing=0.5), r"label_smoothing must be in \[0, 0.5\)"),
        (
            dict(label_smoothing=0.1, loss_type="hinge"),
            "label_smoothing applies to loss_type='sigmoid' or loss_type='robust' or loss_type='exo_pair' or "
            "loss_type='aot' or loss_type='aot_unpaired' only",
        ),
        (dict(loss_type="exo_pair"), "Label smoothing must be greater than 0.0 when using 'exo_pair' loss"),
        (dict(loss_type=["sigmoid", "hinge"], loss_weights=[1.0]), "one weight per loss type"),
        (dict(loss_type=["sigmoid", "sigmoid"]), "names a loss twice"),
        (dict(f_divergence_type="tv"), "f_divergence_type must be one of reverse_kl, forward_kl"),
        (dict(f_divergence_type="js_divergence", loss_type="nca_pair"), "only supported for the following loss"),
        (dict(loss_type="sft", lengths=True), "reference-free"),
        (dict(loss_type="discopop", discopop_tau=0.0), "discopop_tau must be > 0"),
        (dict(ref=False), "needs ref_chosen_logps and ref_rejected_logps"),
        (dict(loss_type="simpo", lengths=True), "reference-free"),
        (dict(loss_type="ipo"), "needs chosen_lengths and rejected_lengths"),
        (dict(rejected=t(-1, -2)), "shape mismatch"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, message):
    kwargs = dict(kwargs)
    refs = (t(-1), t(-1)) if kwargs.pop("ref", True) else (None, None)
    lengths = dict(chosen_lengths=t(1), rejected_lengths=t(1)) if kwargs.pop("lengths", False) else {}
    rejected = kwargs.pop("rejected", t(-2))
    with pytest.raises(ValueError, match=message):
        dpo_loss(t(-1), rejected, *refs, **lengths, **kwargs)


@pytest.mark.parametrize("loss_type", DPO_LOSS_TYPES)
def test_traits_decide_the_arguments_each_loss_needs(loss_type):
    traits = DPO_LOSS_TYPES.traits(loss_type)
    refs = (t(-1), t(-1)) if traits["reference"] else (None, None)
    lengths = dict(chosen_lengths=t(2), rejected_lengths=t(3))
    eps = _eps(loss_type)
    losses, _, _ = dpo_loss(t(-1), t(-2), *refs, loss_type=loss_type, **lengths, **eps)
    assert torch.isfinite(losses).all()
    with pytest.raises(ValueError, match="reference-free" if not traits["reference"] else "needs ref_chosen_logps"):
        dpo_loss(
            t(-1),
            t(-2),
            *((t(-1), t(-1)) if not traits["reference"] else (None, None)),
            loss_type=loss_type,
            **lengths,
            **eps,
        )
    if traits["length_normalised"]:
        with pytest.raises(ValueError, match="needs chosen_lengths"):
            dpo_loss(t(-1), t(-2), *refs, loss_type=loss_type, **eps)
    else:  # the lengths change nothing
        assert torch.equal(dpo_loss(t(-1), t(-2), *refs, loss_type=loss_type, **eps)[0], losses)
    if not traits["smoothing"]:
        with pytest.raises(ValueError, match="label_smoothing applies to loss_type='sigmoid' or"):
            dpo_loss(t(-1), t(-2), *refs, loss_type=loss_type, label_smoothing=0.1, **lengths)
    if not traits["f_divergence"]:
        with pytest.raises(ValueError, match="only supported for the following loss types"):
            dpo_loss(t(-1), t(-2), *refs, loss_type=loss_type, f_divergence_type="forward_kl", **lengths, **eps)


# ---------------------------------------------------------------- robust DPO, NCA, SPPO (hard), APO
# One pair by hand: c = -1, r = -3, c_ref = -2, r_ref = -2, β = 0.5: c̃ = 1, r̃ = -1, h = 2, β h = 1.
PAIR = dict(
    chosen_logps=torch.tensor([-1.0]),
    rejected_logps=torch.tensor([-3.0]),
    ref_chosen_logps=torch.tensor([-2.0]),
    ref_rejected_logps=torch.tensor([-2.0]),
    beta=0.5,
)


def _ls(x):  # log σ(x)
    return -math.log1p(math.exp(-x))


def _s(x):  # σ(x)
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize(
    "loss_type,expected",
    [
        ("nca_pair", -_ls(0.5) - 0.5 * _ls(-0.5) - 0.5 * _ls(0.5)),  # β c̃ = 0.5, β r̃ = -0.5
        ("sppo_hard", (1 - 1.0) ** 2 + (-1 + 1.0) ** 2),  # 1/(2β) = 1: exactly at SPPO's targets, 0
        ("apo_zero", 1 - _s(0.5) + _s(-0.5)),
        ("apo_down", _s(0.5) + 1 - _s(1.0)),
        ("robust", -_ls(1.0)),  # ε = 0: plain DPO
    ],
)
def test_the_paired_losses_by_hand(loss_type, expected):
    losses, chosen_r, rejected_r = dpo_loss(**PAIR, loss_type=loss_type)
    assert losses.item() == pytest.approx(expected, abs=1e-6)
    assert chosen_r.item() == pytest.approx(0.5) and rejected_r.item() == pytest.approx(-0.5)  # β c̃, β r̃


def test_robust_dpo_is_unbiased_under_flipped_labels():
    """Chowdhury et al.: with labels flipped at rate ε, the expected robust loss is the clean DPO loss —
    (1-ε) L_robust(h) + ε L_robust(-h) = -log σ(β h), by hand at ε = 0.2."""
    eps, flipped = 0.2, {**PAIR, "chosen_logps": PAIR["rejected_logps"], "rejected_logps": PAIR["chosen_logps"]}
    flipped.update(ref_chosen_logps=PAIR["ref_rejected_logps"], ref_rejected_logps=PAIR["ref_chosen_logps"])
    clean = dpo_loss(**PAIR, loss_type="robust", label_smoothing=eps)[0]
    noisy = dpo_loss(**flipped, loss_type="robust", label_smoothing=eps)[0]
    assert ((1 - eps) * clean + eps * noisy).item() == pytest.approx(-_ls(1.0), abs=1e-6)
    assert clean.item() == pytest.approx((-(0.8) * _ls(1.0) + 0.2 * _ls(-1.0)) / 0.6, abs=1e-6)


# ---------------------------------------------------------------- BCO, EXO, DiscoPOP, length-normalised DPO
@pytest.mark.parametrize(
    "loss_type,extra,expected",
    [
        ("bco_pair", {}, -_ls(0.5) - _ls(0.5)),  # -log σ(β c̃) - log σ(-β r̃), β c̃ = 0.5, β r̃ = -0.5
        # EXO, ε = 0.1: σ(1) (log σ(1) - log 0.9) + σ(-1) (log σ(-1) - log 0.1)
        (
            "exo_pair",
            dict(label_smoothing=0.1),
            _s(1.0) * (_ls(1.0) - math.log(0.9)) + _s(-1.0) * (_ls(-1.0) - math.log(0.1)),
        ),
        # DiscoPOP, τ = 0.05: m = σ(1 / 0.05) = σ(20); (1 - m) (-log σ(1)) + m e^-1
        ("discopop", {}, (1 - _s(20.0)) * -_ls(1.0) + _s(20.0) * math.exp(-1.0)),
        ("discopop", dict(discopop_tau=2.0), (1 - _s(0.5)) * -_ls(1.0) + _s(0.5) * math.exp(-1.0)),
    ],
)
def test_bco_exo_discopop_by_hand(loss_type, extra, expected):
    losses, chosen_r, rejected_r = dpo_loss(**PAIR, loss_type=loss_type, **extra)
    assert losses.item() == pytest.approx(expected, abs=1e-6)
    assert chosen_r.item() == pytest.approx(0.5) and rejected_r.item() == pytest.approx(-0.5)


def test_exo_at_small_smoothing_approaches_its_kl():
    """EXO's loss is KL(q || p) with q = (σ(βh), σ(-βh)) and p = (1-ε, ε): it is >= 0 and 0 where q = p."""
    eps = 0.1
    h = math.log((1 - eps) / eps)  # σ(h) = 1 - ε
    pair = dict(PAIR, chosen_logps=torch.tensor([-2.0 + h]), rejected_logps=torch.tensor([-2.0]), beta=1.0)
    assert dpo_loss(**pair, loss_type="exo_pair", label_smoothing=eps)[0].item() == pytest.approx(0.0, abs=1e-6)
    assert dpo_loss(**PAIR, loss_type="exo_pair", label_smoothing=eps)[0].item() > 0


def test_sigmoid_norm_is_dpo_on_per_token_log_ratios():
    # c̃ / 2 = 0.5, r̃ / 4 = -0.25: h̄ = 0.75, β h̄ = 0.375 -> -log σ(0.375)
    losses, chosen_r, rejected_r = dpo_loss(
        **PAIR, loss_type="sigmoid_norm", chosen_lengths=t(2), rejected_lengths=t(4)
    )
    assert losses.item() == pytest.approx(-_ls(0.375), abs=1e-6)
    assert (chosen_r.item(), rejected_r.item()) == pytest.approx((0.25, -0.125))  # β c̃/|c|, β r̃/|r|


# ---------------------------------------------------------------- AOT, SFT, combinations
TWO = dict(
    chosen_logps=t(-1, -2),
    rejected_logps=t(-3, -1),
    ref_chosen_logps=t(-2, -2),
    ref_rejected_logps=t(-2, -4),
    beta=0.5,
)


def test_aot_sorts_over_the_batch():
    # paired: c - r = (2, -1) -> sorted (-1, 2); c_ref - r_ref = (0, 2) -> (0, 2); δ = (-1, 0)
    losses, _, _ = dpo_loss(**TWO, loss_type="aot")
    assert losses.tolist() == pytest.approx([-_ls(-0.5), math.log(2)], abs=1e-6)
    # unpaired: c̃ = (1, 0) -> (0, 1); r̃ = (-1, 3) -> (-1, 3); δ = (1, -2)
    losses, _, _ = dpo_loss(**TWO, loss_type="aot_unpaired")
    assert losses.tolist() == pytest.approx([-_ls(0.5), -_ls(-1.0)], abs=1e-6)
    # with ε = 0.2, conservative: -(0.8) log σ(x) - 0.2 log σ(-x)
    losses, _, _ = dpo_loss(**TWO, loss_type="aot_unpaired", label_smoothing=0.2)
    assert losses[0].item() == pytest.approx(-0.8 * _ls(0.5) - 0.2 * _ls(-0.5), abs=1e-6)


def test_sft_is_the_chosen_nll_per_token_of_the_batch():
    # -(Σ c) / (Σ |c|) = -(-1 - 2) / (2 + 4) = 0.5 on every pair; reference-free
    two = {k: v for k, v in TWO.items() if not k.startswith("ref")}
    losses, chosen_r, _ = dpo_loss(**two, loss_type="sft", chosen_lengths=t(2, 4), rejected_lengths=t(1, 1))
    assert losses.tolist() == pytest.approx([0.5, 0.5])
    assert chosen_r.tolist() == pytest.approx([0.5 * -1 / 2, 0.5 * -2 / 4])  # β c/|c|
    c = t(-1, -2).requires_grad_()
    dpo_loss(c, t(-3, -1), loss_type="sft", chosen_lengths=t(2, 4), rejected_lengths=t(1, 1))[0].mean().backward()
    assert c.grad.tolist() == pytest.approx([-1 / 6, -1 / 6])  # d/dc_i of -(Σ c)/6


def test_a_list_of_losses_is_their_weighted_sum():
    """MPO's recipe (sigmoid + bco_pair + sft, weights 0.8 / 0.2 / 1.0) on PAIR, lengths 2 and 4."""
    lengths = dict(chosen_lengths=t(2), rejected_lengths=t(4))
    losses, chosen_r, rejected_r = dpo_loss(
        **PAIR, loss_type=["sigmoid", "bco_pair", "sft"], loss_weights=[0.8, 0.2, 1.0], **lengths
    )
    expected = 0.8 * -_ls(1.0) + 0.2 * (-_ls(0.5) - _ls(0.5)) + 1.0 * (1 / 2)  # sft: -(-1)/2
    assert losses.item() == pytest.approx(expected, abs=1e-6)
    assert (chosen_r.item(), rejected_r.item()) == pytest.approx((0.5, -0.5))  # not all per token: β c̃, β r̃
    unweighted = dpo_loss(**PAIR, loss_type=["sigmoid", "hinge"])[0]
    assert unweighted.item() == pytest.approx(-_ls(1.0) + max(0.0, 1 - 1.0), abs=1e-6)
    # one ε for the listed losses that take one: robust reads it, hinge does not
    smoothed = dpo_loss(**PAIR, loss_type=["robust", "hinge"], label_smoothing=0.2)[0]
    assert smoothed.item() == pytest.approx((-(0.8) * _ls(1.0) + 0.2 * _ls(-1.0)) / 0.6, abs=1e-6)


# ---------------------------------------------------------------- f-divergences (f-DPO)
@pytest.mark.parametrize(
    "divergence,extra,margin",
    [
        ("reverse_kl", {}, 2.0),  # s(u) = u: h = c̃ - r̃ = 2
        ("forward_kl", {}, (1 - math.exp(-1.0)) - (1 - math.exp(1.0))),  # s(u) = 1 - e^-u
        ("js_divergence", {}, 1.0),  # s(u) = log 2 + log σ(u); log σ(1) - log σ(-1) = 1
        # α = 0.5: s(u) = (e^{-u/2} - 1) / (-1/2) = 2 (1 - e^{-u/2})
        ("alpha_divergence", {}, 2 * (1 - math.exp(-0.5)) - 2 * (1 - math.exp(0.5))),
        ("alpha_divergence", dict(f_alpha_divergence_coef=1.0), 2.0),  # α -> 1: reverse KL
    ],
)
def test_f_divergences_replace_the_log_ratios_by_their_scores(divergence, extra, margin):
    losses, chosen_r, _ = dpo_loss(**PAIR, f_divergence_type=divergence, **extra)
    assert losses.item() == pytest.approx(-_ls(0.5 * margin), abs=1e-6)
    assert chosen_r.item() == pytest.approx(0.5)  # the implicit rewards stay β c̃
    hinge = dpo_loss(**PAIR, loss_type="hinge", f_divergence_type=divergence, **extra)[0]
    assert hinge.item() == pytest.approx(max(0.0, 1 - 0.5 * margin), abs=1e-6)


def test_the_alpha_divergence_score_does_not_overflow():
    pair = dict(PAIR, rejected_logps=torch.tensor([-500.0]))  # r̃ = -498: e^{249} would overflow float32
    losses, _, _ = dpo_loss(**pair, f_divergence_type="alpha_divergence")
    assert torch.isfinite(losses).all()
