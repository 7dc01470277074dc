"""TRL's reward-function contract through RLTrainer (docs/guides/rl.md, "Reward functions"): what a
function receives in training and in evaluation — conversational completions as TRL builds them,
``completion_ids``, ``trainer_state``, ``log_metric``, ``log_extra``, ``async def`` — checked against
the rollout and the run's files."""

from __future__ import annotations

import asyncio
import json

import pytest

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CHAT = [{"prompt": [{"role": "user", "content": p["prompt"]}], "answer": p["prompt"][:1]} for p in PROMPTS]


def trainer(reward, data=PROMPTS, **overrides) -> RLTrainer:
    tok, evaluation = char_tokenizer(), overrides.pop("eval", None)
    args = dict(
        algorithm="grpo",
        max_new_tokens=5,
        max_steps=2,
        prompts_per_step=2,
        group_size=2,
        log_every=0,
        seed=0,
        progress_bar=False,
    )
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, seed=0),
        reward if isinstance(reward, list) else [reward],
        RLConfig(**args),
        train_dataset=data,
        processing_class=tok,
        eval_dataset=evaluation,
    )


def test_a_trl_reward_function_reads_completion_0_content_on_conversational_prompts():
    seen = []

    def content_length(completions, **kwargs):  # as TRL's docs write one
        seen.append((kwargs["prompts"], completions, kwargs["answer"]))
        return [float(len(completion[0]["content"])) for completion in completions]

    t = trainer(content_length, CHAT, max_steps=1)
    rows = t.sampler.sample_prompts()
    rollout, _ = t.sampler.generate(rows)
    t.sampler.score(rows, rollout)
    prompts, completions, answer = seen[-1]
    assert prompts == [CHAT[i]["prompt"] for i in rows for _ in range(2)]  # as the dataset gives them
    assert answer == [CHAT[i]["answer"] for i in rows for _ in range(2)]
    texts = t.tokenizer.batch_decode(
        [r[m.bool()] for r, m in zip(rollout.response_ids, rollout.response_mask)], skip_special_tokens=True
    )
    assert completions == [[{"role": "assistant", "content": text}] for text in texts]
    assert t.train()[0]["reward/content_length_mean"] >= 0  # and a whole step runs with it


def test_completion_ids_are_the_sampled_ids_and_text_prompts_get_text():
    seen = {}

    def spy(prompts, completions, completion_ids, **kwargs):
        seen.update(completions=completions, ids=completion_ids)
        return [0.0] * len(completions)

    t = trainer(spy, max_new_tokens=12, group_size=4)  # some rows end early with EOS here, others are cut
    rows = t.sampler.sample_prompts()
    rollout, _ = t.sampler.generate(rows)
    t.sampler.score(rows, rollout)
    sampled = [r[m.bool()].tolist() for r, m in zip(rollout.response_ids, rollout.response_mask)]
    assert rollout.has_eos.any() and not rollout.has_eos.all()  # ids of several lengths: padding would show
    assert seen["ids"] == sampled and all(isinstance(i, int) for ids in sampled for i in ids)
    assert all((ids[-1] == t.tokenizer.eos_token_id) == bool(eos) for ids, eos in zip(sampled, rollout.has_eos))
    assert all(isinstance(c, str) for c in seen["completions"])


def test_log_metric_is_averaged_into_the_step_and_trainer_state_tells_the_step():
    logged, states = {}, []

    def with_metric(prompts, completions, log_metric, trainer_state, **kwargs):
        values = [float(len(c)) for c in completions]
        states.append((trainer_state.global_step, trainer_state.max_steps, trainer_state.epoch))
        log_metric("completion_chars", values[0])
        log_metric("completion_chars", values[-1])
        logged.setdefault(trainer_state.global_step, []).extend([values[0], values[-1]])
        return values

    history = trainer(with_metric, max_steps=3).train()
    assert [row["completion_chars"] for row in history] == pytest.approx([sum(v) / len(v) for v in logged.values()])
    assert states == [(0, 3, 0.0), (1, 3, 0.25), (2, 3, 0.5)]  # 2 of the 8 prompts per step


def test_log_extra_columns_reach_samples_jsonl(tmp_path):
    def with_column(prompts, completions, log_extra, **kwargs):
        log_extra("first_char", [c[:1] for c in completions])
        return [float(len(c)) for c in completions]

    trainer(with_column, max_steps=1, output_dir=str(tmp_path)).train()
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert rows and all(row["first_char"] == row["completion"][:1] for row in rows)


def test_async_reward_functions_train_and_old_signatures_still_work():
    async def slow_length(prompts, completions, **kwargs):
        await asyncio.sleep(0.01)
        return [float(len(c)) for c in completions]

    def old_style(prompts, completions):  # no **kwargs, no dataset columns besides the prompt
        return [1.0] * len(completions)

    row = trainer([slow_length, old_style], max_steps=1).train()[0]
    assert row["reward/old_style_mean"] == 1.0 and row["reward/slow_length_mean"] >= 0


def test_evaluation_gives_reward_functions_the_same_contract():
    calls = []

    def judge(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, answer, **kwargs):
        calls.append((trainer_state.global_step, completions, completion_ids))
        log_metric("judged", 2.0)
        return [1.0] * len(completions)

    history = trainer(judge, CHAT, max_steps=1, eval=CHAT[:2], eval_every=1).train()
    step0, evaluated = calls[0], calls[-1]
    assert evaluated[0] == 1 and step0[0] == 0  # evaluated after the one step
    assert all(c[0]["role"] == "assistant" for c in evaluated[1]) and len(evaluated[2]) == 2
    assert history[-1]["eval/judged"] == 2.0 and history[-1]["judged"] == 2.0
