"""The run lifecycle (``rlhfkit/run/lifecycle.py``) holds alike for SFT, reward model, DPO and RL:
each test runs over all four trainers. It owns the skipped-step count (saved in checkpoints and
restored on resume), the refusal of a checkpoint past this run's steps, ``resume_from='latest'``,
the checkpoint cadence and pruning, and the run directory's refusals."""

import json

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a
from rlhfkit.trainers import (
    DPOConfig,
    DPOTrainer,
    RewardModelConfig,
    RewardModelTrainer,
    RLTrainer,
    SFTConfig,
    SFTTrainer,
)

SFT_ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat", "dog", "sun"]]
PAIRS = [{"prompt": w, "chosen": "aaa", "rejected": "bbb"} for w in ["ab", "cd", "ef", "gh"]]
KINDS = ["sft", "rm", "dpo", "rl"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def make(kind: str, out, **overrides):
    """A tiny trainer of ``kind`` writing to ``out`` (the same model and data every time)."""
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    common = dict(learning_rate=1e-3, max_steps=4, log_every=0, output_dir=str(out), seed=0)
    common.update(overrides)
    if kind == "sft":
        return SFTTrainer(model, SFTConfig(batch_size=2, **common), SFT_ROWS, processing_class=tok)
    if kind == "rm":
        from rlhfkit.models import ScalarModel

        return RewardModelTrainer(
            ScalarModel.from_causal_lm(model), RewardModelConfig(batch_size=2, **common), PAIRS, processing_class=tok
        )
    if kind == "dpo":
        return DPOTrainer(model, DPOConfig(batch_size=2, **common), PAIRS, processing_class=tok)
    return RLTrainer(
        model,
        [fraction_of_a],
        RLConfig(algorithm="grpo", prompts_per_step=2, max_new_tokens=4, **common),
        train_dataset=PROMPTS,
        processing_class=tok,
    )


@pytest.mark.parametrize("kind", KINDS)
def test_skipped_steps_are_in_the_checkpoint_and_resume_with_it(kind, tmp_path):
    first = make(kind, tmp_path / "a", save_steps=2)
    first.run.guard.skipped = 3  # as if three updates had been skipped before
    first.train()
    state = json.loads((tmp_path / "a" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["skipped_steps"] == 3 and state["step"] == 2
    resumed = make(kind, tmp_path / "b", resume_from=str(tmp_path / "a" / "checkpoint-2"))
    assert resumed.run.guard.skipped == 3
    history = resumed.train()
    assert [r["step"] for r in history] == [3, 4]
    assert all(r["perf/skipped_steps"] == 3 for r in history)


@pytest.mark.parametrize("kind", KINDS)
def test_a_checkpoint_past_this_runs_steps_is_refused(kind, tmp_path):
    make(kind, tmp_path / "a", save_steps=4).train()
    with pytest.raises(ValueError, match=r"is at step 4, past this run's 2 steps"):
        make(kind, tmp_path / "b", max_steps=2, resume_from=str(tmp_path / "a" / "checkpoint-4"))


@pytest.mark.parametrize("kind", KINDS)
def test_latest_resumes_the_newest_checkpoint_and_pruning_keeps_the_newest(kind, tmp_path):
    make(kind, tmp_path / "a", save_steps=1, save_total_limit=2, max_steps=3).train()
    assert sorted(p.name for p in (tmp_path / "a").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    resumed = make(kind, tmp_path / "a", resume_from="latest", max_steps=4)
    assert resumed.args.resume_from.endswith("checkpoint-3")
    assert [r["step"] for r in resumed.train()] == [4]


@pytest.mark.parametrize("kind", KINDS)
def test_a_directory_with_a_finished_run_is_refused_without_overwrite(kind, tmp_path):
    make(kind, tmp_path / "a", max_steps=1).train()
    with pytest.raises(ValueError, match="already exists and is not empty"):
        make(kind, tmp_path / "a", max_steps=1)
    assert make(kind, tmp_path / "a", max_steps=1, overwrite=True).train()[-1]["step"] == 1
