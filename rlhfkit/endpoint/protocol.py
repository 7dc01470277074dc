"""The OpenAI chat-completions wire format: a request checked field by field (``parse_request``,
a ``BadRequest`` in one line for anything wrong), messages put in the form our chat templates and
the agent path use (``template_messages``), and the response built from what was sampled
(``completion_response``).

Fields taken: ``messages``, ``tools``, ``tool_choice``, ``temperature``, ``top_p``,
``max_tokens`` / ``max_completion_tokens``, ``n``, ``stop``, ``seed``, ``logprobs``,
``top_logprobs`` (0 only), ``model``, ``user``, ``stream`` (false only); every other field is
ignored, as OpenAI-compatible servers do with fields they do not implement. The messages' content
parts and tool-call fields are checked as OpenAI's API has them (``_check_message``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import NoReturn

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 16


class BadRequest(ValueError):
    """A request the endpoint refuses: HTTP 400 with ``{"error": {"message": <one line>, ...}}``."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(" ".join(str(message).split()))
        self.param = param


@dataclass
class ChatRequest:
    """A checked chat-completions request (``messages`` and ``tools`` as the client sent them)."""

    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: object = "auto"
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    model: str | None = None


def number(body: dict, name: str, low: float, high: float, integer: bool = False, low_open: bool = False):
    """``body[name]`` checked: a number (an integer) in [low, high] ((low, high] with ``low_open``); None if absent."""
    value = body.get(name)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise BadRequest(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r:.40}", name)
    if not (low < value <= high if low_open else low <= value <= high):
        raise BadRequest(f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value}", name)
    return value


def _kind(value) -> str:
    """What a JSON value is, for an error message."""
    if value is None:
        return "nothing"
    if value == "":
        return "an empty string"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def _refuse(i: int, where: str, expected: str, value) -> NoReturn:
    """``BadRequest`` naming the field ``where`` of ``messages[i]``, what it must be and what it is."""
    raise BadRequest(f"messages[{i}].{where}: expected {expected}, got {_kind(value)}", "messages")


def _check_message(i: int, m: dict) -> None:
    """The fields of ``messages[i]`` as OpenAI's API has them: content parts objects (a text
    part's ``text`` a string), an assistant's ``tool_calls`` a list of ``{"id", "type":
    "function", "function": {"name", "arguments"}}`` with ``arguments`` a JSON string (an object is
    taken too; absent: no arguments), a tool message's ``tool_call_id`` a string; ``BadRequest``
    naming the message index and the field otherwise."""
    if isinstance(m.get("content"), list):
        for k, part in enumerate(m["content"]):
            if not isinstance(part, dict):
                _refuse(i, f"content[{k}]", "an object (a content part)", part)
            if "text" in part and not isinstance(part["text"], str):
                _refuse(i, f"content[{k}].text", "a string", part["text"])
    if m["role"] == "tool" and m.get("tool_call_id") is not None and not isinstance(m["tool_call_id"], str):
        _refuse(i, "tool_call_id", "a string", m["tool_call_id"])
    calls = m.get("tool_calls") if m["role"] == "assistant" else None
    if calls is None:
        return
    if not isinstance(calls, list):
        _refuse(i, "tool_calls", "a list of tool calls", calls)
    for k, call in enumerate(calls):
        _check_tool_call(i, f"tool_calls[{k}]", call)


def _check_tool_call(i: int, where: str, call) -> None:
    """One of an assistant message's ``tool_calls`` (at ``where`` in ``messages[i]``): ``{"id", "type":
    "function", "function": {"name", "arguments"}}``, the id a string, the name a non-empty string,
    the arguments a JSON string or an object (absent: none)."""
    if not isinstance(call, dict):
        _refuse(i, where, "an object with 'id', 'type' and 'function'", call)
    if call.get("id") is not None and not isinstance(call["id"], str):
        _refuse(i, f"{where}.id", "a string", call["id"])
    fn = call.get("function")
    if not isinstance(fn, dict):
        _refuse(i, f"{where}.function", "an object with 'name' and 'arguments'", fn)
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        _refuse(i, f"{where}.function.name", "a string", fn.get("name"))
    if fn.get("arguments") is not None and not isinstance(fn["arguments"], (str, dict)):
        _refuse(i, f"{where}.function.arguments", "a JSON string (or an object)", fn["arguments"])


def parse_request(body) -> ChatRequest:
    """The request ``body`` (parsed JSON) checked; raises ``BadRequest`` naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("stream=true is not supported: ask without streaming", "stream")
    messages = _messages(body)
    tools = _tools(body)
    choice = body.get("tool_choice", "auto")
    if not (choice in ("auto", "none", "required") or isinstance(choice, dict)):
        raise BadRequest(
            f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r:.40}", "tool_choice"
        )
    stop = _stop(body)
    if body.get("top_logprobs"):
        raise BadRequest("top_logprobs is not supported (logprobs=true reports each sampled token's)", "top_logprobs")
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool) and logprobs is not None:
        raise BadRequest(f"logprobs must be true or false, got {logprobs!r:.40}", "logprobs")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model must be a string (the served model's name), got {_kind(model)}", "model")
    max_tokens = number(body, "max_completion_tokens", 1, 10**7, integer=True)
    max_tokens = number(body, "max_tokens", 1, 10**7, integer=True) if max_tokens is None else max_tokens
    return ChatRequest(
        messages,
        tools or None,
        choice,
        number(body, "temperature", 0, 2),
        number(body, "top_p", 0, 1, low_open=True),
        max_tokens,
        number(body, "n", 1, MAX_N, integer=True) or 1,
        stop,
        number(body, "seed", -(2**63), 2**63 - 1, integer=True),
        bool(logprobs),
        model or None,
    )


def _messages(body: dict) -> list[dict]:
    """``body["messages"]`` checked: a non-empty list of objects, each with a role of ``ROLES`` and a
    content (an assistant's may have none), their fields as ``_check_message`` has them."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of messages", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a role in {', '.join(ROLES)}", "messages")
        if m["role"] != "assistant" and not isinstance(m.get("content"), (str, list)):
            raise BadRequest(f"messages[{i}] ({m['role']}) needs a content", "messages")
        _check_message(i, m)
    return messages


def _tools(body: dict) -> list[dict] | None:
    """``body["tools"]`` checked: a list of functions, each with a name; None if absent."""
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools
        ):
            raise BadRequest('tools must be a list of {"type": "function", "function": {"name": ...}}', "tools")
    return tools


def _stop(body: dict) -> list[str]:
    """``body["stop"]`` as a list: a string, or a list of at most 4 non-empty strings; [] if absent."""
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a string or a list of at most 4 non-empty strings", "stop")
    return stop


def _arguments(value):
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return value
    return value


def _content(value) -> str:
    if isinstance(value, list):  # content parts: their text
        return "".join(p.get("text", "") for p in value if isinstance(p, dict))
    return value or ""


def template_messages(messages: list[dict], call_names: dict[str, str]) -> list[dict]:
    """The client's messages in the form the chat template (and the agent path) renders:
    ``developer`` as ``system``, content parts joined, an assistant's tool calls as ``{"type":
    "function", "function": {"name", "arguments": {...}}}`` (OpenAI sends the arguments as a JSON
    string), a tool message with the ``name`` of the call it answers (``call_names``: call id ->
    function name, the calls this endpoint returned, and those of the assistant messages given)."""
    names: dict[str | None, str] = {k: v for k, v in call_names.items()}  # a call sent without an id: under None
    out = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        if role == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function", {})
                names.setdefault(c.get("id"), fn.get("name"))
                calls.append(
                    {
                        "type": "function",
                        "function": {"name": fn.get("name"), "arguments": _arguments(fn.get("arguments") or {})},
                    }
                )
            out.append(
                {"role": "assistant", "content": _content(m.get("content")), **({"tool_calls": calls} if calls else {})}
            )
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id")) or "tool"
            out.append({"role": "tool", "name": name, "content": _content(m.get("content"))})
        else:
            out.append({"role": role, "content": _content(m.get("content"))})
    return out


def openai_tool_calls(calls: list[dict], ids: list[str]) -> list[dict]:
    """Parsed calls (``agents.parsing`` form) in OpenAI's form: ids, arguments as a JSON string."""
    return [
        {
            "id": i,
            "type": "function",
            "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])},
        }
        for c, i in zip(calls, ids)
    ]


def completion_response(request_id: str, model: str, prompt_len: int, choices: list[dict]) -> dict:
    """The ``chat.completion`` object. Each of ``choices``: ``message`` (the OpenAI message),
    ``finish_reason``, ``token_ids`` (the sampled ids: an extension field, as vLLM's
    ``return_token_ids``), ``tokens`` (their text), ``bytes`` (each token's own UTF-8 bytes:
    ``tokens.TokenBytes``) and ``logprobs`` (a list, or None)."""
    out = []
    for i, c in enumerate(choices):
        logprobs = None
        if c["logprobs"] is not None:
            logprobs = {
                "content": [
                    {"token": t, "logprob": lp, "bytes": b, "top_logprobs": []}
                    for t, lp, b in zip(c["tokens"], c["logprobs"], c["bytes"])
                ],
                "refusal": None,
            }
        out.append(
            {
                "index": i,
                "message": c["message"],
                "finish_reason": c["finish_reason"],
                "logprobs": logprobs,
                "token_ids": c["token_ids"],
            }
        )
    completion = sum(len(c["token_ids"]) for c in choices)
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": out,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": completion,
            "total_tokens": prompt_len + completion,
        },
    }


def error_body(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": " ".join(str(message).split()), "type": kind, "param": param, "code": code}}


def length_answer(model: str, prompt_len: int) -> dict:
    """The answer of a request with no room left to sample: no tokens, ``finish_reason`` 'length'."""
    import uuid

    choice = {"message": {"role": "assistant", "content": ""}, "finish_reason": "length", "token_ids": []}
    return completion_response(
        f"chatcmpl-{uuid.uuid4().hex}", model, prompt_len, [{**choice, "tokens": [], "logprobs": None}]
    )
