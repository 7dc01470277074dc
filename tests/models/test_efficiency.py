"""The efficiency counters (``rlhfkit/models/efficiency.py``): token positions computed against
needed, checked against counts worked out by hand on a handmade batch, and in a one-step run
against the same counts recomputed with plain loops from that step's own rollout."""

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.models import efficiency, forward_response
from rlhfkit.rl import experience
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# 2 prompts x 2 rows; P = 4 prompt columns, T = 4 response columns. Prompt A: 3 real tokens, B: 2
# (column 0 is padding in every row); completions of 3, 1, 2, 1 tokens (the last column is unused).
MASK = torch.tensor(
    [[0, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0]]
)


def handmade(prompt_index=True) -> Rollout:
    ids = torch.randint(3, 20, MASK.shape) * MASK
    ids[1, :4], ids[3, :4] = ids[0, :4], ids[2, :4]  # the rows of a prompt hold the same prompt tokens
    response = MASK[:, 4:]
    return Rollout(
        ids, MASK, response, torch.ones(4, dtype=torch.bool), 4, torch.tensor([0, 0, 1, 1]) if prompt_index else None
    )


def test_needed_by_hand():
    # Each prompt once, each completion's tokens but its last: 3 + 2 + (2 + 0 + 1 + 0) = 8.
    assert efficiency.needed_tokens(handmade()) == 3 + 2 + (2 + 0 + 1 + 0)
    assert efficiency.needed_tokens(handmade(prompt_index=False)) == 3 + 3 + 2 + 2 + 3  # 13
    assert efficiency.needed_tokens(handmade(), torch.tensor([1, 3])) == 3 + 2 + 0 + 0


@pytest.mark.parametrize("shared, computed", [(False, 4 * (3 + 3)), (True, 2 * (3 + 2))])
def test_forward_computes_by_hand(shared, computed):
    """Column 0 and the last response column are trimmed: 3 prompt + 3 response columns; shared, the
    groups are packed (``models.packing``): 2 rows of the 3 prompt columns, then A's completions'
    tokens but their last (2 + 0), B's (1 + 0) and one padding column."""
    model = tiny_causal_lm(char_tokenizer(), hidden_size=32, seed=0).eval()
    r = handmade()
    efficiency.reset()
    with efficiency.counting("logprob"):
        forward_response(model, r.input_ids, r.attention_mask, 4, prompt_index=r.prompt_index if shared else None)
    efficiency.add_needed("logprob", efficiency.needed_tokens(r))
    forward_response(model, r.input_ids, r.attention_mask, 4)  # outside a counting block: not counted
    m = efficiency.step_metrics()
    assert (m["perf/tokens_computed_logprob"], m["perf/tokens_needed_logprob"]) == (computed, 8)
    assert m["perf/logprob_efficiency"] == pytest.approx(8 / computed)
    assert "perf/update_efficiency" not in m and m["perf/tokens_computed_update"] == 0
    assert efficiency.step_metrics()["perf/tokens_computed_logprob"] == 0  # zeroed


def test_checkpointing_counts_the_recomputation():
    """Under activation checkpointing the layers run again in the backward: twice the positions
    of the packed groups, 2 x 2 x 5."""
    model = tiny_causal_lm(char_tokenizer(), hidden_size=32, seed=0)
    model.gradient_checkpointing_enable()
    model.train()
    r = handmade()
    efficiency.reset()
    with efficiency.counting("update"):
        forward_response(model, r.input_ids, r.attention_mask, 4, prompt_index=r.prompt_index).logprobs.sum().backward()
    assert efficiency.step_metrics()["perf/tokens_computed_update"] == 2 * 2 * 5


def test_generate_count_by_hand():
    prompt_mask, response = MASK[::2, :4], MASK[:, 4:]  # 2 prompts; 4 rows, W = 4 decode steps
    efficiency.reset()
    with efficiency.counting("generate"):
        HFEngine._count(prompt_mask, True, response)  # prefill 2 x 3 + 4 last columns, then 4 x 3
        HFEngine._count(prompt_mask, False, response)  # 4 x 4 prompt columns, then 4 x 3
    m = efficiency.step_metrics()
    assert m["perf/tokens_computed_generate"] == (6 + 4 + 12) + (16 + 12)
    assert m["perf/tokens_needed_generate"] == 2 * (5 + (2 + 0 + 1 + 0))


def by_loops(rollout, shared: bool) -> tuple[int, int]:
    """(computed by one forward_response of the whole batch, needed), counted column by column."""
    mask, index = rollout.attention_mask.tolist(), rollout.prompt_index.tolist()
    B, T = len(mask), rollout.response_mask.shape[1]
    P = len(mask[0]) - T
    attended = [any(row[c] for row in mask) for c in range(len(mask[0]))]
    start = min(attended.index(True), P - 1)
    used = max([c - P + 1 for c in range(P, P + T) if attended[c]] or [1])
    prompts = {}
    for row, g in zip(mask, index):
        prompts[g] = sum(row[:P])
    needed = sum(prompts.values()) + sum(max(sum(row[P:]) - 1, 0) for row in mask)
    # Packed (shared): a row per prompt of its prompt columns, then its completions' tokens but their last.
    kept = {}
    for row, g in zip(mask, index):
        kept[g] = kept.get(g, 0) + max(sum(row[P:]) - 1, 0)
    computed = len(prompts) * (P - start + max(kept.values())) if shared else B * (P - start + used)
    return computed, needed


def test_one_step_run(monkeypatch):
    """GRPO, 2 passes (an old-log-prob pass) and a reference: every counter of the step equals the
    loops' count on the step's own rollout."""
    seen = []
    make = experience.make_experience
    monkeypatch.setattr(experience, "make_experience", lambda m, a, r, *x: seen.append(r) or make(m, a, r, *x))
    tok = char_tokenizer()
    args = RLConfig(
        algorithm="grpo",
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        max_steps=1,
        log_every=0,
        seed=0,
        kl_coef=0.1,
        num_iterations=2,
        mini_batch_size=4,
    )
    row = RLTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0), [fraction_of_a], args, train_dataset=PROMPTS, processing_class=tok
    ).train()[0]
    r = seen[0]
    computed, needed = by_loops(r, shared=True)
    assert row["perf/tokens_needed_logprob"] == 2 * needed  # old + reference
    assert row["perf/tokens_computed_logprob"] == 2 * computed
    assert row["perf/tokens_needed_update"] == 2 * needed  # num_iterations, one minibatch each
    assert row["perf/tokens_computed_update"] == 2 * computed
    prompt_cols, W = r.prompt_len, r.response_mask.shape[1]
    assert row["perf/tokens_computed_generate"] == 2 * (prompt_cols - 1) + 4 + 4 * (W - 1)
    assert row["perf/tokens_needed_generate"] == needed  # each completion's tokens but its last
    assert 0 < row["perf/update_efficiency"] <= 1 and 0 < row["perf/generate_efficiency"] <= 1


def test_needed_tokens_of_a_slice_whose_prompt_indices_exceed_its_rows():
    """A process's rows of a larger batch keep their global prompt indices (here 4 and 5, in a rollout
    of 4 rows and a minibatch of 2 of them): each distinct prompt still counts once."""
    from rlhfkit.models.efficiency import needed_tokens
    from rlhfkit.rollout import Rollout

    attention = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    response = attention[:, 3:]
    rollout = Rollout(
        torch.zeros_like(attention), attention, response, torch.ones(4, dtype=torch.bool), 3, torch.tensor([4, 4, 5, 5])
    )
    # prompts: 2 tokens (index 4) + 3 tokens (index 5); responses of 2 + 1 + 2 + 1, each but its last
    assert int(needed_tokens(rollout)) == 2 + 3 + 2
    assert int(needed_tokens(rollout, torch.tensor([1, 2]))) == 2 + 3 + 0 + 1


def test_a_steps_counters_hold_its_counts_and_nothing_else_does():
    """Counts made inside a step's ``Counters.counted()`` go to that object alone; outside it the
    default counters get them."""
    efficiency.reset()
    step = efficiency.Counters()
    with step.counted(), efficiency.counting("logprob"):
        efficiency.add_computed(7)
        efficiency.add_needed("logprob", 5)
    with efficiency.counting("update"):
        efficiency.add_computed(3)
    assert step.computed == {"generate": 0, "logprob": 7, "update": 0} and step.needed["logprob"] == 5
    m = step.metrics()
    assert m["perf/logprob_efficiency"] == 5 / 7 and "perf/update_efficiency" not in m
    assert efficiency.step_metrics()["perf/tokens_computed_update"] == 3  # the default counters' (outside the step)
