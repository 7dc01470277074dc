"""A token budget (``max_tokens_per_micro_batch``) under two processes (gloo, torchrun): the
processes split their rows into different numbers of micro-batches, the one with fewer runs
zero-weight fillers, and one update of a fixed batch gives the weights of one process."""

import json

import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.models.micro_batches import row_spans, split_rows

from .test_distributed import COMPARABLE_ADAM_EPS, PARALLELISMS, _experience, run
from .worker import update_one

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIG = dict(algorithm="grpo", prompts_per_step=4, loss_agg="token-mean", kl_coef=0.05)


def micro_batch_counts(experience, budget: int) -> list[int]:
    """Micro-batches of each of two processes' halves of the batch (one minibatch) under ``budget``."""
    data = torch.load(experience, weights_only=True)
    T = data["response_mask"].shape[1]
    lead, tail = row_spans(data["attention_mask"], T)
    B = len(lead)
    return [
        len(
            split_rows(
                torch.arange(r * B // 2, (r + 1) * B // 2), lead, tail, max_tokens=budget, groups=data["prompt_index"]
            )
        )
        for r in range(2)
    ]


@pytest.mark.slow  # ~12 s on the 2-core machine, nearly all of it the 2-process launch
def test_one_update_with_a_token_budget_is_the_same_on_one_and_two_processes(tmp_path):
    experience = tmp_path / "experience.pt"
    untrained = _experience(experience, CONFIG)
    # a budget under which the two processes run different numbers of micro-batches
    budget = next((b for b in range(8, 400, 4) if len(set(micro_batch_counts(experience, b))) == 2), None)
    assert budget is not None
    cases = []
    for parallelism in PARALLELISMS:
        out = tmp_path / parallelism
        out.mkdir()
        config = dict(CONFIG, parallelism=parallelism, max_tokens_per_micro_batch=budget, adam_eps=COMPARABLE_ADAM_EPS)
        (out / "config.json").write_text(json.dumps(config))
        cases.append([str(experience), str(out / "config.json"), str(out / "two.safetensors")])
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run(2, "update", tmp_path / "cases.json")
    update_one(str(experience), cases[0][1], str(tmp_path / "one.safetensors"))  # one process: here, unlaunched
    one = load_file(tmp_path / "one.safetensors")
    assert any(not torch.equal(one[f"policy.{k}"], v) for k, v in untrained.items())
    for parallelism in PARALLELISMS:
        two = load_file(tmp_path / parallelism / "two.safetensors")
        assert set(one) == set(two)
        for name in one:
            assert (two[name] - one[name]).norm() <= 1e-5 * one[name].norm(), (parallelism, name)


@pytest.mark.slow  # a 2-process launch, ~10 s
def test_a_two_process_fsdp_run_with_a_token_budget_runs_the_same_passes_on_every_process(tmp_path):
    """Old and reference log-probs and the update in token micro-batches under FSDP2, where every
    forward pass is a collective: a process with fewer micro-batches runs fillers, so the run ends
    (no process waits on a pass the other never runs)."""
    config = dict(
        CONFIG,
        max_steps=2,
        max_new_tokens=12,
        parallelism="fsdp",
        max_tokens_per_micro_batch=24,
        output_dir=str(tmp_path / "run"),
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    run(2, "train", tmp_path / "config.json", tmp_path, timeout=300)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
