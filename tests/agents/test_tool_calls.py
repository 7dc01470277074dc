"""How an episode's tool calls run: in the order written (a stateful environment ends in the state
the model asked for), episodes side by side (a slow tool costs one call's latency per round across
the batch), every exception a tool message, and a call that times out never changes what the
reward reads (its episode ends, its environment is never read again, the sample is unscored)."""

import asyncio
import json
import threading
import time

import pytest

from rlhfkit.agents import AgentOptions, run_tool_calls
from rlhfkit.agents.agent import Agent, environment_reward, reward_inputs, scored
from rlhfkit.agents.tools import make_tools
from rlhfkit.rewards import RewardFunctions
from rlhfkit.rl.advantages import ScoreShaping
from rlhfkit.rl.score import score
from rlhfkit.rollout.base import SamplingParams

from .conftest import ScriptedEngine

SLOW = 0.2


def call(name, **args):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


class Stack:
    """A stateful environment: ``push(1)`` is slow, so calls run side by side land out of order."""

    def reset(self, **row):
        self.items, self.late = [], threading.Event()

    def push(self, x: int) -> str:
        """Push a number.

        Args:
            x: The number.
        """
        time.sleep(SLOW if x == 1 else 0)
        self.items.append(x)
        return str(self.items)

    def hang(self, x: int) -> str:
        """Take too long, then change the stack anyway.

        Args:
            x: The number pushed at the end.
        """
        time.sleep(1.0)
        self.items.append(x)
        self.late.set()
        return "late"

    def get_reward(self) -> float:
        return float(self.items == [1, 2])


def episodes_of(turns, n=1, timeout=30.0):
    agent = Agent_(timeout)
    episodes = agent.start([{"prompt": "go"}] * n, list(range(n)), 1)
    engine = ScriptedEngine(agent.tokenizer, turns)
    start = time.monotonic()
    rollout, episodes = agent.run(engine, episodes, SamplingParams(max_new_tokens=400))
    return episodes, rollout, engine, time.monotonic() - start


def Agent_(timeout):
    from rlhfkit.tasks.tiny import chatml_tokenizer

    return Agent(chatml_tokenizer(), environment_factory=Stack, options=AgentOptions(tool_call_timeout=timeout))


def test_calls_of_one_episode_run_in_the_order_written():
    (e,), _, _, elapsed = episodes_of([[call("push", x=1) + call("push", x=2) + "<|im_end|>"], ["done<|im_end|>"]])
    assert e.environment.items == [1, 2]  # concurrently, the slow push(1) landed after push(2): [2, 1]
    assert [m["content"] for m in e.messages[1:3]] == ["[1]", "[1, 2]"]
    assert elapsed >= SLOW and e.environment.get_reward() == 1.0


def test_episodes_run_their_calls_side_by_side():
    """8 episodes x 2 rounds of a 0.2 s call: about 2 x 0.2 s in all, not 8 x 2 x 0.2 s."""
    n, rounds = 8, 2
    turns = [[call("push", x=1) + "<|im_end|>"] * n] * rounds + [["done<|im_end|>"] * n]
    episodes, _, _, elapsed = episodes_of(turns, n)
    assert all(e.environment.items == [1] * rounds for e in episodes)
    print(
        f"\n{n} episodes x {rounds} rounds of one {SLOW} s call: {elapsed:.3f} s "
        f"(one call per round: {rounds * SLOW:.1f} s; one per episode: {n * rounds * SLOW:.1f} s)"
    )
    assert elapsed < rounds * SLOW + 0.5


class Boom(Exception):
    def __str__(self):
        raise RuntimeError("cannot print")


def raising(kind):
    def fail(x: int) -> int:
        """Fail.

        Args:
            x: Anything.
        """
        raise kind

    async def fail_async(x: int) -> int:
        """Fail, asynchronously.

        Args:
            x: Anything.
        """
        await asyncio.sleep(0)
        raise kind

    return fail_async if kind is asyncio.CancelledError else fail


@pytest.mark.parametrize(
    "kind,expect",
    [
        (ValueError("bad"), "ValueError: bad"),
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt, "KeyboardInterrupt"),
        (GeneratorExit, "GeneratorExit"),
        (asyncio.CancelledError, "CancelledError"),
        (Boom(), "Boom: (its message cannot be printed)"),
    ],
)
def test_every_exception_of_a_tool_is_a_tool_message(kind, expect):
    tools = make_tools([raising(kind)])
    (name,) = tools
    [[result, after]] = run_tool_calls([[(tools, name, {"x": 1}), (tools, "nope", {})]], timeout=5)
    assert json.loads(result.text) == {"error": expect} and result.failed and not result.timed_out
    assert "unknown tool 'nope'" in json.loads(after.text)["error"]  # the next call still ran


def test_a_call_that_times_out_never_changes_what_the_reward_reads():
    turn = call("hang", x=9) + call("push", x=2) + "<|im_end|>"
    (e,), rollout, engine, elapsed = episodes_of([[turn], ["never<|im_end|>"]], timeout=0.2)
    assert elapsed < 0.9 and len(engine.contexts) == 1  # the episode ended after that round
    errors = [json.loads(m["content"])["error"] for m in e.messages[1:]]
    assert errors == ["the tool call timed out after 0.2 s", "not run: an earlier call of this turn timed out"]
    assert e.timed_out and e.tool_errors == 2 and e.environment.items == []
    completions, environments = reward_inputs([e])
    assert environments == [None] and environment_reward(None, completions, environments=environments) == [None]
    assert e.environment.late.wait(2) and e.environment.items == [9]  # the call went on: the reward never reads it
    shaping = ScoreShaping(400, None, None, 1.0, None, False, False)
    every = RewardFunctions([lambda prompts, completions, **kw: [1.0] * len(completions)])
    _, valid, *_ = score([{"prompt": "go"}], rollout, every, engine.tokenizer, 1, shaping, [e])
    assert not valid[0] and scored([e]).tolist() == [False]  # unscored: no gradient, outside every statistic
