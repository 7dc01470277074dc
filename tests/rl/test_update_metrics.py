"""Every metric the update logs is the batch's own, whatever its micro-batches: one update of a fixed
batch with token budgets of 10⁶ (one micro-batch), 20 (a row or two each) and 1 (one row each) logs
the same metrics (``rl/update.py:update``; each metric's kind is declared, ``algorithms/metrics.py``).
The cases together log every metric the update logs. The process-count half is
``tests/distributed/test_distributed.py``: the update's metrics on one and on two processes."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, letter_teacher
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

BUDGETS = (10**6, 20, 1)

CASES = {
    # a critic, two passes over minibatches: the clip fractions, ratio mean and maximum, the value metrics
    "ppo-critic": dict(algorithm="ppo", prompts_per_step=8, mini_batch_size=8, value_clip=0.2, dual_clip=2.0),
    # one on-policy pass with an engine's own log-probs: the rollout correction in the loss (a mask mode that
    # zeroes the rejected tokens' weights), β·KL in the loss, the off-policy sequence mask, the adaptive entropy
    # bonus (not the high-entropy filter: its quantile is each micro-batch's own, as TRL's, so the gradient moves)
    "grpo-correction-in-loss": dict(
        algorithm="grpo",
        kl_coef=0.05,
        rollout_is="token_mask",
        rollout_is_threshold=1.2,
        rollout_is_zero_masked=True,
        off_policy_mask_threshold=0.02,
        use_adaptive_entropy=True,
        engine_noise=0.2,
    ),
    # the per-row mean of VESPO's weight, rows without gradient left out (policy/zero_gradient_rows_frac)
    "vespo": dict(algorithm="grpo", policy_loss="vespo", num_iterations=2, kl_coef=0.0, engine_noise=0.1),
    "sapo": dict(algorithm="grpo", policy_loss="sapo", num_iterations=2),
    "distill-full": dict(algorithm="distill", distillation_mode="full", distillation_beta=0.5, prompts_per_step=4),
}

# every metric the update logs, and a case that logs it
EVERY_METRIC = {
    "policy/loss", "policy/total_loss", "perf/grad_norm", "policy/entropy", "policy/entropy_coef",
    "policy/clip_frac", "policy/clip_frac_dual", "policy/approx_kl", "policy/approx_kl_k3", "policy/ratio_mean",
    "policy/ratio_max", "policy/sapo_gate_mean", "policy/vespo_phi_mean", "policy/kept_token_frac",
    "policy/zero_gradient_rows_frac", "critic/loss", "critic/value_clip_frac", "critic/values_mean",
    "critic/explained_variance", "kl/k1", "kl/k3", "distill/divergence", "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max", "rollout/is_weight_mean", "rollout/is_weight_std", "rollout/is_masked_frac",
    "rollout/kl_sampler_trainer",
}  # fmt: skip


def varied_reward(prompts, completions, **kwargs):
    """Scores that differ between completions (a random model scores ~0 on the toy task)."""
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def trainer(case: str, budget: int) -> RLTrainer:
    config = {k: v for k, v in CASES[case].items() if k != "engine_noise"}
    tok = char_tokenizer()
    # completions of 4 tokens at most: rows of 6 to 12 tokens, so a budget of 20 tokens holds one or two of them
    args = dict(learning_rate=3e-3, max_new_tokens=4, max_steps=1, log_every=0, seed=0, prompts_per_step=4)
    args.update(config, max_tokens_per_micro_batch=budget)
    teacher = letter_teacher(tok) if config["algorithm"] == "distill" else None
    return RLTrainer(
        tiny_causal_lm(tok, seed=0),
        [varied_reward],
        RLConfig(**args),
        train_dataset=PROMPTS,
        processing_class=tok,
        teacher_model=teacher,
    )


def experience(case: str):
    """One batch of the case; with ``engine_noise`` the engine's log-probs are the policy's plus noise
    (an engine that is not the trained model: the rollout correction has work to do)."""
    t = trainer(case, BUDGETS[0])
    rows = t.sampler.sample_prompts()
    rollout = t.sampler.engine.generate([t.sampler.prompt_ids[i] for i in rows], t.args.group_size, t.sampler.sampling)
    noise = CASES[case].get("engine_noise")
    if noise:
        with torch.no_grad():
            own = t.models.policy_outputs(rollout, with_values=False)[0]
        rollout.logprobs = own + noise * torch.randn(own.shape, generator=torch.Generator().manual_seed(5))
    scores, valid, metrics = t.sampler.score(rows, rollout)
    return t.make_experience(rollout, scores, valid, metrics)


@pytest.fixture(scope="module")
def updates() -> dict:
    """(case, budget) -> the metrics of one update of the case's batch by a fresh trainer with that budget."""
    out = {}
    for case in CASES:
        exp = experience(case)
        for budget in BUDGETS:
            t = trainer(case, budget)
            micro_batches: list[int] = []

            def counted(r, run=t.models.train_outputs, seen=micro_batches, **kw):
                seen.append(r.input_ids.shape[0])  # the rows of each micro-batch the update runs
                return run(r, **kw)

            t.models.train_outputs = counted
            out[case, budget] = {k: float(v) for k, v in t.update(exp).items()}
            out[case, budget, "rows"] = micro_batches
    return out


@pytest.mark.parametrize("case", CASES)
def test_every_metric_is_the_same_whatever_the_micro_batches(updates, case):
    one, few, single = (updates[case, b, "rows"] for b in BUDGETS)
    assert len(one) < len(few) < len(single) and set(single) == {1}  # three different splits ran
    whole = updates[case, BUDGETS[0]]
    for budget in BUDGETS[1:]:
        split = updates[case, budget]
        assert split.keys() == whole.keys()
        for name, value in whole.items():
            assert split[name] == pytest.approx(value, rel=1e-4, abs=1e-6), (name, budget)


def test_the_cases_log_every_metric_of_the_update_and_measure_something(updates):
    logged = {name for case in CASES for name in updates[case, BUDGETS[0]]}
    assert logged == EVERY_METRIC
    correction = updates["grpo-correction-in-loss", BUDGETS[0]]
    assert 0 < correction["rollout/is_masked_frac"] < 1 and correction["rollout/is_weight_std"] > 0.01
    assert 0 < correction["policy/kept_token_frac"] < 1
    assert updates["ppo-critic", BUDGETS[0]]["critic/explained_variance"] != 0
