"""The importance-sampling correction of the engine/trainer mismatch, through the RL loop.

An engine that holds its own copy of the weights, off from the policy's by a known perturbation
and reporting its own log-probs (as vLLM does), drives every preset through ``train()``: each
policy-loss call receives exactly the weights the pure function ``rollout_is_weights`` gives for
the trainer's log-probs before the update against the engine's, and ``rollout/*`` is logged every
step. Hand-set engine log-probs check each mode's weights and masks. The formulas themselves are
tested in tests/algorithms/test_rollout_is.py; the real vLLM engine in tests/trainers/test_rl_vllm.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import rlhfkit.rl.update as update_module
from rlhfkit.algorithms import POLICY_LOSSES, rollout_is_weights
from rlhfkit.models import forward_response
from rlhfkit.rollout import HFEngine
from rlhfkit.tasks.toy import toy_trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class PerturbedEngine:
    """Samples with HF ``generate`` from its own copy of the policy, synced after every update
    like vLLM's, with ``noise`` added to the output layer; reports its own log-probs of the
    sampled tokens (renormalised over top-k/top-p, as vLLM's processed log-probs are) and keeps,
    for each step, the trainer policy's log-probs of the same tokens (π_old) to check against."""

    needs_sync = True

    def __init__(self, trainer, noise: float):
        self.trainer, self.synced_version = trainer, None
        self.copy = copy.deepcopy(trainer.models.policy).eval()
        head = self.copy.lm_head.weight
        self.offset = noise * torch.randn(head.shape, generator=torch.Generator().manual_seed(1))
        tok = trainer.tokenizer
        self.hf = HFEngine(self.copy, tok.pad_token_id, tok.eos_token_id, share_prompt=False)
        self.steps = []  # (rollout, π_old of its tokens) per generate

    def sync_weights(self, weights, version=None):
        state = dict(weights)
        state["lm_head.weight"] = state["lm_head.weight"] + self.offset
        self.copy.load_state_dict(state, strict=False)
        self.synced_version = version

    def generate(self, prompts, n, sampling, seed=None):
        rollout = self.hf.generate(prompts, n, sampling)
        args, T = self.trainer.args, rollout.response_mask.shape[1]
        support = (args.top_k, args.top_p)
        with torch.no_grad():
            mine = forward_response(
                self.copy, rollout.input_ids, rollout.attention_mask, T, args.temperature, support=support
            )
            old = forward_response(
                self.trainer.models.policy,
                rollout.input_ids,
                rollout.attention_mask,
                T,
                args.temperature,
                support=support,
            )
        rollout.logprobs = mine.logprobs - mine.log_kept_mass
        self.steps.append((rollout, old.logprobs - old.log_kept_mass))
        return rollout

    def sleep(self):
        pass


class RecordingLosses:
    """``POLICY_LOSSES`` as the loop sees it, recording the weights and mask of every call."""

    def __init__(self, trainer):
        self.trainer, self.calls = trainer, []

    def get(self, name):
        loss = POLICY_LOSSES.get(name)

        def recorded(inputs, **kw):
            self.calls.append((self.trainer.step, inputs.weights, inputs.response_mask.bool()))
            return loss(inputs, **kw)

        return recorded

    def traits(self, name):
        return POLICY_LOSSES.traits(name)


PRESETS = {
    "ppo-1-iteration": dict(algorithm="ppo", num_iterations=1),
    "ppo-4-iterations": dict(algorithm="ppo"),
    "grpo": dict(algorithm="grpo"),
    "dr_grpo": dict(algorithm="dr_grpo"),
    "reinforce": dict(algorithm="reinforce"),
    "reinforce_plus_plus": dict(algorithm="reinforce_plus_plus"),
    "rloo": dict(algorithm="rloo"),
}


@pytest.mark.parametrize("mode", ["token_truncate", "sequence_truncate", "token_mask"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_applies_the_correction_once_per_step(preset, mode, monkeypatch):
    # Every row runs (none is left out for a zero advantage), so every token's weight reaches a loss call.
    trainer = toy_trainer(
        max_steps=2, rollout_is=mode, rollout_is_threshold=1.3, skip_zero_gradient_rows=False, **PRESETS[preset]
    )
    engine = trainer.sampler.engine = PerturbedEngine(trainer, noise=0.01)
    recorder = RecordingLosses(trainer)
    monkeypatch.setattr(update_module, "POLICY_LOSSES", recorder)
    history = trainer.train()
    assert len(engine.steps) == 2
    for step, (row, (rollout, old)) in enumerate(zip(history, engine.steps)):
        for name in ("logprob_diff_mean", "logprob_diff_max", "is_weight_mean", "is_masked_frac"):
            assert f"rollout/{name}" in row, (step, name)
        mask = rollout.response_mask.bool()
        expected, kept, _ = rollout_is_weights(old, rollout.logprobs, mask, mode, 1.3)
        diff = (old - rollout.logprobs).abs()[mask]
        assert row["rollout/logprob_diff_max"] == pytest.approx(diff.max().item(), abs=1e-5)
        assert row["rollout/logprob_diff_max"] > 0.05  # the perturbation is seen
        calls = [c for c in recorder.calls if c[0] == step]
        assert calls and all(w is not None for _, w, _ in calls)  # corrected in every loss call
        applied = torch.sort(torch.cat([w[m] for _, w, m in calls])).values
        passes = trainer.args.num_iterations
        wanted = torch.sort(expected[kept].repeat(passes)).values
        assert applied.shape == wanted.shape  # a mask mode's rejected tokens left every call
        torch.testing.assert_close(applied, wanted, atol=1e-5, rtol=0)
        assert bool((applied != 1).any())


@pytest.mark.parametrize("top_p, top_k", [(0.7, 5), (1.0, 1), (0.9, 0)])
def test_truncated_sampling_is_not_counted_as_mismatch(top_p, top_k):
    """An engine with exactly the policy's weights that truncates (top-k / top-p) reports log-probs
    renormalised over the kept tokens: the trainer compares like with like, so the gap is float32
    noise and no token is masked (full-vocabulary log-probs would differ by log of the kept mass)."""
    trainer = toy_trainer("grpo", max_steps=2, rollout_is="token_mask", top_p=top_p, top_k=top_k)
    engine = trainer.sampler.engine = PerturbedEngine(trainer, noise=0.0)
    history = trainer.train()
    for row in history:
        assert row["rollout/logprob_diff_max"] < 1e-5 and row["rollout/is_masked_frac"] == 0
    rollout, _ = engine.steps[0]
    with torch.no_grad():
        full = forward_response(
            trainer.models.policy,
            rollout.input_ids,
            rollout.attention_mask,
            rollout.response_mask.shape[1],
            trainer.args.temperature,
        ).logprobs
    assert (full - rollout.logprobs)[rollout.response_mask.bool()].abs().max() > 0.01  # what it would be


def test_the_hf_engine_applies_no_weights_and_logs_no_mismatch(monkeypatch):
    """The HF engine samples from the trained weights: no weights reach the loss, the gap is 0."""
    trainer = toy_trainer("grpo", max_steps=2, rollout_is="token_truncate", prompts_per_step=4)
    recorder = RecordingLosses(trainer)
    monkeypatch.setattr(update_module, "POLICY_LOSSES", recorder)
    history = trainer.train()
    assert recorder.calls and all(w is None for _, w, _ in recorder.calls)
    for row in history:
        assert row["rollout/logprob_diff_max"] == 0 and row["rollout/is_masked_frac"] == 0


def _experience_with_engine_logprobs(mode, threshold=2.0, num_iterations=2):
    """A GRPO batch whose engine log-probs differ from the trainer's on two tokens: token (0, 0)
    had engine probability half the trainer's (ratio π_trainer/π_engine = 2), token (1, 0) three
    times it (ratio 1/3); every other token agrees. Two passes over the batch: the weights are
    computed with the old log-probs, before the update."""
    trainer = toy_trainer(
        "grpo",
        prompts_per_step=2,
        rollout_is=mode,
        rollout_is_threshold=threshold,
        kl_coef=0.0,
        num_iterations=num_iterations,
    )
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], 4, trainer.sampler.sampling
    )
    old = trainer.models.policy_outputs(rollout, with_values=False)[0]
    behaviour = old.clone()
    behaviour[0, 0] += math.log(0.5)
    behaviour[1, 0] += math.log(3.0)
    rollout.logprobs = behaviour
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    return trainer, trainer.make_experience(rollout, scores, valid, metrics), metrics


def test_token_truncate_weights_each_token_by_its_capped_ratio():
    _, exp, metrics = _experience_with_engine_logprobs("token_truncate")
    mask = exp.rollout.response_mask.bool()
    expected = torch.where(mask, 1.0, 0.0)
    expected[0, 0], expected[1, 0] = 2.0, 1 / 3  # min(2, C=2), min(1/3, 2)
    torch.testing.assert_close(exp.is_weights, expected, atol=1e-5, rtol=0)
    assert torch.equal(exp.mask, mask)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)
    n = mask.sum().item()
    assert metrics["rollout/logprob_diff_mean"].item() == pytest.approx((math.log(2) + math.log(3)) / n, abs=1e-5)
    assert metrics["rollout/is_weight_mean"].item() == pytest.approx((n - 2 + 2 + 1 / 3) / n, abs=1e-5)


def test_token_mask_drops_the_tokens_outside_the_bounds():
    _, exp, metrics = _experience_with_engine_logprobs("token_mask")
    mask = exp.rollout.response_mask.bool()
    kept = mask.clone()
    kept[1, 0] = False  # 1/3 < 1/C = 1/2; the ratio 2 is within [1/2, 2]
    assert torch.equal(exp.mask, kept)
    assert exp.is_weights[0, 0].item() == pytest.approx(2.0, abs=1e-5)
    assert metrics["rollout/is_masked_frac"].item() == pytest.approx(1 / mask.sum().item())


def test_sequence_mask_drops_whole_sequences_and_none_changes_nothing():
    _, exp, _ = _experience_with_engine_logprobs("sequence_mask", threshold=2.5)
    mask = exp.rollout.response_mask.bool()
    kept = mask.clone()
    kept[1] = False  # sequence ratio 1/3 < 1/2.5; row 0's ratio 2 <= 2.5 stays
    assert torch.equal(exp.mask, kept)
    _, plain, metrics = _experience_with_engine_logprobs("none")
    assert plain.is_weights is None and torch.equal(plain.mask, mask)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)  # measured anyway


def test_the_weights_reach_the_policy_loss():
    trainer, exp, _ = _experience_with_engine_logprobs("token_truncate")
    rows = torch.arange(exp.mask.shape[0])
    exp.advantages = torch.randn(exp.advantages.shape, generator=torch.Generator().manual_seed(0))  # not all 0
    weighted, _ = update_module.loss(trainer.models, trainer.args, exp, rows, trainer.kl_ctl.value)
    exp.is_weights = None
    plain, _ = update_module.loss(trainer.models, trainer.args, exp, rows, trainer.kl_ctl.value)
    assert not torch.isclose(weighted, plain)


def test_one_on_policy_pass_corrects_in_the_loss_with_the_same_result():
    """A single pass needs no separate old-log-prob pass: the loss's own (detached) log-probs are
    the old ones, so the weights computed there equal the precomputed ones."""
    trainer, exp, _ = _experience_with_engine_logprobs("token_truncate")
    rows = torch.arange(exp.mask.shape[0])
    exp.advantages = torch.randn(exp.advantages.shape, generator=torch.Generator().manual_seed(0))
    precomputed, _ = update_module.loss(trainer.models, trainer.args, exp, rows, trainer.kl_ctl.value)
    exp.old_logprobs, exp.is_weights, exp.correct_in_loss = None, None, True
    in_loss, metrics = update_module.loss(trainer.models, trainer.args, exp, rows, trainer.kl_ctl.value)
    torch.testing.assert_close(in_loss, precomputed, rtol=1e-6, atol=1e-7)
    assert metrics["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)
    single, single_exp, step_metrics = _experience_with_engine_logprobs("token_truncate", num_iterations=1)
    assert single_exp.old_logprobs is None and single_exp.is_weights is None  # no extra pass
    assert single_exp.correct_in_loss
    assert "rollout/logprob_diff_max" not in step_metrics
    update = single.update(single_exp)
    assert update["rollout/logprob_diff_max"].item() == pytest.approx(math.log(3), abs=1e-5)
    n = single_exp.mask.sum().item()
    assert update["rollout/logprob_diff_mean"].item() == pytest.approx((math.log(2) + math.log(3)) / n, abs=1e-5)
