"""The ``Agent`` the RL loop uses: TRL's tools= and environment_factory=, and one line for every
bad input (a tool without type hints or docstring, an environment without reset, an unknown
environment name, a template that cannot continue an episode)."""

import json

import pytest

from rlhfkit.agents import AgentOptions, parse_tool_calls, tool_suffix
from rlhfkit.agents.agent import Agent, agent_metrics, environment_reward
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.tiny import char_tokenizer

from .conftest import ScriptedEngine, add


class Counter:
    """An environment: a counter the model moves with ``step``; rewarded for reaching the target."""

    def reset(self, target, **row):
        self.value, self.target = 0, target
        return f" Reach {target}."

    def step(self, by: int) -> int:
        """Move the counter.

        Args:
            by: How much to add.
        """
        self.value += by
        return self.value

    def get_reward(self) -> float:
        return float(self.value == self.target)


ROWS = [{"prompt": [{"role": "user", "content": "Count."}], "target": 3}, {"prompt": "Count.", "target": 5}]


def test_each_episode_gets_its_own_environment_and_its_reward(chatml):
    agent = Agent(chatml, environment_factory=Counter)
    episodes = agent.start(ROWS, [0, 1], group_size=2)
    assert len(episodes) == 4 and len({id(e.environment) for e in episodes}) == 4
    assert set(episodes[0].tools) == {"step"}  # public methods, reset and get_reward excepted
    assert "Count. Reach 3." in chatml.decode(episodes[0].prompt_ids)  # reset's string on the last user message
    assert '"name": "step"' in chatml.decode(episodes[0].prompt_ids)  # the schema reached the template
    call = '<tool_call>\n{"name": "step", "arguments": {"by": 3}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine(chatml, [[call, "no<|im_end|>", call, call], ["ok<|im_end|>"] * 3])
    agent.run(engine, episodes, SamplingParams(max_new_tokens=300))
    rewards = environment_reward(None, [e.messages for e in episodes], environments=[e.environment for e in episodes])
    assert rewards == [1.0, 0.0, 0.0, 0.0]  # row 0 reached 3; row 1 wanted 5
    assert agent.has_environment_reward
    metrics = agent_metrics(episodes)
    assert float(metrics["agent/turns_mean"]) == pytest.approx(7 / 4)
    assert float(metrics["agent/tool_calls_mean"]) == pytest.approx(3 / 4)
    assert float(metrics["agent/tool_errors"]) == 0 and float(metrics["agent/truncated_episodes"]) == 0


def test_a_dict_of_factories_chooses_by_the_environment_column(chatml):
    class Other(Counter):
        pass

    agent = Agent(chatml, environment_factory={"a": Counter, "b": Other})
    rows = [dict(ROWS[0], environment="b"), dict(ROWS[0], environment="c")]
    assert type(agent.start(rows, [0], 1)[0].environment) is Other
    with pytest.raises(ValueError, match=r"row index 1 .*environment 'c' is not one of \['a', 'b'\]"):
        agent.start(rows, [1], 1)


def test_bad_inputs_are_one_line(chatml):
    def untyped(a):
        """No hints.

        Args:
            a: A thing.
        """

    def undocumented(a: int) -> int:
        return a

    class NoReset:
        def act(self, x: int) -> int:
            """Act.

            Args:
                x: Anything.
            """
            return x

    for tool in (untyped, undocumented):
        with pytest.raises(ValueError, match=f"tool '{tool.__name__}' needs type hints .* docstring") as err:
            Agent(chatml, tools=[tool])
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="NoReset has no reset"):
        Agent(chatml, environment_factory=NoReset)
    with pytest.raises(ValueError, match="needs tools"):
        Agent(chatml)
    chatml.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # no EOS at the turn's end
    with pytest.raises(ValueError, match="mymodel: the chat template does not end an assistant turn") as err:
        Agent(chatml, tools=[add], options=AgentOptions(model_name="mymodel"))
    assert "'chatml_tools'" in str(err.value)  # its turns end with <|im_end|>, this tokenizer's EOS
    chars = char_tokenizer()  # EOS '<eos>': the shipped ChatML template cannot end its turns, so it is not advised
    chars.chat_template = chatml.chat_template
    with pytest.raises(ValueError, match="does not end an assistant turn") as err:
        Agent(chars, tools=[add])
    assert "chatml_tools" not in str(err.value) and "'<eos>'" in str(err.value)


def test_a_template_that_rewrites_history_is_accepted_and_renders_each_turn(chatml):
    # drops earlier assistant turns' content once a tool message follows (as reasoning templates do)
    chatml.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}<|im_start|>assistant\n<|im_end|>\n"
        "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    agent = Agent(chatml, tools=[add], options=AgentOptions(model_name="mymodel"))
    assert agent.start(ROWS, [0], 1)[0].rewrites
    with pytest.raises(ValueError, match="mymodel: the chat template is not prefix-preserving"):
        tool_suffix(chatml, [{"role": "tool", "content": "1"}], None, "mymodel")  # no suffix to append


def test_prompts_longer_than_the_limit_name_their_row(chatml):
    agent = Agent(chatml, tools=[add], prompt_limit=50)
    with pytest.raises(ValueError, match=r"train_dataset: row index 1 \(0-based\): the prompt with the tools"):
        agent.start(ROWS, [1], 1)


def test_hermes_tool_calls_parse():
    content, calls = parse_tool_calls(
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n'
        '</tool_call>\n<tool_call>{"name": "add", "arguments": {"b": 2}}</tool_call>'
    )
    assert content == "Let me add."
    assert [c["function"] for c in calls] == [
        {"name": "add", "arguments": {"a": 1}},
        {"name": "add", "arguments": {"b": 2}},
    ]
    assert parse_tool_calls("just text") == ("just text", [])
    assert json.dumps(calls[0]["function"]["arguments"]) == '{"a": 1}'


def test_evaluation_runs_agent_episodes_and_scores_their_conversations(chatml):
    """run_evaluation with an agent (RLTrainer.evaluate and `rlhfkit eval --tool`): each sample is
    an episode with a fresh environment, scored on its conversation with environments=."""
    from rlhfkit.rewards import RewardFunctions
    from rlhfkit.rl.evaluate import run_evaluation

    agent = Agent(chatml, environment_factory=Counter)
    call = '<tool_call>\n{"name": "step", "arguments": {"by": 3}}\n</tool_call><|im_end|>'
    engine = ScriptedEngine(chatml, [[call, "five<|im_end|>"], ["done<|im_end|>"]])
    rewards = RewardFunctions([environment_reward])
    result = run_evaluation(
        None,
        None,
        chatml,
        rewards,
        ROWS,
        None,
        1,
        SamplingParams(max_new_tokens=300, greedy=True),
        64,
        engine=engine,
        agent=agent,
    )
    m = result["metrics"]
    assert m["eval/turns_mean"] == 1.5 and m["eval/tool_calls_mean"] == 0.5
    assert m["eval/environment_reward_mean"] == 0.5  # row 0 reached its target 3, row 1 never moved
    first = result["samples"][0]["completion"]
    assert [x["role"] for x in first] == ["assistant", "tool", "assistant"] and first[1]["content"] == "3"
    assert len(engine.contexts[0]) == 2 and len(engine.contexts[1]) == 1  # the finished episode is not continued
