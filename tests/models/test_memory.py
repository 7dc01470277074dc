"""The activation memory a pass keeps, measured (``models/activations.py``), and the policy that
keeps a run within its memory (``models/memory.py``): the probe's counts against hand-computed
sizes and against a real batch, checkpointing's gradients, and the plan's decisions on fixed numbers."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models.activations import (
    ActivationCost,
    checkpointable_layers,
    checkpointing,
    kept_bytes,
    measure_activation_cost,
)
from rlhfkit.models.loading import enable_activation_checkpointing
from rlhfkit.models.memory import SAFETY, MemoryPlan, free_bytes, resident_bytes
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def checkpointable_model(layers=2, attention="sdpa"):
    model = tiny_causal_lm(char_tokenizer(), layers=layers, seed=0)
    model.config._attn_implementation = attention
    enable_activation_checkpointing(model)
    return model.train()


def ids(rows, n):
    return (torch.arange(rows * n) % 20).view(rows, n)


def measured(model):
    layers = checkpointable_layers(model)
    return measure_activation_cost(
        lambda n: model(input_ids=ids(1, n)).logits.sum(), [model], layers, True, len(layers)
    ), layers


def test_a_checkpointed_layer_keeps_one_float32_hidden_state_per_token():
    """Hand-computed: with checkpointing, each layer keeps only its input (hidden_size float32 values
    per token), so one more layer costs exactly 4 x hidden_size bytes per token."""
    one, _ = measured(checkpointable_model(layers=1))
    three, _ = measured(checkpointable_model(layers=3))
    hidden = 64
    assert three.on[1] - one.on[1] == 2 * 4 * hidden
    assert three.off[1] - one.off[1] > 10 * (three.on[1] - one.on[1])  # without it a layer keeps far more


def test_eager_attention_keeps_its_probabilities_quadratically_and_sdpa_does_not():
    """Hand-computed: eager attention keeps each head's (T, T) float32 probabilities, 4 heads x 4 bytes
    per layer per token pair; SDPA keeps nothing quadratic."""
    eager, _ = measured(checkpointable_model(layers=3, attention="eager"))
    sdpa, _ = measured(checkpointable_model(layers=3))
    assert eager.off[2] == 3 * 4 * 4
    assert sdpa.off[2] == 0 and sdpa.on[2] == 0


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_probe_predicts_what_a_real_batch_keeps(attention):
    """Measured on one row of 16 / 32 / 64 tokens, predicted for 3 rows of 100 (extrapolated past the
    probe): within 2 % of what that batch's graph keeps, with checkpointing and without."""
    model = checkpointable_model(layers=2, attention=attention)
    cost, layers = measured(model)
    for on in (False, True):
        with checkpointing(layers, on):
            real, _ = kept_bytes(lambda: model(input_ids=ids(3, 100)).logits.sum())
        assert abs(cost.kept(3, 100, on) - real) <= 0.02 * real, (on, cost, real)


def test_checkpointing_gives_the_same_gradients():
    model = checkpointable_model()
    layers = checkpointable_layers(model)
    grads = {}
    for on in (False, True):
        model.zero_grad(set_to_none=True)
        with checkpointing(layers, on):
            model(input_ids=ids(2, 12)).logits.logsumexp(-1).sum().backward()
        grads[on] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads[False], grads[True]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert all(m.gradient_checkpointing for m in layers)  # restored after the context: as enabled


class FixedFree(MemoryPlan):
    """A plan whose free memory is a fixed number (the decisions without the machine's memory)."""

    def __init__(self, free, mode="auto", cost=None, layers=2):
        super().__init__(mode, cost, torch.device("cpu"), None, [torch.nn.Linear(1, 1)] * layers, [])
        self.fixed = free

    def free(self):
        return self.fixed


COST = ActivationCost(off=(0.0, 100.0, 0.0), on=(0.0, 10.0, 0.0), layers=2)


def test_auto_checkpoints_exactly_the_passes_that_would_not_fit():
    plan = FixedFree(10_000 / SAFETY, cost=COST)  # 10,000 bytes for activations: 100 tokens without checkpointing
    assert not plan.checkpoints(rows=10, width=10)  # 10,000 bytes: fits
    assert plan.checkpoints(rows=11, width=10)  # 11,000: does not
    assert not plan.checkpoints(rows=0, width=10)  # a pass of nothing
    assert FixedFree(1.0, mode="off", cost=COST).checkpoints(rows=50, width=10) is False
    assert FixedFree(1e12, mode="on", cost=COST).checkpoints(rows=1, width=1) is True


def test_the_token_budget_is_what_fits_with_the_cheapest_mode():
    """Hand-computed: a row of 10 tokens keeps 100 bytes checkpointed plus, while backward recomputes
    one of the 2 layers, (1,000 - 100) / 2 = 450: 550 a row; 8,500 bytes fit 15 rows = 150 tokens.
    Without checkpointing ('off' with max_tokens_per_micro_batch='auto'): 1,000 a row, 8 rows."""
    plan = FixedFree(8_500 / SAFETY, cost=COST)
    assert plan.token_budget(None, 10) == 150
    assert plan.token_budget(64, 10) == 64 and plan.token_budget(1000, 10) == 150
    off = FixedFree(8_500 / SAFETY, mode="off", cost=COST)
    assert off.token_budget(1000, 10) == 1000  # 'off' with a number: the user's budget
    assert off.token_budget(None, 10, by_memory=True) == 80
    assert FixedFree(1.0, cost=COST).token_budget(None, 10) == 10  # never below one row


def test_a_row_that_cannot_fit_is_refused_in_one_line_naming_the_knobs():
    FixedFree(10_000 / SAFETY, cost=COST).check_row(100)  # 100 x 10 + (100 x 100 - 1,000) / 2 = 5,500: fits
    with pytest.raises(ValueError) as err:
        FixedFree(10_000 / SAFETY, cost=COST).check_row(2000, "prompt + completion")
    text = str(err.value)
    assert "\n" not in text and "2000 tokens" in text and "with every layer checkpointed" in text
    for knob in ("LoRA", "max_new_tokens", "memory_budget_gb"):
        assert knob in text
    with pytest.raises(ValueError, match="gradient_checkpointing='auto' or 'on'"):
        FixedFree(10_000 / SAFETY, mode="off", cost=COST).check_row(200)


def test_pending_counts_the_gradients_and_adamw_moments_still_to_come():
    model = torch.nn.Linear(10, 10)  # 110 float32 parameters: 440 bytes
    plan = MemoryPlan("auto", None, torch.device("cpu"), None, [], [model])
    assert plan.pending() == 3 * 440
    model(torch.ones(1, 10)).sum().backward()
    assert plan.pending() == 2 * 440
    plan.optimizer = torch.optim.AdamW(model.parameters())
    plan.optimizer.step()
    assert plan.pending() == 0


def test_free_memory_on_a_cpu_is_bounded_by_the_budget():
    cpu = torch.device("cpu")
    assert free_bytes(cpu) > 0
    rss = resident_bytes()
    assert rss > 0
    assert free_bytes(cpu, budget_gb=(rss + 1e6) / 1e9) <= 1e6 + 1e5  # the resident set already counts
    assert free_bytes(torch.device("meta"), budget_gb=2.0) == 2e9  # a device with nothing to read: the budget
