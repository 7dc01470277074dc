"""Exact by construction, proven with the real ``openai`` client against the real server:

(a) over multi-turn episodes of a real (tiny, random) model with tool messages, the trainer's rows
    hold exactly the ids the endpoint returned, and the trainer's log-probs equal the ones the
    endpoint reported;
(b) the same scripted episode (a tool call, its result, an answer) through ``environment_factory=``
    and through an agent program on the endpoint gives identical training rows and conversations.
"""

from types import SimpleNamespace

import pytest
import torch

from rlhfkit.agents.agent import Agent
from rlhfkit.endpoint import ProgramAgent
from rlhfkit.models import forward_response
from rlhfkit.models.lm_head import streamable
from rlhfkit.rollout import HFEngine
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import openai_tool_loop

from ..models.test_lm_head import head_outputs
from .conftest import ScriptedEngine, add, turn_ending_model

pytestmark = pytest.mark.usefixtures("one_thread")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


@pytest.mark.parametrize("lm_head", ["chunked", "full"])
def test_trained_ids_and_logprobs_are_what_the_endpoint_returned(chatml, lm_head):
    chatml.chat_template = TINY_TOOLS_TEMPLATE
    model = turn_ending_model(chatml)
    engine = HFEngine(model, chatml.pad_token_id, chatml.eos_token_id)  # reports no log-probs (a synchronous run)
    assert streamable(model)  # the one-token probe runs before the hook watches
    widths = head_outputs(model)  # sampling reads the whole vocabulary; the log-prob pass as the run's lm_head says
    seen = {}

    def program(client, row):  # an agent loop: each turn answered with a tool message
        messages, turns = [{"role": "user", "content": row["prompt"]}], []
        for _ in range(3):
            r = client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, logprobs=True, max_tokens=30
            )
            choice = r.choices[0]
            turns.append((choice.token_ids, [t.logprob for t in choice.logprobs.content], choice.finish_reason))
            if choice.finish_reason == "length":
                break
            messages += [
                choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": "call_0", "content": str(len(turns))},
            ]
        seen[row["prompt"]] = turns
        return None

    agent = ProgramAgent(program, chatml, SimpleNamespace(policy=model, args=SimpleNamespace(lm_head=lm_head)))
    rows = [{"prompt": f"{i}+1?"} for i in range(4)]
    try:
        episodes = agent.start(rows, range(4), 1)
        sampling = SamplingParams(max_new_tokens=120, temperature=0.8)
        rollout, episodes = agent.run(engine, episodes, sampling, seed=[5, 6, 7, 8])
    finally:
        agent.close()
    assert rollout.logprobs is None  # the HF engine reports none: the trainer computes old log-probs, as for agents
    assert sum(len(t) >= 2 for t in seen.values()) >= 2  # multi-turn episodes happened
    assert all(e.timed_out is False for e in episodes)
    mask = rollout.response_mask.bool()
    assert (3 in widths) == (lm_head == "chunked")  # the endpoint's log-prob pass streamed the head or did not
    n = mask.shape[1]
    trainer = forward_response(model, rollout.input_ids, rollout.attention_mask, n, 0.8, lm_head=lm_head).logprobs
    for i, row in enumerate(rows):
        turns = seen[row["prompt"]]
        sampled = [t for ids, _, _ in turns for t in ids]
        reported = [lp for _, lps, _ in turns for lp in lps]
        assert rollout.response_ids[i][mask[i]].tolist() == sampled  # trained ids == sampled ids, in order
        torch.testing.assert_close(trainer[i][mask[i]], torch.tensor(reported), atol=2e-5, rtol=0)
        assert episodes[i].turns == len(turns)
        # the row is the recorded ids: the prompt rendering, then each turn and the tool suffix after it
        assert rollout.input_ids[i][rollout.attention_mask[i].bool()].tolist()[-len(turns[-1][0]) :] == turns[-1][0]


class AddEnv:
    """The environment the ``environment_factory=`` path gets."""

    def reset(self, **row):
        pass

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b


def openai_agent(client, row):
    """The same episode written against the ``openai`` client only: run the calls, send the results."""
    return openai_tool_loop(client, row, (add,))


# Compact JSON: the template renders the call back with spaces, so re-tokenising the agent's
# messages would give other ids than the sampled ones (the drift this endpoint never has).
CALL = '<tool_call>{"name":"add","arguments":{"a":1,"b":2}}</tool_call><|im_end|>'
SCRIPT = [[CALL, "no tool<|im_end|>", CALL], ["3<|im_end|>", "4<|im_end|>"]]


@pytest.mark.parametrize("template", ["chatml_tools", TINY_TOOLS_TEMPLATE])
def test_the_same_episode_through_environment_factory_and_the_endpoint_gives_identical_rows(chatml, template):
    from rlhfkit.data.chat_templates import use_chat_template

    use_chat_template(chatml, template)
    rows = [{"prompt": "1+2?"}, {"prompt": "what?"}, {"prompt": "2+1?"}]
    sampling = SamplingParams(max_new_tokens=200)
    env_engine, endpoint_engine = ScriptedEngine(chatml, SCRIPT), ScriptedEngine(chatml, SCRIPT)
    agent = Agent(chatml, environment_factory=AddEnv)
    in_process = agent.start(rows, range(3), 1)
    expected, in_process = agent.run(env_engine, in_process, sampling)

    program = ProgramAgent(openai_agent, chatml)
    try:
        program.endpoint = None
        episodes = program.start(rows, range(3), 1)
        program._endpoint(
            endpoint_engine, sampling
        ).window = 5.0  # the batch closes when every running episode has asked
        got, episodes = program.run(endpoint_engine, episodes, sampling)
    finally:
        program.close()
    assert endpoint_engine.contexts == env_engine.contexts  # the engine was given the same ids, batch by batch
    for name in ("input_ids", "attention_mask", "response_mask", "has_eos"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    assert got.prompt_len == expected.prompt_len and got.logprobs is None and expected.logprobs is None
    for a, b in zip(episodes, in_process):
        assert a.messages == b.messages  # what the reward functions read
        assert (a.turns, a.tool_calls, a.tool_errors, a.truncated, a.length) == (
            b.turns,
            b.tool_calls,
            b.tool_errors,
            b.truncated,
            b.length,
        )
    assert episodes[0].tool_calls == 1 and episodes[1].tool_calls == 0


def test_an_edited_history_becomes_a_new_segment_each_sampled_token_trained_once(chatml):
    """The agent rewrites the tool result before its second call: that call is the template's
    rendering of the edited messages (not the recorded ids), a segment of its own; both turns'
    sampled ids are trained, each in the context it was sampled in."""
    chatml.chat_template = TINY_TOOLS_TEMPLATE
    engine = ScriptedEngine(chatml, [[CALL], ["3<|im_end|>"]])

    def editing_agent(client, row):
        messages = [{"role": "user", "content": row["prompt"]}]
        r = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        call = r.choices[0].message.tool_calls[0]
        messages += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
        messages[0] = {"role": "user", "content": "1+2=? (edited)"}
        client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)

    program = ProgramAgent(editing_agent, chatml)
    try:
        episodes = program.start([{"prompt": "1+2?"}], range(1), 1)
        rollout, episodes = program.run(engine, episodes, SamplingParams(max_new_tokens=400))
    finally:
        program.close()
    first, second = engine.contexts[0][0], engine.contexts[1][0]
    assert second[: len(first)] != first  # the second prompt is a re-rendering, not the recorded ids continued
    mask = rollout.response_mask[0].bool()
    encode = lambda text: chatml(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert rollout.response_ids[0][mask].tolist() == encode(CALL) + encode("3<|im_end|>")
    assert rollout.segments is not None and int(rollout.segments[0].max()) == 1
    real = rollout.attention_mask[0].bool()
    second_segment = rollout.input_ids[0][real & (rollout.segments[0] == 1)].tolist()
    assert second_segment == second + encode("3<|im_end|>")  # its context is exactly the prompt it was sampled after
