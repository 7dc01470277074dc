"""Registries: names, lookups with helpful errors, signature checks, and every entry run through the
shared signature."""

import math

import pytest
import torch

from rlhfkit.algorithms import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    LossInputs,
    Registry,
    gae,
    group_advantages,
    kl_penalty,
    pg_loss,
    ppo_policy_loss,
    reinforce_advantages,
    rloo_advantages,
    sequence_rewards,
)

F64 = torch.float64
ADV_NAMES = [
    "batch_standardized",
    "gae",
    "group",
    "group_batch_std",
    "group_no_std",
    "reinforce",
    "reinforce_plus_plus",
    "rloo",
    "rloo_standardized",
]
LOSS_NAMES = ["cispo", "ppo_clip", "sapo", "vanilla", "vespo"]
KL_NAMES = ["abs", "k1", "k2", "k3"]


def test_every_name_is_registered():
    assert ADVANTAGE_ESTIMATORS.names() == ADV_NAMES
    assert POLICY_LOSSES.names() == LOSS_NAMES
    assert KL_ESTIMATORS.names() == KL_NAMES
    for reg, names in [(ADVANTAGE_ESTIMATORS, ADV_NAMES), (POLICY_LOSSES, LOSS_NAMES), (KL_ESTIMATORS, KL_NAMES)]:
        for n in names:
            assert n in reg and callable(reg.get(n))
        assert "nope" not in reg


def test_get_unknown_name_lists_valid_names_and_suggests():
    with pytest.raises(ValueError) as err:
        ADVANTAGE_ESTIMATORS.get("rlooo")
    msg = str(err.value)
    assert "unknown advantage estimator 'rlooo'" in msg
    assert (
        "valid: batch_standardized, gae, group, group_batch_std, group_no_std, reinforce, reinforce_plus_plus, rloo, "
        "rloo_standardized." in msg
    )
    assert "Did you mean 'rloo'" in msg
    with pytest.raises(ValueError, match=r"Did you mean 'ppo_clip'\?"):
        POLICY_LOSSES.get("ppo-clip")
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k5'; valid: abs, k1, k2, k3\."):
        KL_ESTIMATORS.get("k5")


def test_get_unknown_name_without_close_match_has_no_hint():
    with pytest.raises(ValueError) as err:
        POLICY_LOSSES.get("zzzzzzzz")
    assert "Did you mean" not in str(err.value)
    assert "valid: cispo, ppo_clip, sapo, vanilla, vespo." in str(err.value)


def test_registering_twice_raises():
    reg = Registry("thing", ("x",))
    reg.register("a")(lambda x: x)
    with pytest.raises(ValueError, match=r"thing 'a' is already registered"):
        reg.register("a")(lambda x: x)
    # the global registries refuse too, and stay unchanged
    before = ADVANTAGE_ESTIMATORS.get("gae")
    with pytest.raises(ValueError, match=r"advantage estimator 'gae' is already registered"):
        ADVANTAGE_ESTIMATORS.register("gae")(lambda token_rewards, response_mask, **kw: None)
    assert ADVANTAGE_ESTIMATORS.get("gae") is before


def test_register_checks_positional_names():
    reg = Registry("policy loss", ("logprobs", "old_logprobs"), ("agg",))
    with pytest.raises(
        ValueError, match=r"policy loss 'bad' must take \(logprobs, old_logprobs\) first, got \(lp, old, agg\)"
    ):
        reg.register("bad")(lambda lp, old, agg=None: None)
    with pytest.raises(ValueError, match=r"must take \(logprobs, old_logprobs\) first, got \(logprobs\)"):
        reg.register("short")(lambda logprobs: None)
    assert reg.names() == []


def test_register_checks_keywords():
    reg = Registry("advantage estimator", ("token_rewards", "response_mask"), ("values", "gamma"))
    with pytest.raises(ValueError, match=r"advantage estimator 'bad' must accept keyword\(s\) \['gamma'\]"):
        reg.register("bad")(lambda token_rewards, response_mask, *, values=None: None)

    # **kwargs accepts every keyword
    def ok(token_rewards, response_mask, **kwargs):
        return token_rewards

    assert reg.register("ok")(ok) is ok
    assert reg.get("ok") is ok


def test_registered_signatures_fit_the_registry():
    for reg in (ADVANTAGE_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS):
        for name in reg.names():
            reg._check_signature(name, reg.get(name))  # raises if not


# --------------------------------------------------------------------------------------------
# every advantage estimator through the shared signature
# --------------------------------------------------------------------------------------------


def _batch(B=4, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=F64)
    values = torch.randn(B, T, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 1, 1, 0], [1, 1, 1, 0, 0]])[:B]
    return rewards * mask, values, mask


@pytest.mark.parametrize("name", ADV_NAMES)
def test_every_advantage_estimator_runs_with_shared_signature(name):
    rewards, values, mask = _batch()
    adv, ret = ADVANTAGE_ESTIMATORS.get(name)(rewards, mask, values=values, group_size=2, gamma=0.99, lam=0.95)
    assert adv.shape == rewards.shape
    assert torch.isfinite(adv).all()
    assert (adv[~mask.bool()] == 0).all()
    if ret is not None:
        assert ret.shape == rewards.shape
        assert (ret[~mask.bool()] == 0).all()


def test_gae_entry_needs_values():
    rewards, _, mask = _batch()
    with pytest.raises(ValueError, match=r"'gae' needs values from a critic \(values=None was given\)"):
        ADVANTAGE_ESTIMATORS.get("gae")(rewards, mask, values=None, group_size=2, gamma=1.0, lam=0.95)


def test_gae_entry_equals_gae():
    rewards, values, mask = _batch()
    adv, ret = ADVANTAGE_ESTIMATORS.get("gae")(rewards, mask, values=values, group_size=2, gamma=0.9, lam=0.8)
    adv2, ret2 = gae(rewards, values, mask, 0.9, 0.8)
    torch.testing.assert_close(adv, adv2)
    torch.testing.assert_close(ret, ret2)


def test_sequence_rewards_is_masked_row_sum():
    rewards = torch.tensor([[1.0, 2.0, math.nan], [0.5, 0.25, 0.125]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    torch.testing.assert_close(sequence_rewards(rewards, mask), torch.tensor([3.0, 0.625]))


@pytest.mark.parametrize(
    "name, seq_fn",
    [
        ("group", lambda r: group_advantages(r, 2, scale="std")),
        ("group_no_std", lambda r: group_advantages(r, 2, scale="none")),
        ("rloo", lambda r: rloo_advantages(r, 2)),
        ("reinforce", lambda r: reinforce_advantages(r, "batch_mean")),
    ],
)
def test_bandit_estimators_broadcast_the_sequence_estimate(name, seq_fn):
    rewards, values, mask = _batch()
    seq = (rewards * mask).sum(-1)
    adv, ret = ADVANTAGE_ESTIMATORS.get(name)(rewards, mask, values=values, group_size=2, gamma=0.9, lam=0.9)
    assert ret is None
    expected = seq_fn(seq)[:, None] * mask
    torch.testing.assert_close(adv, expected)


def test_bandit_rloo_by_hand():
    # two groups of 2; sequence rewards 1+2=3, 1 | 0.5, 4.5 → RLOO: [2, -2, -4, 4]
    rewards = torch.tensor([[1.0, 2.0], [1.0, 0.0], [0.5, 0.0], [4.0, 0.5]])
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1]])
    adv, _ = ADVANTAGE_ESTIMATORS.get("rloo")(rewards, mask, values=None, group_size=2, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0], [-2.0, 0.0], [-4.0, 0.0], [4.0, 4.0]]))


def test_group_estimators_need_a_group_size():
    rewards, _, mask = _batch()
    with pytest.raises(ValueError, match=r"group_size must be an int >= 2"):
        ADVANTAGE_ESTIMATORS.get("rloo")(rewards, mask)  # default group_size=1


def test_reinforce_plus_plus_is_whitened_discounted_return():
    rewards, values, mask = _batch(seed=3)
    gamma = 0.9
    adv, ret = ADVANTAGE_ESTIMATORS.get("reinforce_plus_plus")(
        rewards, mask, values=values, group_size=2, gamma=gamma, lam=0.3
    )
    m = mask.bool()
    # whitened over the batch's response tokens: mean 0, unbiased std 1
    assert adv[m].mean().item() == pytest.approx(0.0, abs=1e-9)
    assert adv[m].std(unbiased=True).item() == pytest.approx(1.0, abs=1e-6)
    # the returns are the discounted return-to-go over response tokens (values and lam ignored)
    for b in range(rewards.shape[0]):
        idx = [i for i in range(rewards.shape[1]) if m[b, i]]
        running = 0.0
        for i in reversed(idx):
            running = rewards[b, i].item() + gamma * running
            assert ret[b, i].item() == pytest.approx(running, abs=1e-12)
    expected_adv = (ret - ret[m].mean()) / ret[m].std(unbiased=True)
    torch.testing.assert_close(adv[m], expected_adv[m], rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------
# policy losses and KL estimators through the shared signatures
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_policy_loss_runs_with_shared_signature(name):
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 4, generator=g, dtype=F64)
    lp = (old + 0.3 * torch.randn(3, 4, generator=g, dtype=F64)).requires_grad_()
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    knobs = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}
    declared = {h.name for h in POLICY_LOSSES.hyperparameters(name)}
    out = POLICY_LOSSES.get(name)(
        LossInputs(lp, old, adv, mask, "token-mean"), **{k: knobs[k] for k in declared & set(knobs)}
    )
    loss, metrics = out.loss, out.metrics
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert "policy/approx_kl" in metrics
    loss.backward()
    assert torch.isfinite(lp.grad).all()


def test_policy_loss_entries_forward_their_arguments():
    g = torch.Generator().manual_seed(6)
    old = -torch.rand(2, 3, generator=g, dtype=F64)
    lp = old + 0.5 * torch.randn(2, 3, generator=g, dtype=F64)
    adv = torch.randn(2, 3, generator=g, dtype=F64)
    mask = torch.ones(2, 3)
    kw = dict(clip_low=0.1, clip_high=0.3, dual_clip=2.0)
    inputs = LossInputs(lp, old, adv, mask, agg="seq-mean-token-sum-norm", horizon=7)
    got = POLICY_LOSSES.get("ppo_clip")(inputs, **kw).loss
    want, _ = ppo_policy_loss(lp, old, adv, mask, agg="seq-mean-token-sum-norm", horizon=7, **kw)
    assert got.item() == want.item()
    got = POLICY_LOSSES.get("vanilla")(inputs).loss
    want, _ = pg_loss(lp, old, adv, mask, agg="seq-mean-token-sum-norm", horizon=7)
    assert got.item() == want.item()
    # vanilla's defaults: seq-mean-token-sum
    got = POLICY_LOSSES.get("vanilla")(LossInputs(lp, old, adv, mask)).loss
    assert got.item() == pytest.approx((-(adv * lp).sum() / 2).item())


@pytest.mark.parametrize("name", KL_NAMES)
def test_every_kl_estimator_matches_kl_penalty(name):
    g = torch.Generator().manual_seed(7)
    lp, ref = -torch.rand(2, 5, generator=g, dtype=F64), -torch.rand(2, 5, generator=g, dtype=F64)
    torch.testing.assert_close(KL_ESTIMATORS.get(name)(lp, ref), kl_penalty(lp, ref, name))
    assert name in KL_ESTIMATORS.get(name).__doc__


def test_registering_a_non_function_is_refused():
    from rlhfkit.algorithms import Registry

    class Callable:
        def __call__(self, logprobs, ref_logprobs):
            return logprobs

    with pytest.raises(ValueError, match="must be a plain function, got Callable"):
        Registry("demo", ("logprobs", "ref_logprobs")).register("x")(Callable())


def test_iterating_a_registry_gives_its_names_in_registration_order():
    reg = Registry("thing", ("x",))
    for name in ("zeta", "alpha", "mid"):
        reg.register(name)(lambda x: x)
    assert list(reg) == ["zeta", "alpha", "mid"] and len(reg) == 3
    assert reg.names() == ["alpha", "mid", "zeta"]
    assert ", ".join(reg) == "zeta, alpha, mid"


def test_did_you_mean_is_the_one_hint():
    from rlhfkit.algorithms.registry import did_you_mean

    assert did_you_mean("kl_cof", ["kl_coef", "gamma", "lam"]) == " Did you mean 'kl_coef'?"
    assert did_you_mean("zzzz", ["kl_coef", "gamma"]) == ""
    assert did_you_mean("ab", ["abc", "abd", "abe", "abf"]).count("'") == 6  # three at most
