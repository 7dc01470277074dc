"""Rows whose loss has no gradient (a zero advantage on every token, nothing else in the loss) are
left out of the update's forward/backward (``skip_zero_gradient_rows``): the same weights as running
them, fewer positions computed."""

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import RLTrainer

FLAT = {"abc", "xyz 12", "go", "hi there"}  # prompts whose completions all score the same: zero advantage


def half_flat(prompts, completions, **columns):
    """The toy reward, but 0.5 for every completion of the FLAT prompts."""
    scores = fraction_of_a(prompts, completions)
    return [0.5 if p in FLAT else s for p, s in zip(prompts, scores)]


class FlatAfter:
    """The toy reward on the first ``n`` calls, then the same score for everything."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __call__(self, prompts, completions, **columns):
        self.calls += 1
        return fraction_of_a(prompts, completions) if self.calls <= self.n else [0.5] * len(completions)


def train(reward, **overrides):
    tok = char_tokenizer()
    args = dict(
        algorithm="grpo",
        learning_rate=3e-3,
        max_new_tokens=8,
        max_steps=3,
        log_every=0,
        seed=0,
        prompts_per_step=4,
        kl_coef=0.0,
        mini_batch_size=8,
        micro_batch_size=4,
    )
    args.update(overrides)
    trainer = RLTrainer(
        tiny_causal_lm(tok, seed=0), [reward], RLConfig(**args), train_dataset=PROMPTS, processing_class=tok
    )
    return trainer, trainer.train()


def assert_same_weights(a, b):
    for (name, x), (_, y) in zip(a.models.policy.named_parameters(), b.models.policy.named_parameters(), strict=True):
        torch.testing.assert_close(x, y, atol=5e-5, rtol=1e-4, msg=name)


def test_rows_without_gradient_are_not_run_and_the_weights_are_the_same():
    runs = [train(half_flat, skip_zero_gradient_rows=skip) for skip in (False, True)]
    (full, full_history), (skipped, history) = runs
    assert [r["reward/mean"] for r in history] == pytest.approx([r["reward/mean"] for r in full_history])
    assert [r["policy/loss"] for r in history] == pytest.approx([r["policy/loss"] for r in full_history], abs=1e-6)
    fractions = [r["policy/zero_gradient_rows_frac"] for r in history]
    assert all(0 < f < 1 for f in fractions), fractions  # the FLAT prompts' groups, and only some rows
    assert "policy/zero_gradient_rows_frac" not in full_history[0]
    for r, f in zip(history, full_history):  # fewer positions through the model, the rest needed alike
        assert r["perf/tokens_computed_update"] < f["perf/tokens_computed_update"]
    assert_same_weights(full, skipped)


def test_a_step_where_no_row_has_gradient_still_steps_the_optimizer():
    """Step 1 has a gradient, steps 2-3 none: AdamW's moments still move the weights there, as after
    running rows of zero gradient; one zero-weight pass gives every parameter its zero gradient."""
    runs = [train(FlatAfter(1), skip_zero_gradient_rows=skip) for skip in (False, True)]
    (full, full_history), (skipped, history) = runs
    assert [r["policy/zero_gradient_rows_frac"] for r in history[1:]] == [1.0, 1.0]
    assert "policy/entropy" not in history[1] and "policy/entropy" in full_history[1]  # no row ran: no entropy
    assert history[1]["perf/grad_norm"] == 0.0
    assert_same_weights(full, skipped)


@pytest.mark.parametrize("overrides", [dict(entropy_coef=0.01), dict(kl_coef=0.05)])
def test_every_row_runs_when_the_loss_has_another_term(overrides):
    """An entropy bonus or β·KL in the loss reaches every row: none is left out."""
    _, history = train(half_flat, max_steps=1, **overrides)
    assert "policy/zero_gradient_rows_frac" not in history[0]


def test_a_policy_loss_that_does_not_declare_it_runs_every_row(monkeypatch):
    """A loss registered with ``zero_at_zero_advantage=False`` (a loss with a term of its own, say)
    keeps every row in the update: here the vanilla loss, seen through a registry that says so."""
    from rlhfkit.algorithms import POLICY_LOSSES
    from rlhfkit.rl import update as update_module

    class Undeclared:  # POLICY_LOSSES as the update sees it, with the trait False
        get = staticmethod(POLICY_LOSSES.get)

        @staticmethod
        def traits(name):
            return {**POLICY_LOSSES.traits(name), "zero_at_zero_advantage": False}

    _, history = train(half_flat, max_steps=1, policy_loss="vanilla")
    assert history[0]["policy/zero_gradient_rows_frac"] > 0
    monkeypatch.setattr(update_module, "POLICY_LOSSES", Undeclared)
    _, history = train(half_flat, max_steps=1, policy_loss="vanilla")
    assert "policy/zero_gradient_rows_frac" not in history[0]
