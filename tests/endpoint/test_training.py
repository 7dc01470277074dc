"""RLTrainer(agent_program=fn): the loop runs the user's program against the policy's endpoint,
with the openai client only; the program's reward is a source, None leaves the conversation to the
reward functions; an episode past its time limit is unscored; GRPO over the endpoint learns."""

import json

import pytest
import torch

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.endpoint import AgentProgram
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm

from .conftest import add

pytestmark = pytest.mark.usefixtures("one_thread")
ROWS = [{"prompt": "say a", "target": "a"}, {"prompt": "say b", "target": "b"}]


def share_of_target(client, row):
    """One turn; the reward: the share of the target letter in the reply."""
    r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    text = r.choices[0].message.content or ""
    return text.count(row["target"]) / max(1, len(text))


def trainer(tmp_path, program, reward_funcs=(), **config):
    tok = chatml_tokenizer()
    args = RLConfig(
        **{
            **dict(
                algorithm="grpo",
                prompts_per_step=2,
                group_size=4,
                max_new_tokens=8,
                max_steps=2,
                output_dir=str(tmp_path / "run"),
                chat_template=TINY_TOOLS_TEMPLATE,
                kl_coef=0.0,
                save_steps=0,
                log_every=0,
                learning_rate=3e-3,
                seed=0,
            ),
            **config,
        }
    )
    return RLTrainer(
        tiny_causal_lm(tok, seed=0), list(reward_funcs), args, ROWS, processing_class=tok, agent_program=program
    )


def test_the_loop_trains_on_the_programs_episodes_and_stops_the_endpoint(tmp_path):
    t = trainer(tmp_path, share_of_target)
    history = t.train()
    assert len(history) == 2 and "reward/agent_program_mean" in history[0] and "agent/turns_mean" in history[0]
    assert history[0]["agent/turns_mean"] == 1.0
    assert t.sampler.agent.endpoint is None  # stopped when training ended
    sample = json.loads((tmp_path / "run" / "samples.jsonl").read_text().splitlines()[0])
    assert sample["completion"][-1]["role"] == "assistant"


def test_none_leaves_the_recorded_conversation_to_the_reward_functions(tmp_path):
    seen = {}

    def last_reply_length(prompts, completions, environments=None, **columns):
        seen["completions"] = completions
        return [float(len(c[-1]["content"])) for c in completions]

    t = trainer(tmp_path, lambda client, row: share_of_target(client, row) and None, [last_reply_length], max_steps=1)
    row = t.train()[0]
    assert row["reward/last_reply_length_mean"] > 0 and row["reward/mean"] == row["reward/last_reply_length_mean"]
    assert all(c[-1]["role"] == "assistant" for c in seen["completions"])


def test_an_episode_past_its_time_limit_is_unscored_and_the_step_goes_on(tmp_path):
    """The 'b' programs reply once, then block until the step is over: the step ends at their time
    limit without them (still blocked when ``train`` returns, so nothing waited for them), their 4
    episodes unscored, the 'a' episodes scored. What happened is asserted, not how long it took."""
    import threading

    release, lock, state = threading.Event(), threading.Lock(), {"finished": 0}

    def slow_for_b(client, row):
        reward = share_of_target(client, row)
        if row["target"] == "b":
            release.wait(60)  # past the time limit, until the test lets it go
            with lock:
                state["finished"] += 1
        return reward

    t = trainer(tmp_path, AgentProgram(slow_for_b, timeout=2.0), max_steps=1)
    try:
        history = t.train()
        with lock:
            seen = dict(state)
    finally:
        release.set()
    assert seen["finished"] == 0  # the step went on while the 'b' programs were still running
    row = history[0]
    assert row["agent/timed_out_episodes"] == 4  # the 4 episodes of the 'b' prompt: cut at the limit, unscored
    assert row["reward/valid_frac"] == 0.5 and len(history) == 1  # the 'a' episodes were scored, the step ended


def test_a_program_that_always_raises_is_one_line(tmp_path):
    def broken(client, row):
        raise KeyError("answer")

    with pytest.raises(RuntimeError, match="agent_program raised in every episode; the first: KeyError: 'answer'"):
        trainer(tmp_path, broken, max_steps=1).train()


def test_agent_program_beside_tools_is_refused(tmp_path):
    tok = chatml_tokenizer()
    with pytest.raises(ValueError, match="agent_program runs its own tools"):
        RLTrainer(
            tiny_causal_lm(tok),
            [],
            RLConfig(output_dir=str(tmp_path)),
            ROWS,
            processing_class=tok,
            tools=[add],
            agent_program=share_of_target,
        )


def test_grpo_over_the_endpoint_raises_the_programs_reward(tmp_path):
    history = trainer(tmp_path, share_of_target, max_steps=30, prompts_per_step=4, group_size=8).train()
    start = sum(r["reward/mean"] for r in history[:5]) / 5
    end = sum(r["reward/mean"] for r in history[-5:]) / 5
    assert end - start > 0.2, (start, end)


def skips_the_model_once(target="a"):
    """A program whose first episode of the ``target`` prompt returns a reward (far from the others)
    without calling the model; the others reply once and return their reply's length (which differs
    between the rows of a group)."""
    import threading

    lock, skipped = threading.Lock(), []

    def program(client, row):
        with lock:
            skip = row["target"] == target and not skipped
            skipped.append(skip)
        if skip:
            return 100.0
        r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
        return float(len(r.choices[0].token_ids))

    return program


def one_step_without_a_call(tmp_path, experience=False, **config):
    """Phases 2-3 (and 4-5 with ``experience``) of one step: the rows, rollout, episodes, scores,
    valid, metrics, experience, the row that made no call (``k``) and the warnings of phase 2."""
    import warnings
    from types import SimpleNamespace

    t = trainer(tmp_path, skips_the_model_once(), max_steps=1, **config)
    try:
        rows = t.sampler.sample_prompts()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            rollout, episodes = t.sampler.generate(rows)
        scores, valid, metrics = t.sampler.score(rows, rollout, episodes)
        exp = t.make_experience(rollout, scores, valid, metrics) if experience else None
    finally:
        t.sampler.agent.close()
    empty = (rollout.response_mask.sum(-1) == 0).nonzero().flatten().tolist()
    assert len(empty) == 1 and episodes[empty[0]].row["target"] == "a"
    return SimpleNamespace(
        t=t,
        rows=rows,
        rollout=rollout,
        episodes=episodes,
        scores=scores,
        valid=valid,
        metrics=metrics,
        exp=exp,
        k=empty[0],
        said=[str(w.message) for w in said],
    )


def test_a_reward_returned_without_a_model_call_is_unscored(tmp_path):
    """The episode sampled no token: its reward is ignored (``valid`` False, as an episode whose
    program failed or ran out of time), and the other rows stay scored."""
    s = one_step_without_a_call(tmp_path)
    assert not s.valid[s.k] and int(s.valid.sum()) == 7
    assert s.metrics["reward/valid_frac"] == 7 / 8 and s.metrics["agent/timed_out_episodes"] == 1
    assert any("returned without calling the model in 1 of 8 episodes (left unscored" in w for w in s.said)


def test_the_group_of_an_episode_without_a_model_call_gets_the_advantages_without_it(tmp_path):
    """The other rows of its group get the advantages they get when that episode is unscored (as
    one past its time limit) — its ignored reward does not shift them, through the batch's reward
    normalisation either."""
    s = one_step_without_a_call(tmp_path, experience=True, algorithm="dr_grpo", normalize_rewards=True)
    s.episodes[s.k].timed_out = True  # unscored, as an episode past its time limit
    scores, valid, metrics = s.t.sampler.score(s.rows, s.rollout, s.episodes)
    expected = s.t.make_experience(s.rollout, scores, valid, metrics).advantages
    others = [i for i in range(s.k // 4 * 4, s.k // 4 * 4 + 4) if i != s.k]
    assert any(s.exp.advantages[i].abs().sum() > 0 for i in others)
    for i in others:
        torch.testing.assert_close(s.exp.advantages[i], expected[i])
    assert (s.exp.advantages[s.k] == 0).all()
