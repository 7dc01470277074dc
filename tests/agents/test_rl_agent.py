"""Agents through RLTrainer's public API (TRL's tools= / environment_factory=): the loop runs
multi-turn episodes, logs agent/* metrics, keeps the conversation in samples.jsonl, passes
environments= and the conversation to reward functions, adds get_reward() as a source, and records
the tools and environment so the run can be rerun from its config.yaml."""

import json

import pytest
import torch
import yaml

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.algorithms import gae
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import ALGORITHMS

from .conftest import ScriptedEngine

pytestmark = pytest.mark.usefixtures("one_thread")

# A compact tool template (the chat_template option, inline): tools listed by name only, so a
# tiny model with 256 positions has room for the episode.
COMPACT = TINY_TOOLS_TEMPLATE

ROWS = [
    {"prompt": [{"role": "user", "content": f"{a}+{b}?"}], "answer": str(a + b)}
    for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]
]
SEEN = {}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


class Calculator:
    """One per episode: remembers what it computed; rewarded when it was used."""

    def reset(self, answer, **row):
        self.answer, self.used = answer, False

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.used = True
        return a + b

    def get_reward(self) -> float:
        return 1.0 if self.used else 0.0


def sees_conversations(prompts, completions, environments=None, **columns):
    SEEN["completions"], SEEN["environments"] = completions, environments
    return [0.0] * len(completions)


def trainer(tmp_path, config=None, **kwargs):
    tok = chatml_tokenizer()
    model = tiny_causal_lm(tok)
    args = RLConfig(
        **{
            **dict(
                algorithm="grpo",
                prompts_per_step=2,
                group_size=2,
                max_new_tokens=40,
                max_steps=2,
                output_dir=str(tmp_path / "run"),
                chat_template=COMPACT,
                kl_coef=0.0,
                save_steps=0,
                num_logged_samples=4,
                max_tool_calling_iterations=2,
            ),
            **(config or {}),
        }
    )
    return RLTrainer(model, [sees_conversations], args, ROWS, processing_class=tok, **kwargs)


def test_tools_run_through_the_loop_and_are_logged_and_recorded(tmp_path):
    t = trainer(tmp_path, tools=[add])
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"agent/turns_mean", "agent/tool_calls_mean", "agent/tool_errors", "agent/truncated_episodes"} <= set(
        rows[-1]
    )
    assert rows[-1]["agent/turns_mean"] >= 1
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert all(isinstance(s["completion"], list) and s["completion"][0]["role"] == "assistant" for s in samples)
    assert isinstance(SEEN["completions"][0], list) and SEEN["environments"] == [None] * 4
    record = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert record["tools"] == ["test_rl_agent:add"] or record["tools"][0].endswith("test_rl_agent:add")
    assert record["chat_template"] == COMPACT


def test_an_environment_factory_gives_each_episode_an_environment_and_a_reward(tmp_path):
    t = trainer(tmp_path, environment_factory=Calculator)
    t.train()
    assert len(SEEN["environments"]) == 4 and all(isinstance(e, Calculator) for e in SEEN["environments"])
    assert len({id(e) for e in SEEN["environments"]}) == 4
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "reward/environment_reward_mean" in row
    record = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert record["environment"].endswith(":Calculator")


def test_scripted_episode_trains_on_exactly_the_sampled_tokens(tmp_path):
    """The experience of an agent step masks the tool suffix: the update's mask equals the
    rollout's sampled-token mask (rows without a score excepted)."""
    t = trainer(tmp_path, tools=[add])
    rows = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(rows)
    scores, valid, metrics = t.sampler.score(rows, rollout, episodes)
    exp = t.make_experience(rollout, scores, valid, metrics)
    assert exp.mask.long().equal(rollout.response_mask.long())
    assert "agent/turns_mean" in metrics


def test_ppo_runs_gae_across_the_tool_suffix_gap(tmp_path):
    """PPO's critic and GAE over an episode: advantages and returns live on the sampled tokens
    only, and GAE over the episode with its tool-suffix gap equals GAE over its sampled tokens
    alone — the gap is skipped, not a step."""
    t = trainer(
        tmp_path,
        {"algorithm": "ppo", "group_size": 1, "prompts_per_step": 4, "whiten_advantages": False, "max_new_tokens": 120},
        tools=[add],
    )
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>'
    t.sampler.engine = ScriptedEngine(
        t.tokenizer, [[call] * 4, ["3<|im_end|>", "x<|im_end|>", "3<|im_end|>", "4<|im_end|>"]]
    )
    rows = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(rows)
    scores, valid, metrics = t.sampler.score(rows, rollout, episodes)
    exp = t.make_experience(rollout, scores, valid, metrics)
    mask = rollout.response_mask.bool()
    for i in range(mask.shape[0]):
        sampled = mask[i].nonzero().flatten()
        assert (sampled.diff() > 1).any()  # the tool suffix sits between the two turns
        rewards = torch.zeros(1, len(sampled))
        rewards[0, -1] = scores[i]  # kl_coef 0: the outcome on the last sampled token
        adv, ret = gae(rewards, exp.old_values[i, sampled][None], torch.ones(1, len(sampled)), t.args.gamma, t.args.lam)
        torch.testing.assert_close(exp.advantages[i, sampled], adv[0])
        torch.testing.assert_close(exp.returns[i, sampled], ret[0])
    assert (exp.advantages[~mask] == 0).all() and (exp.returns[~mask] == 0).all()
    assert t.update(exp)["critic/loss"] >= 0  # the critic trains on the episode


def alternating(prompts, completions, **columns):
    """1 for every other episode: every group has reward variance (DAPO keeps it)."""
    return [float(i % 2) for i in range(len(completions))]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_preset_trains_on_tool_episodes(tmp_path, algorithm):
    """One step of each preset on scripted tool episodes (a call, the tool's turn, an answer): the
    update trains on the sampled tokens only and changes the policy."""
    tok = chatml_tokenizer()
    args = RLConfig(
        algorithm=algorithm,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=120,
        max_steps=1,
        chat_template=COMPACT,
        save_steps=0,
        log_every=0,
        learning_rate=1e-2,
    )
    t = RLTrainer(tiny_causal_lm(tok), [alternating], args, ROWS, processing_class=tok, tools=[add])
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>'
    t.sampler.engine = ScriptedEngine(t.tokenizer, [[call] * 4, ["3<|im_end|>"] * 4])
    before = [p.detach().clone() for p in t.models.policy.parameters()]
    row = t.train()[-1]
    assert row["agent/tool_calls_mean"] == 1.0 and row["agent/turns_mean"] == 2.0
    assert any(not torch.equal(a, b) for a, b in zip(before, t.models.policy.parameters()))


def test_lora_trains_the_adapter_on_tool_episodes(tmp_path):
    from peft import LoraConfig

    tok = chatml_tokenizer()
    args = RLConfig(
        algorithm="grpo",
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=120,
        max_steps=1,
        chat_template=COMPACT,
        save_steps=0,
        log_every=0,
        learning_rate=1e-2,
    )
    t = RLTrainer(
        tiny_causal_lm(tok),
        [alternating],
        args,
        ROWS,
        processing_class=tok,
        tools=[add],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><|im_end|>'
    t.sampler.engine = ScriptedEngine(t.tokenizer, [[call] * 4, ["3<|im_end|>"] * 4])
    named = dict(t.models.policy.named_parameters())
    before = {k: p.detach().clone() for k, p in named.items()}
    assert t.train()[-1]["agent/tool_calls_mean"] == 1.0
    changed = {k for k, p in named.items() if not torch.equal(before[k], p)}
    assert changed and all("lora_" in k for k in changed)  # the adapter learns, the base stays
