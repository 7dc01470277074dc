"""Tool calls in an assistant turn: the tokenizer's own response parser where the model ships one
(``tokenizer.parse_response`` with its ``response_template``), else the Hermes / Qwen form
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the form of the shipped
``chatml_tools`` template)."""

from __future__ import annotations

import json
import re

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"


class MalformedToolCall(ValueError):
    """A tool call the model wrote that cannot be read: the turn ends and it is counted."""


def parse_tool_calls(text: str, tokenizer=None, tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    """``(content, tool_calls)`` of an assistant turn's text (without its end-of-turn token).

    ``tool_calls`` are in the OpenAI / TRL message form ``{"type": "function", "function":
    {"name": ..., "arguments": {...}}}``; ``content`` is the text outside the calls, stripped.
    Raises ``MalformedToolCall`` for a block that is not a JSON object with a string ``name`` and
    an object ``arguments`` (or an open tag without its closing one)."""
    if tokenizer is not None and getattr(tokenizer, "response_template", None) is not None:
        return _parse_with_tokenizer(text, tokenizer, tools)
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            call = json.loads(block.strip())
        except json.JSONDecodeError as err:
            raise MalformedToolCall(f"tool call is not JSON ({err.msg}): {block.strip()[:80]!r}") from None
        calls.append(_checked(call))
    rest = TOOL_CALL.sub("", text)
    if OPEN_TAG in rest:
        raise MalformedToolCall("a <tool_call> without its closing </tool_call>")
    return rest.strip(), calls


def _checked(call) -> dict:
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise MalformedToolCall(f"a tool call needs a string 'name': {str(call)[:80]!r}")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise MalformedToolCall(f"tool call {call['name']!r}: arguments are not JSON") from None
    if not isinstance(arguments, dict):
        raise MalformedToolCall(f"tool call {call['name']!r}: arguments must be an object, got {arguments!r:.60}")
    return {"type": "function", "function": {"name": call["name"], "arguments": arguments}}


def _parse_with_tokenizer(text: str, tokenizer, tools) -> tuple[str, list[dict]]:
    try:
        message = tokenizer.parse_response(text, prefix="", tools=tools)
    except Exception as err:
        raise MalformedToolCall(f"the tokenizer's response parser failed: {err}") from None
    calls = []
    for call in message.get("tool_calls") or []:
        calls.append(_checked(call.get("function", call) if isinstance(call, dict) else call))
    return (message.get("content") or "").strip(), calls
