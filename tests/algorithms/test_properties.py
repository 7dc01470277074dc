"""Properties (hypothesis): padding never changes a result; group permutations commute with the group
estimators; the vectorised code agrees with plain-Python loops."""

import math
import statistics

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.algorithms import (
    AGGREGATIONS,
    aggregate,
    gae,
    group_advantages,
    pg_loss,
    ppo_policy_loss,
    reinforce_advantages,
    rloo_advantages,
    token_level_rewards,
    value_loss,
    whiten,
)

F64 = torch.float64
# derandomize: the same examples on every run (no flaky CI); database=None: nothing written to disk
SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, database=None)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _random_mask(g, B, T, p=0.7, nonempty=True):
    mask = torch.rand(B, T, generator=g) < p
    if nonempty:
        mask[torch.arange(B), torch.randint(0, T, (B,), generator=g)] = True
    return mask


def _garbage(g, shape, kind):
    if kind == "nan":
        return torch.full(shape, math.nan, dtype=F64)
    if kind == "inf":
        return torch.where(torch.rand(shape, generator=g) < 0.5, math.inf, -math.inf).to(F64)
    return torch.randn(shape, generator=g, dtype=F64) * 1e6


class Padding:
    """Places a (B, T) batch at random rows/columns of a larger (B + pr, T + pc) batch; the new
    positions are masked out and hold garbage (NaN, ±inf, or huge numbers)."""

    def __init__(self, g, B, T, pad_rows, pad_cols, kind):
        self.g, self.kind = g, kind
        self.shape = (B + pad_rows, T + pad_cols)
        self.rows = torch.randperm(B + pad_rows, generator=g)[:B].sort().values
        self.cols = torch.randperm(T + pad_cols, generator=g)[:T].sort().values

    def pad(self, x):
        out = _garbage(self.g, self.shape, self.kind).to(x.dtype)
        out[self.rows[:, None], self.cols[None, :]] = x
        return out

    def pad_mask(self, m):
        out = torch.zeros(self.shape, dtype=torch.bool)
        out[self.rows[:, None], self.cols[None, :]] = m.bool()
        return out

    def crop(self, x):
        return x[self.rows[:, None], self.cols[None, :]]


batch = st.tuples(
    st.integers(1, 5),  # B
    st.integers(1, 6),  # T
    st.integers(0, 3),  # extra rows
    st.integers(0, 4),  # extra columns
    st.sampled_from(["nan", "inf", "huge"]),
    st.integers(0, 2**31 - 1),  # seed
)


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, equal_nan=False)


# --------------------------------------------------------------------------------------------
# padding invariance
# --------------------------------------------------------------------------------------------


@SETTINGS
@given(batch, st.floats(0.5, 1.0), st.floats(0.0, 1.0))
def test_padding_never_changes_gae(spec, gamma, lam):
    B, T, pr, pc, kind, seed = spec
    g = _gen(seed)
    r, v = torch.randn(B, T, generator=g, dtype=F64), torch.randn(B, T, generator=g, dtype=F64)
    mask = _random_mask(g, B, T, nonempty=False)
    P = Padding(g, B, T, pr, pc, kind)
    adv, ret = gae(r, v, mask, gamma, lam)
    adv_p, ret_p = gae(P.pad(r), P.pad(v), P.pad_mask(mask), gamma, lam)
    _close(P.crop(adv_p), adv)
    _close(P.crop(ret_p), ret)
    padded_mask = P.pad_mask(mask)
    assert (adv_p[~padded_mask] == 0).all() and (ret_p[~padded_mask] == 0).all()


@SETTINGS
@given(batch)
def test_padding_never_changes_aggregate(spec):
    B, T, pr, pc, kind, seed = spec
    g = _gen(seed)
    loss = torch.randn(B, T, generator=g, dtype=F64)
    mask = _random_mask(g, B, T, nonempty=False)
    P = Padding(g, B, T, pr, pc, kind)
    for mode in AGGREGATIONS:
        # the norm mode's horizon is a constant of the run, never the padded width
        horizon = 8 if mode == "seq-mean-token-sum-norm" else None
        a = aggregate(loss, mask, mode, horizon)
        b = aggregate(P.pad(loss), P.pad_mask(mask), mode, horizon)
        assert torch.isfinite(b)
        _close(b, a)


@SETTINGS
@given(batch, st.sampled_from(AGGREGATIONS), st.booleans())
def test_padding_never_changes_policy_losses(spec, agg, seq_adv):
    B, T, pr, pc, kind, seed = spec
    g = _gen(seed)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lp = old + 0.4 * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, T, generator=g, dtype=F64)
    mask = _random_mask(g, B, T, nonempty=False)
    P = Padding(g, B, T, pr, pc, kind)
    horizon = 8 if agg == "seq-mean-token-sum-norm" else None
    if seq_adv:  # (B,) advantages: pad the rows only
        adv = adv[:, 0]
        adv_p = _garbage(g, (B + pr,), kind)
        adv_p[P.rows] = adv
    else:
        adv_p = P.pad(adv)

    lp_leaf, lp_p_leaf = lp.clone().requires_grad_(), P.pad(lp).requires_grad_()
    for fn, kw in [(ppo_policy_loss, dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0)), (pg_loss, {})]:
        lp_leaf.grad = lp_p_leaf.grad = None
        loss, m = fn(lp_leaf, old, adv, mask, agg=agg, horizon=horizon, **kw)
        loss_p, m_p = fn(lp_p_leaf, P.pad(old), adv_p, P.pad_mask(mask), agg=agg, horizon=horizon, **kw)
        _close(loss_p, loss)
        assert m.keys() == m_p.keys()
        for k in m:
            _close(m_p[k].value, m[k].value)
        loss.backward()
        loss_p.backward()
        _close(P.crop(lp_p_leaf.grad), lp_leaf.grad)
        if kind == "huge":  # finite garbage gets exactly zero gradient
            assert (lp_p_leaf.grad[~P.pad_mask(mask)] == 0).all()


@SETTINGS
@given(batch, st.sampled_from([None, 0.2]), st.sampled_from(AGGREGATIONS))
def test_padding_never_changes_value_loss(spec, clip, agg):
    B, T, pr, pc, kind, seed = spec
    g = _gen(seed)
    v, old, ret = (torch.randn(B, T, generator=g, dtype=F64) for _ in range(3))
    mask = _random_mask(g, B, T, nonempty=False)
    P = Padding(g, B, T, pr, pc, kind)
    horizon = 8 if agg == "seq-mean-token-sum-norm" else None
    loss, m = value_loss(v, old, ret, mask, clip=clip, agg=agg, horizon=horizon)
    loss_p, m_p = value_loss(P.pad(v), P.pad(old), P.pad(ret), P.pad_mask(mask), clip=clip, agg=agg, horizon=horizon)
    _close(loss_p, loss)
    for k in m:
        _close(m_p[k].value, m[k].value)


@SETTINGS
@given(batch, st.floats(0.0, 1.0))
def test_padding_columns_never_changes_token_level_rewards(spec, kl_coef):
    B, T, _, pc, kind, seed = spec  # rows must be non-empty here: pad columns only
    g = _gen(seed)
    scores, kl = torch.randn(B, generator=g, dtype=F64), torch.randn(B, T, generator=g, dtype=F64)
    mask = _random_mask(g, B, T, nonempty=True)
    P = Padding(g, B, T, 0, pc, kind)
    out = token_level_rewards(scores, kl, mask, kl_coef)
    out_p = token_level_rewards(scores, P.pad(kl), P.pad_mask(mask), kl_coef)
    _close(P.crop(out_p), out)
    assert (out_p[~P.pad_mask(mask)] == 0).all()


@SETTINGS
@given(batch, st.booleans())
def test_padding_never_changes_whiten(spec, shift_mean):
    B, T, pr, pc, kind, seed = spec
    g = _gen(seed)
    x = torch.randn(B, T, generator=g, dtype=F64) * 2 + 1
    mask = _random_mask(g, B, T, nonempty=True)
    if mask.sum() < 2:
        mask[:] = True
        if mask.numel() < 2:
            return
    P = Padding(g, B, T, pr, pc, kind)
    w = whiten(x, mask, shift_mean=shift_mean)
    w_p = whiten(P.pad(x), P.pad_mask(mask), shift_mean=shift_mean)
    _close(P.crop(w_p), w)
    assert (w_p[~P.pad_mask(mask)] == 0).all()


# --------------------------------------------------------------------------------------------
# group permutations
# --------------------------------------------------------------------------------------------

groups = st.tuples(st.integers(1, 6), st.integers(2, 5), st.integers(0, 2**31 - 1))


@SETTINGS
@given(groups)
def test_permuting_groups_permutes_group_estimators(spec):
    n_groups, G, seed = spec
    g = _gen(seed)
    scores = torch.randn(n_groups * G, generator=g, dtype=F64)
    perm = torch.randperm(n_groups, generator=g)
    row_perm = (perm[:, None] * G + torch.arange(G)[None, :]).reshape(-1)  # whole groups move
    for fn in (
        lambda s: group_advantages(s, G, "std"),
        lambda s: group_advantages(s, G, "none"),
        lambda s: rloo_advantages(s, G),
    ):
        _close(fn(scores[row_perm]), fn(scores)[row_perm])
    # reordering completions inside a group reorders the output the same way
    inner = torch.cat([k * G + torch.randperm(G, generator=g) for k in range(n_groups)])
    _close(rloo_advantages(scores[inner], G), rloo_advantages(scores, G)[inner])
    _close(group_advantages(scores[inner], G), group_advantages(scores, G)[inner])


# --------------------------------------------------------------------------------------------
# vectorised vs plain-Python loops
# --------------------------------------------------------------------------------------------


def gae_loop(rewards, values, mask, gamma, lam):
    """GAE written the obvious way on lists: walk each row backwards over its response tokens."""
    adv = [[0.0] * len(row) for row in rewards]
    for b in range(len(rewards)):
        idx = [t for t in range(len(rewards[b])) if mask[b][t]]
        next_v, next_a = 0.0, 0.0
        for t in reversed(idx):
            delta = rewards[b][t] + gamma * next_v - values[b][t]
            next_a = delta + gamma * lam * next_a
            next_v = values[b][t]
            adv[b][t] = next_a
    ret = [[adv[b][t] + values[b][t] if mask[b][t] else 0.0 for t in range(len(adv[b]))] for b in range(len(adv))]
    return adv, ret


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 10), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 2**31 - 1))
def test_gae_matches_loop(B, T, gamma, lam, seed):
    g = _gen(seed)
    r, v = torch.randn(B, T, generator=g, dtype=F64), torch.randn(B, T, generator=g, dtype=F64)
    mask = _random_mask(g, B, T, p=0.6, nonempty=False)  # holes anywhere, empty rows too
    adv, ret = gae(r, v, mask, gamma, lam)
    adv_l, ret_l = gae_loop(r.tolist(), v.tolist(), mask.tolist(), gamma, lam)
    _close(adv, torch.tensor(adv_l, dtype=F64))
    _close(ret, torch.tensor(ret_l, dtype=F64))


def group_loop(scores, G, scale, eps):
    out = []
    for k in range(0, len(scores), G):
        grp = scores[k : k + G]
        mu = statistics.fmean(grp)
        sd = statistics.stdev(grp)
        out += [(x - mu) / (sd + eps) if scale == "std" else x - mu for x in grp]
    return out


def rloo_loop(scores, G):
    out = []
    for k in range(0, len(scores), G):
        grp = scores[k : k + G]
        for i, x in enumerate(grp):
            others = [y for j, y in enumerate(grp) if j != i]
            out.append(x - sum(others) / len(others))
    return out


@SETTINGS
@given(groups, st.sampled_from(["std", "none"]), st.sampled_from([1e-6, 1e-2]))
def test_group_estimators_match_loops(spec, scale, eps):
    n_groups, G, seed = spec
    g = _gen(seed)
    scores = torch.randn(n_groups * G, generator=g, dtype=F64)
    if seed % 3 == 0:  # binary verifier rewards, some groups all-equal
        scores = (scores > 0.3).to(F64)
    s = scores.tolist()
    _close(group_advantages(scores, G, scale, eps), torch.tensor(group_loop(s, G, scale, eps), dtype=F64))
    _close(rloo_advantages(scores, G), torch.tensor(rloo_loop(s, G), dtype=F64))
    _close(reinforce_advantages(scores), torch.tensor([x - statistics.fmean(s) for x in s], dtype=F64))


def aggregate_loop(loss, mask, mode, horizon):
    rows = [(sum(x for x, m in zip(lr, mr) if m), sum(mr)) for lr, mr in zip(loss, mask)]
    rows = [(s, n) for s, n in rows if n > 0]
    if not rows:
        return 0.0
    if mode in ("token-mean", "micro-batch-token-mean"):
        return sum(s for s, _ in rows) / sum(n for _, n in rows)
    if mode == "seq-mean-token-mean":
        return sum(s / n for s, n in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(s for s, _ in rows) / len(rows)
    return sum(s for s, _ in rows) / (len(rows) * horizon)


@SETTINGS
@given(st.integers(1, 6), st.integers(1, 8), st.integers(0, 2**31 - 1), st.sampled_from([None, 3, 16]))
def test_aggregate_matches_loop(B, T, seed, horizon):
    g = _gen(seed)
    loss = torch.randn(B, T, generator=g, dtype=F64)
    mask = _random_mask(g, B, T, p=0.5, nonempty=False)
    for mode in AGGREGATIONS:
        h = T if horizon is None else horizon
        expected = aggregate_loop(loss.tolist(), mask.int().tolist(), mode, h)
        got = aggregate(loss, mask, mode, horizon)
        assert math.isclose(got.item(), expected, rel_tol=1e-9, abs_tol=1e-12), (mode, got.item(), expected)
