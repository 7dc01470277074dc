"""What the model saw is what is rewarded and recorded: a budget cut rolls back the tool messages
whose tokens were not added, and the episode counts as truncated for mask_truncated_completions,
the missing-EOS penalty and the overlong penalty (which counts what the budget counts); the
environment column is handled as TRL handles it; concat_rollouts refuses mixed parts."""

import pytest
import torch

from rlhfkit import RLConfig, RLTrainer
from rlhfkit.agents import AgentOptions, make_tools, run_episodes, start_episode
from rlhfkit.agents.agent import Agent
from rlhfkit.agents.templates import tool_suffix_ids
from rlhfkit.algorithms import overlong_penalty
from rlhfkit.rollout import build_rollout, concat_rollouts
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm

from .conftest import ScriptedEngine, add

pytestmark = pytest.mark.usefixtures("one_thread")

CALL = '<tool_call>{"name": "add", "arguments": {"a": 12, "b": 7}}</tool_call><|im_end|>'
ROWS = [{"prompt": [{"role": "user", "content": "12+7?"}]}] * 2
SEEN = {}


def last_message(prompts, completions, **columns):
    """Scores what a `completions[i][-1]["content"]` reward reads: 1 when it is the tool's 19."""
    SEEN["last"] = [c[-1] for c in completions]
    return [float(c[-1]["content"] == "19") for c in completions]


def n_tokens(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def test_a_cut_episode_keeps_only_what_the_model_saw(chatml):
    budget = n_tokens(chatml, CALL) + 5  # the call fits, its tool suffix does not
    episodes = [start_episode(chatml, ROWS[0]["prompt"], make_tools([add]))]
    rollout = run_episodes(
        ScriptedEngine(chatml, [[CALL]]), chatml, episodes, SamplingParams(max_new_tokens=budget), AgentOptions()
    )
    (e,) = episodes
    assert [m["role"] for m in e.messages] == ["assistant"]  # the tool message the model never received is gone
    assert e.truncated and e.has_eos and not rollout.has_eos[0]  # its turn ended, the episode did not
    assert e.length == budget and len(e.ids) < budget  # the overlong penalty sees the whole budget spent


def trainer(**config):
    tok = chatml_tokenizer()
    args = RLConfig(
        **{
            **dict(
                algorithm="grpo",
                prompts_per_step=1,
                group_size=2,
                max_steps=1,
                save_steps=0,
                chat_template=TINY_TOOLS_TEMPLATE,
                kl_coef=0.0,
                log_every=0,
            ),
            **config,
        }
    )
    t = RLTrainer(tiny_causal_lm(tok), [last_message], args, ROWS, processing_class=tok, tools=[add])
    return t, tok


def scored_step(t, turns):
    t.sampler.engine = ScriptedEngine(t.tokenizer, turns)
    rows = t.sampler.sample_prompts()
    rollout, episodes = t.sampler.generate(rows)
    scores, valid, metrics = t.sampler.score(rows, rollout, episodes)
    return rollout, episodes, scores, valid, metrics


def test_a_cut_episode_is_truncated_for_the_reward_the_penalties_and_the_mask():
    """Two episodes call the calculator; the second's longer call leaves no room for the answer.
    The reward reads what each model saw (the first: the tool's 19; the second: its own call), the
    second gets the missing-EOS penalty and the whole overlong penalty, and leaves the loss."""
    tok = chatml_tokenizer()
    tok.chat_template = TINY_TOOLS_TEMPLATE
    suffix = tool_suffix_ids(tok, [{"role": "tool", "name": "add", "content": "19"}], [make_tools([add])["add"].schema])
    first = n_tokens(tok, CALL) + len(suffix) + n_tokens(tok, "19<|im_end|>")
    budget = first + 2  # the first episode ends 2 tokens short of it; the second's suffix overflows
    t, _ = trainer(
        max_new_tokens=budget,
        missing_eos_penalty=-2.0,
        overlong_buffer_len=4,
        overlong_penalty=1.0,
        mask_truncated_completions=True,
        normalize_rewards=False,
    )
    rollout, episodes, scores, valid, metrics = scored_step(t, [[CALL, "I will add. " + CALL], ["19<|im_end|>"]])
    assert rollout.has_eos.tolist() == [True, False] and [e.truncated for e in episodes] == [False, True]
    assert [m["content"] for m in SEEN["last"]] == ["19", "I will add."] and "tool_calls" in SEEN["last"][1]
    lengths = [e.length for e in episodes]
    assert lengths == [budget - 2, budget]  # tool suffixes counted, as the budget counts them
    assert lengths[0] > rollout.response_mask[0].sum()
    penalty = overlong_penalty(torch.tensor(lengths), budget, 4, 1.0)
    assert penalty.tolist() == [-0.5, -1.0]
    assert scores.tolist() == pytest.approx([1.0 - 0.5, 0.0 - 2.0 - 1.0])
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(-0.75)
    exp = t.make_experience(rollout, scores, valid, metrics)
    assert exp.mask[0].any() and not exp.mask[1].any()  # mask_truncated_completions takes it out


class Needs:
    def reset(self, prompt, target):  # takes exactly the columns it uses: no **kwargs
        self.target = target

    def get_reward(self) -> float:
        return 1.0

    def step(self, by: int) -> int:
        """Move.

        Args:
            by: How much.
        """
        return by


def test_the_environment_column_routes_and_is_not_passed_to_reset(chatml):
    rows = [{"prompt": "go", "target": 3, "environment": "needs"}]
    (e,) = Agent(chatml, environment_factory={"needs": Needs}).start(rows, [0], 1)
    assert e.environment.target == 3  # as TRL: the control column is not reset's
    with pytest.raises(ValueError) as err:  # a single factory passes every column, as TRL does
        Agent(chatml, environment_factory=Needs).start(rows, [0], 1)
    message = str(err.value)
    assert "\n" not in message and message.startswith("train_dataset: row index 0 (0-based): Needs.reset(**row)")
    assert "['environment', 'prompt', 'target']" in message and "**kwargs" in message


def test_concat_rollouts_refuses_parts_with_and_without_engine_logprobs():
    a = build_rollout([[1, 2]], [[3, 4]], 1, 0, 4)
    b = build_rollout([[1]], [[5, 4]], 1, 0, 4)
    a.logprobs = torch.zeros(a.response_mask.shape)
    with pytest.raises(ValueError, match=r"^concat_rollouts: parts \[1\] \(0-based\) of 2 have no engine log-probs"):
        concat_rollouts([a, b])
    assert concat_rollouts([a, a]).logprobs.shape == (2, 2) and concat_rollouts([b, b]).logprobs is None
