"""Agent episodes on a scripted engine: the ids the trainer trains on are the ids the engine
sampled, tool output and template glue are masked, tool failures reach the model as errors and
are counted, and the budget and iteration limits hold."""

import asyncio
import json
import time

import pytest
import torch

from rlhfkit.agents import AgentOptions, make_tools, run_episodes, start_episode
from rlhfkit.agents.templates import tool_suffix_ids
from rlhfkit.data.chat_templates import render
from rlhfkit.rollout.base import SamplingParams

from .conftest import ScriptedEngine, add

CALL = '<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call><|im_end|>'
USER = [{"role": "user", "content": "12+7?"}]


def fails(x: int) -> int:
    """Always raises.

    Args:
        x: Anything.
    """
    raise RuntimeError("boom")


def hangs(x: int) -> int:
    """Never returns in time (a minute: an episode that waited for it would show).

    Args:
        x: Anything.
    """
    time.sleep(60)
    return x


async def add_async(a: int, b: int) -> int:
    """Add two integers, asynchronously.

    Args:
        a: The first integer.
        b: The second integer.
    """
    await asyncio.sleep(0)
    return a + b


def call(name, **args):
    return CALL.format(name=name, args=json.dumps(args))


def run(chatml, turns, fns=(add,), n=1, max_new_tokens=400, **options):
    tools = make_tools(list(fns))
    episodes = [start_episode(chatml, USER, tools) for _ in range(n)]
    engine = ScriptedEngine(chatml, turns)
    rollout = run_episodes(
        engine, chatml, episodes, SamplingParams(max_new_tokens=max_new_tokens), AgentOptions(**options)
    )
    return rollout, episodes, engine


def test_trained_ids_are_the_sampled_ids_and_tool_output_is_masked(chatml):
    rollout, (e,), engine = run(chatml, [[call("add", a=12, b=7)], ["19<|im_end|>"]])
    sampled = [t for turn in engine.returned for t in turn[0]]
    row = rollout.response_ids[0]
    assert row[rollout.response_mask[0].bool()].tolist() == sampled  # byte for byte, in order
    # the second turn continued from the exact ids so far: prompt + turn 1 + the tool suffix
    first, suffix = engine.returned[0][0], e.ids[len(engine.returned[0][0]) : -len(engine.returned[1][0])]
    assert engine.contexts[1][0] == e.prompt_ids + first + suffix
    assert (
        chatml.decode(suffix)
        == "\n<|im_start|>tool\n<tool_response>\n19\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    masked = rollout.response_mask[0] == 0
    real = rollout.attention_mask[0, rollout.prompt_len :].bool()
    assert row[masked & real].tolist() == suffix  # every unsampled real token is the tool suffix
    # the whole episode is what the template renders for the conversation (no token lost or added)
    full = render(chatml, USER + e.messages, [t.schema for t in e.tools.values()], False)
    ids = rollout.input_ids[0][rollout.attention_mask[0].bool()].tolist()
    assert chatml.decode(ids) == full.removesuffix("\n")
    assert (e.turns, e.tool_calls, e.tool_errors, e.has_eos, e.truncated) == (2, 1, 0, True, False)
    assert e.messages[1] == {"role": "tool", "name": "add", "content": "19"}


def test_rows_of_different_lengths_keep_their_own_ids(chatml):
    rollout, episodes, engine = run(chatml, [[call("add", a=1, b=2), "no tool<|im_end|>"], ["3<|im_end|>"]], n=2)
    assert len(engine.contexts[1]) == 1  # only the episode that called a tool goes on
    for i, e in enumerate(episodes):
        n = len(e.ids)
        assert rollout.response_ids[i, :n].tolist() == e.ids
        assert rollout.response_mask[i, :n].tolist() == [int(s) for s in e.sampled]
        assert (
            rollout.response_mask[i, n:].sum() == 0 and rollout.attention_mask[i, rollout.prompt_len + n :].sum() == 0
        )
    assert [e.turns for e in episodes] == [2, 1]
    assert rollout.has_eos.tolist() == [True, True]


@pytest.mark.parametrize(
    "tool,turn,expect",
    [
        (fails, call("fails", x=1), "RuntimeError: boom"),
        (add, call("subtract", a=1, b=2), "unknown tool 'subtract'"),
        (add, call("add", a=1), "TypeError"),
    ],
)
def test_a_failing_call_reaches_the_model_as_an_error_and_is_counted(chatml, tool, turn, expect):
    _, (e,), _ = run(chatml, [[turn], ["done<|im_end|>"]], fns=(tool,))
    assert expect in json.loads(e.messages[1]["content"])["error"]
    assert (e.tool_errors, e.turns, e.has_eos) == (1, 2, True)


def test_a_tool_that_never_returns_times_out(chatml):
    start = time.monotonic()
    _, (e,), _ = run(chatml, [[call("hangs", x=1)], ["done<|im_end|>"]], fns=(hangs,), tool_call_timeout=0.3)
    assert time.monotonic() - start < 30  # the episode did not wait for the tool's minute (a no-hang bound)
    assert "timed out" in json.loads(e.messages[1]["content"])["error"] and e.tool_errors == 1


def test_async_tools_run(chatml):
    _, (e,), _ = run(chatml, [[call("add_async", a=2, b=3)], ["5<|im_end|>"]], fns=(add_async,))
    assert e.messages[1]["content"] == "5" and e.tool_errors == 0


@pytest.mark.parametrize(
    "turn",
    [
        '<tool_call>\n{"name": "add", "arguments": {"a": 1,}\n</tool_call><|im_end|>',
        '<tool_call>{"arguments": {}}</tool_call><|im_end|>',
        '<tool_call>{"name": "add", "arguments": {"a": 1}<|im_end|>',
    ],
)
def test_a_malformed_call_ends_the_episode_and_is_counted(chatml, turn):
    _, (e,), engine = run(chatml, [[turn]])
    assert len(engine.contexts) == 1 and e.done and e.tool_errors == 1 and e.tool_calls == 0


def test_the_episode_stays_within_max_new_tokens(chatml):
    turn = call("add", a=12, b=7)
    n = len(chatml(turn, add_special_tokens=False)["input_ids"])
    # room for the first turn but not for the tool suffix and another token: not appended, truncated
    rollout, (e,), engine = run(chatml, [[turn]], max_new_tokens=n + 5)
    assert len(engine.contexts) == 1 and e.truncated and len(e.ids) == n
    # the second turn is cut at the budget: the episode ends without EOS
    suffix = len(tool_suffix_ids(chatml, [{"role": "tool", "name": "add", "content": "19"}], None))
    budget = n + suffix + 5
    rollout, (e,), _ = run(chatml, [[turn], ["1234567890<|im_end|>"]], max_new_tokens=budget)
    assert len(e.ids) == budget and e.truncated and not e.has_eos and not rollout.has_eos[0]
    assert e.messages[-1] == {"role": "assistant", "content": "12345"}
    assert rollout.response_ids.shape[1] == budget


def test_max_tool_calling_iterations_ends_the_episode(chatml):
    turns = [[call("add", a=1, b=1)], [call("add", a=2, b=2)], ["never<|im_end|>"]]
    _, (e,), engine = run(chatml, turns, max_tool_calling_iterations=1)
    assert len(engine.contexts) == 2 and e.tool_calls == 1 and e.turns == 2 and e.done


def test_long_tool_output_is_cut_and_marked(chatml):
    def shout(text: str) -> str:
        """Repeat a text.

        Args:
            text: What to repeat.
        """
        return text * 50

    _, (e,), _ = run(chatml, [[call("shout", text="ab")], ["ok<|im_end|>"]], fns=(shout,), max_tool_response_tokens=10)
    assert e.messages[1]["content"] == "ababababab [truncated]"


def test_engine_logprobs_land_on_the_sampled_positions(chatml):
    class WithLogprobs(ScriptedEngine):
        def generate(self, prompts, n, sampling, seed=None):
            out = super().generate(prompts, n, sampling, seed)
            out.logprobs = -torch.arange(1, out.response_mask.shape[1] + 1).float().expand_as(out.response_mask) / 100
            return out

    tools = make_tools([add])
    episodes = [start_episode(chatml, USER, tools)]
    engine = WithLogprobs(chatml, [[call("add", a=1, b=2)], ["3<|im_end|>"]])
    rollout = run_episodes(engine, chatml, episodes, SamplingParams(max_new_tokens=300), AgentOptions())
    mask = rollout.response_mask[0].bool()
    n1, n2 = len(engine.returned[0][0]), len(engine.returned[1][0])
    expected = torch.cat([-torch.arange(1, n1 + 1) / 100, -torch.arange(1, n2 + 1) / 100])
    assert torch.allclose(rollout.logprobs[0][mask], expected)
    assert rollout.logprobs[0][~mask].abs().sum() == 0
