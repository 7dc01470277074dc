"""Micro-batches bounded by tokens (``max_tokens_per_micro_batch``, ``models/micro_batches.py``):
the split respects the budget and keeps a prompt's group whole where it fits, and the update it
gives is the update of one batch (the loss weights are those of one batch)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.config import RLConfig, part
from rlhfkit.models import rl_models
from rlhfkit.models.micro_batches import DEFAULT_MAX_TOKENS, padded_tokens, row_spans, split_rows, token_budget
from rlhfkit.rl.update import MinibatchUpdate, micro_batch_split

from .test_rl_options import comparable_adam, make_trainer, record_grads, trained_params, varied_experience

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def spans(widths_lead, widths_tail):
    return torch.tensor(widths_lead), torch.tensor(widths_tail)


# ---------------------------------------------------------------- the split


def test_each_micro_batch_stays_within_the_budget_and_a_longer_row_runs_alone():
    lead, tail = spans([5, 5, 5, 5, 5, 5], [30, 2, 7, 1, 3, 95])  # row 5: 100 tokens, over the budget
    chunks = split_rows(torch.arange(6), lead, tail, max_tokens=40)
    assert sorted(torch.cat(chunks).tolist()) == list(range(6))  # every row once
    assert chunks[0].tolist() == [5]  # longest first, alone
    for c in chunks[1:]:
        assert padded_tokens(lead, tail, c) <= 40
    # widths 35 7 12 6 8 100, longest first: 100 alone, 35 alone (2 x 35 > 40), 12 8 7 (3 x 12), 6 (4 x 12 > 40)
    assert [c.tolist() for c in chunks] == [[5], [0], [1, 2, 4], [3]]


def test_within_a_micro_batch_rows_keep_their_given_order_and_a_batch_that_fits_is_one_micro_batch():
    lead, tail = spans([2, 2, 2, 2], [1, 4, 2, 3])
    rows = torch.tensor([3, 0, 2, 1])
    assert [c.tolist() for c in split_rows(rows, lead, tail, max_tokens=24)] == [[3, 0, 2, 1]]
    assert [c.tolist() for c in split_rows(rows, lead, tail, max_tokens=12)] == [[3, 1], [0, 2]]


def test_a_prompts_group_stays_whole_where_it_fits_and_is_split_into_rows_where_not():
    lead, tail = spans([4] * 6, [1, 2, 3, 6, 6, 6])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    whole = split_rows(torch.arange(6), lead, tail, max_tokens=30, groups=groups)
    assert [c.tolist() for c in whole] == [[3, 4, 5], [0, 1, 2]]  # 3 x 10, then 3 x 7
    rows = split_rows(torch.arange(6), lead, tail, max_tokens=29, groups=groups)  # group 1 (30) no longer fits
    assert [c.tolist() for c in rows] == [[3, 4], [5], [0, 1, 2]]  # 2 x 10; 10 (3 x 10 > 29); group 0 whole (21)
    for c in rows:
        assert padded_tokens(lead, tail, c) <= 29


def test_both_bounds_hold_when_micro_batch_size_is_set_too():
    lead, tail = spans([1] * 7, [1] * 7)
    chunks = split_rows(torch.arange(7), lead, tail, max_rows=3, max_tokens=100)
    assert [len(c) for c in chunks] == [3, 3, 1]
    chunks = split_rows(torch.arange(7), lead, tail, max_rows=3, max_tokens=4)
    assert [len(c) for c in chunks] == [2, 2, 2, 1]
    # without a budget: consecutive slices, as before
    assert [c.tolist() for c in split_rows(torch.tensor([4, 1, 0]), None, None, max_rows=2)] == [[4, 1], [0]]


def test_the_token_budget_in_force():
    assert token_budget(None, None) == DEFAULT_MAX_TOKENS == 16384
    assert token_budget(8, None) is None  # rows alone, as TRL's per_device_train_batch_size
    assert token_budget(8, 512) == token_budget(None, 512) == 512


def test_row_spans_count_the_columns_the_padded_pass_computes():
    # [pad pad p p | r r pad] and [pad p p p | r pad pad]: the pass keeps 3 prompt columns + 2 response ones
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0]])
    lead, tail = row_spans(mask, 3)
    assert lead.tolist() == [2, 3] and tail.tolist() == [2, 1]
    assert padded_tokens(lead, tail, torch.arange(2)) == 2 * (3 + 2)


# ---------------------------------------------------------------- the passes respect the budget


def recorded_passes(monkeypatch):
    """(rows, positions the unpacked pass computes) of every forward pass of the policy, the reference
    and a separate critic of ``RLModels``."""
    seen = []

    def record(fn):
        def wrapped(model, rollout, *args, **kwargs):
            lead, tail = row_spans(rollout.attention_mask, rollout.response_mask.shape[1])
            seen.append((rollout.input_ids.shape[0], padded_tokens(lead, tail, torch.arange(len(lead)))))
            return fn(model, rollout, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(rl_models, "forward_rollout", record(rl_models.forward_rollout))
    monkeypatch.setattr(rl_models, "rollout_values", record(rl_models.rollout_values))
    return seen


@pytest.mark.parametrize("budget", [20, 40])
def test_every_forward_pass_of_a_step_stays_within_the_budget(monkeypatch, budget):
    """A PPO step with a separate critic and a reference: the old log-probs, values, reference
    log-probs and the update's passes each hold at most ``budget`` tokens (or one row)."""
    trainer = make_trainer(
        algorithm="ppo",
        critic="separate",
        prompts_per_step=8,
        kl_coef=0.05,
        max_steps=1,
        max_tokens_per_micro_batch=budget,
    )
    seen = recorded_passes(monkeypatch)
    trainer.train()
    assert len(seen) > 2 * 5  # old log-probs, values, reference, update's log-probs and values: several each
    assert all(tokens <= budget or rows == 1 for rows, tokens in seen), seen
    assert any(rows > 1 for rows, _ in seen)


def test_the_log_prob_passes_run_filler_passes_up_to_the_most_micro_batches_of_any_process(monkeypatch):
    trainer = make_trainer(algorithm="grpo", kl_coef=0.05, max_tokens_per_micro_batch=40)
    exp = varied_experience(trainer)
    n = len(trainer.models.micro_batches(exp.rollout))
    expected = trainer.models.reference_logprobs(exp.rollout)
    monkeypatch.setattr(rl_models.distributed, "reduce_max", lambda value: value + 2)
    seen = recorded_passes(monkeypatch)
    got = trainer.models.reference_logprobs(exp.rollout)
    assert len(seen) == n + 2 and seen[-1][0] == seen[-2][0] == 1  # two one-row fillers
    torch.testing.assert_close(got, expected, atol=0, rtol=0)  # fillers change nothing


def test_old_logprobs_in_token_micro_batches_are_those_of_one_pass():
    """Micro-batches sorted by length: each row's outputs land back in its own place."""
    one = make_trainer(algorithm="ppo", critic="separate", prompts_per_step=8, max_tokens_per_micro_batch=10**6)
    split = make_trainer(algorithm="ppo", critic="separate", prompts_per_step=8, max_tokens_per_micro_batch=20)
    exp = varied_experience(one)
    assert len(split.models.micro_batches(exp.rollout)) >= 4
    assert [torch.cat(split.models.micro_batches(exp.rollout)).tolist()] != [list(range(8))]  # reordered
    a, b = (t.models.policy_outputs(exp.rollout, with_values=True) for t in (one, split))
    for x, y in zip(a[:2], b[:2]):  # on response tokens (what a pass leaves past them depends on its columns)
        torch.testing.assert_close(x[exp.mask], y[exp.mask], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- the update of one batch

CASES = {
    # share_prompt on (the default): 60 keeps each group of 4 whole (packed), 20 splits them into rows
    "grpo-token-mean-kl-entropy": dict(algorithm="grpo", loss_agg="token-mean", kl_coef=0.05, entropy_coef=0.01),
    "grpo-seq-mean-token-mean-kl": dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.05),
    "grpo-minibatches": dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.05, mini_batch_size=4),
    "ppo-separate-token-mean": dict(algorithm="ppo", critic="separate", prompts_per_step=8, loss_agg="token-mean"),
    "ppo-shared-seq-mean-token-mean": dict(
        algorithm="ppo", critic="shared", prompts_per_step=8, loss_agg="seq-mean-token-mean"
    ),
    "grpo-rows-and-tokens": dict(algorithm="grpo", loss_agg="token-mean", kl_coef=0.05, micro_batch_size=3),
}
BUDGETS = (60, 20, 1)


@pytest.mark.parametrize("case", list(CASES))
def test_token_micro_batches_give_the_update_of_one_batch(case):
    """From one fixed experience (responses of 1 .. 6 tokens), trainers that differ only in the token
    budget — none that splits (one micro-batch per minibatch), groups whole, rows, one row each —
    compute the same gradients and end with the same weights."""
    config = dict(CASES[case], num_iterations=1)
    trainers = {b: make_trainer(**config, max_tokens_per_micro_batch=b) for b in (10**6, *BUDGETS)}
    reference = trainers[10**6]
    exp = varied_experience(reference)
    assert exp.advantages[exp.mask].abs().max() > 1e-3
    if exp.ref_logprobs is not None and not reference.args.kl_in_reward:  # at step 0 the k3 term has no gradient
        noise = torch.randn(exp.ref_logprobs.shape, generator=torch.Generator().manual_seed(1))
        exp.ref_logprobs = exp.ref_logprobs + 0.5 * noise
    counts = {
        b: len(
            micro_batch_split(part(MinibatchUpdate, t.args), exp, t.models.token_budget(exp.rollout))(torch.arange(8))
        )
        for b, t in trainers.items()
    }
    assert counts[10**6] == (3 if config.get("micro_batch_size") == 3 else 1) and counts[1] == 8
    assert counts[60] < counts[20] < 8 or config.get("micro_batch_size")
    grads, params = {}, {}
    for b, trainer in trainers.items():
        comparable_adam(trainer)
        grads[b] = record_grads(trainer)
        torch.manual_seed(123)
        trainer.update(exp)
        params[b] = [p.detach().clone() for _, p in trained_params(trainer)]
    names = [n for n, _ in trained_params(reference)]
    for b in BUDGETS:
        assert len(grads[b]) == len(grads[10**6])
        for step in range(len(grads[b])):
            for name, g, g_ref in zip(names, grads[b][step], grads[10**6][step]):
                torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5, msg=f"grad {name} budget={b}")
        for name, p, p_ref in zip(names, params[b], params[10**6]):
            torch.testing.assert_close(p, p_ref, atol=1e-5, rtol=1e-5, msg=f"{name} budget={b}")


def test_with_share_prompt_the_update_keeps_each_group_in_one_micro_batch_where_it_fits():
    trainer = make_trainer(algorithm="grpo", max_tokens_per_micro_batch=60)
    exp = varied_experience(trainer)
    chunks = micro_batch_split(part(MinibatchUpdate, trainer.args), exp, trainer.models.token_budget(exp.rollout))(
        torch.arange(8)
    )
    index = exp.rollout.prompt_index
    assert [sorted(set(index[c].tolist())) for c in chunks] == [[0], [1]]
    unshared = make_trainer(algorithm="grpo", max_tokens_per_micro_batch=60, share_prompt=False)
    chunks = micro_batch_split(part(MinibatchUpdate, unshared.args), exp, unshared.models.token_budget(exp.rollout))(
        torch.arange(8)
    )
    assert any(len(set(index[c].tolist())) > 1 for c in chunks)  # rows alone: by length, across prompts


def test_the_default_runs_a_short_batch_as_one_micro_batch():
    config = RLConfig()
    assert config.micro_batch_size is None and config.max_tokens_per_micro_batch is None
    trainer = make_trainer(algorithm="grpo")
    exp = varied_experience(trainer)
    assert [
        c.tolist()
        for c in micro_batch_split(part(MinibatchUpdate, trainer.args), exp, trainer.models.token_budget(exp.rollout))(
            torch.arange(8)
        )
    ] == [list(range(8))]
