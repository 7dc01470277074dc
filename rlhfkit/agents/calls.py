"""Running the tool calls of a batch of episodes: in order within an episode, episodes side by side.

An episode's calls run one after another, in the order the model wrote them — a stateful
environment sees ``push(1)`` before ``push(2)``, and a seeded episode is reproducible — while the
episodes of a batch run theirs at the same time (each call in a daemon thread of its own), so a
slow tool costs about one call's latency per round across the batch, not one per episode.

Each call has ``timeout`` seconds from its start. Every failure becomes the call's tool message
``{"error": "<ExceptionType>: <message>"}`` and counts as a tool error, never stopping the run:
an unknown tool name, arguments the function does not take, any exception the tool raises —
``BaseException`` included (``SystemExit``, ``KeyboardInterrupt`` or ``CancelledError`` raised by a
tool; signals reach the main thread, never these) — and a timeout.

A call that times out is different: Python cannot stop a thread, so the call keeps running and
may still change the episode's environment at any later time. Its episode therefore stops there
(``CallResult.timed_out``): the calls after it in that round are not run (each answered
``{"error": "not run: ..."}``) and the episode ends after this round's tool messages
(``agents.episode``); the episode is marked ``timed_out`` and its environment is never read again
(``agents.agent.reward_inputs``: no ``get_reward()``, reward functions receive None in its
``environments=`` slot; ``scored``: the sample is left unscored). What the reward reads can thus
never be changed by a call the model was told had failed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from .tools import Tool

Call = tuple[dict[str, Tool], str, dict]  # (the episode's tools, the name called, the arguments)


@dataclass(frozen=True)
class CallResult:
    """What one call returns to the model (``text``), whether it failed, and whether it timed out
    (its thread may still be running)."""

    text: str
    failed: bool = False
    timed_out: bool = False


def run_tool_calls(calls: list[list[Call]], timeout: float) -> list[list[CallResult]]:
    """Run each episode's ``calls[i]`` in order, the episodes concurrently; one ``CallResult`` per
    call, in order (see the module docstring for failures and timeouts)."""
    results: list[list[CallResult]] = [[] for _ in calls]
    finished: queue.Queue[tuple[int, int, CallResult]] = queue.Queue()
    cursor, deadline, active = [0] * len(calls), [0.0] * len(calls), set()

    def start_next(e: int) -> None:  # episode e's next call in a thread of its own, or e is done
        while cursor[e] < len(calls[e]):
            tools, name, arguments = calls[e][cursor[e]]
            if name in tools:
                deadline[e] = time.monotonic() + timeout
                threading.Thread(
                    target=_work, args=(finished, e, cursor[e], tools[name], arguments), daemon=True
                ).start()
                active.add(e)
                return
            results[e].append(
                CallResult(json.dumps({"error": f"unknown tool {name!r}; available: {sorted(tools)}"}), True)
            )
            cursor[e] += 1
        active.discard(e)

    for e in range(len(calls)):
        start_next(e)
    while active:
        try:
            item: tuple[int, int, CallResult] | None = finished.get(
                timeout=max(0.0, min(deadline[e] for e in active) - time.monotonic())
            )
        except queue.Empty:
            item = None
        if item is not None:
            e, k, result = item
            if e in active and k == cursor[e]:  # else: a call given up on, finishing late
                results[e].append(result)
                cursor[e] += 1
                start_next(e)
            continue
        now = time.monotonic()
        for e in [e for e in active if deadline[e] <= now]:
            results[e].append(
                CallResult(json.dumps({"error": f"the tool call timed out after {timeout:g} s"}), True, True)
            )
            skipped = len(calls[e]) - cursor[e] - 1
            results[e] += [
                CallResult(json.dumps({"error": "not run: an earlier call of this turn timed out"}), True)
            ] * skipped
            active.discard(e)
    return results


def _work(
    finished: queue.Queue[tuple[int, int, CallResult]], episode: int, index: int, tool: Tool, arguments: dict
) -> None:
    try:
        result = CallResult(tool_result_text(_call(tool, arguments)))
    except BaseException as err:  # noqa: BLE001 — every failure is the model's to read; this thread only
        result = CallResult(json.dumps({"error": _describe(err)}), True)
    finished.put((episode, index, result))


def _call(tool: Tool, arguments: dict) -> Any:
    result = tool.fn(**arguments)
    if inspect.isawaitable(result):

        async def wait():
            return await result

        result = asyncio.run(wait())
    return result


def _describe(err: BaseException) -> str:
    try:
        message = str(err)
    except BaseException:  # noqa: BLE001 — an exception whose __str__ raises
        message = "(its message cannot be printed)"
    return f"{type(err).__name__}: {message}" if message else type(err).__name__


def tool_result_text(result: Any) -> str:
    """What the model reads: a string as is, anything else as JSON (``str`` when not JSON-able)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
