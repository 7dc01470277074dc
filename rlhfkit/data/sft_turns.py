"""Multi-turn and tool-use SFT rows: checking their messages and tools, and encoding a
conversation so that *every* assistant turn is trained.

A ``messages`` row goes this way (``is_multi_turn``) when it has more than one assistant message,
a tool call or tool message, or a ``tools`` column; a conversation with a single, final
assistant message and no tools keeps the prompt/completion path of ``encode_pair`` unchanged.

``encode_conversation``: the whole conversation rendered once with the chat template
(``tools=`` from the row), tokenised once with the fast tokenizer's character offsets, and a token
trained (``mask`` 1) when any of its characters lies in an assistant span
(``chat_templates.assistant_spans``: content, tool calls and the end text of each assistant turn;
never system, user or tool turns, assistant headers or the glue after an end text). Tokens after
the last trained one are dropped (nothing learns from them); when the template emits no end text
at the end of the last turn, the EOS id is appended and trained, as ``encode_pair`` does.
Truncation as ``encode_pair``: the text before the first assistant turn loses its start first
(down to one token), then the conversation loses its end (``truncated``).

A turn ends at the first text of the model's end ids (``end_ids``, ``models.loading.eos_token_ids(
tokenizer, model)``: the tokenizer's EOS and the model's ``generation_config.eos_token_id``; the SFT
trainer passes them): a Gemma-2-like model's turn is trained up to its ``<end_of_turn>``, with no
``<eos>`` after it. Without ``end_ids``, the tokenizer's EOS alone.

A chat template that rewrites history (Qwen3's drops the ``<think>`` of earlier assistant turns)
renders a conversation otherwise than the model saw it while writing each turn: rendered whole,
an earlier turn would be trained without its reasoning, after a history that did not exist yet.
``encode_conversation_rows`` then trains every assistant turn as the model would see it
(``encode_turn_by_turn``): after the template's rendering of the conversation before it (with
the generation prompt), the turn as the template renders it last (its reasoning kept). A turn
whose context extends the example so far continues that example; otherwise a new example starts —
one conversation, several examples, each assistant turn trained exactly once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from .chat_templates import (
    NotPrefixPreserving,
    assistant_spans,
    check_prefix_preserving,
    end_texts,
    render,
    tokenizer_name,
    turn_end,
)
from .encode import Encoded
from .prompts import message_problem, short_repr, type_name

CALL_FORM = '[{"type": "function", "function": {"name": ..., "arguments": {...}}}]'


@dataclass(frozen=True)
class TurnsEncoded(Encoded):
    """An example trained on several stretches: ``mask[j]`` is 1 where token ``j`` is trained
    (``prompt_len`` is the first such token)."""

    mask: tuple[int, ...] = ()


# ---------------------------------------------------------------- checking


def is_multi_turn(row: dict) -> bool:
    """Whether a ``messages`` row takes the multi-turn path (see the module docstring)."""
    messages = row["messages"]
    return (
        bool(row.get("tools"))
        or sum(m.get("role") == "assistant" for m in messages) > 1
        or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    )


def tools_problem(tools: Any) -> str | None:
    """What is wrong with a ``tools`` column (None and absent are fine), or None."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
        return (
            f"expected a list of tool JSON schemas (dicts, as transformers.utils.get_json_schema returns), "
            f"got {type_name(tools)} {short_repr(tools)}"
        )
    return None


def turn_problem(msg: Any) -> str | None:
    """What is wrong with one message of a conversation (tool calls and tool results included)."""
    if not isinstance(msg, dict) or msg.get("role") not in ("assistant", "tool"):
        return message_problem(msg)
    content = msg.get("content")
    if msg["role"] == "tool":
        return (
            None
            if isinstance(content, str)
            else (f"a tool message needs 'content', the tool's result as a string, got {type_name(content)}")
        )
    calls = msg.get("tool_calls")
    if calls is None:
        return message_problem(msg)
    if not isinstance(calls, (list, tuple)) or not calls:
        return f"'tool_calls' must be a non-empty list {CALL_FORM}, got {type_name(calls)} {short_repr(calls)}"
    for j, call in enumerate(calls):
        problem = _call_problem(call)
        if problem:
            return f"tool call {j} (0-based): {problem}"
    if content is not None and not isinstance(content, str):
        return f"'content' must be a string (or empty with tool_calls), got {type_name(content)} {short_repr(content)}"
    return None


def _call_problem(call: Any) -> str | None:
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return f"expected {CALL_FORM[1:-1]}, got {type_name(call)} {short_repr(call)}"
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        return f"the function needs a 'name' (a non-empty string), got {short_repr(fn.get('name'))}"
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"'arguments' is a string but not JSON: {short_repr(fn['arguments'])}"
    return None if isinstance(args, dict) else f"'arguments' must be an object (dict), got {type_name(args)}"


def messages_problem(messages: Any) -> str | None:
    """What is wrong with a ``messages`` column, or None: a list of well-formed messages, the
    first not the assistant's, the last the assistant's (with content or tool calls)."""
    if not isinstance(messages, (list, tuple)):
        return f"expected a list of chat messages, got {type_name(messages)}"
    if not messages:
        return "'messages' is an empty list of chat messages"
    for i, msg in enumerate(messages):
        problem = turn_problem(msg)
        if problem:
            return f"message {i} (0-based): {problem}"
    last = messages[-1]
    if last["role"] != "assistant":
        return f"the last message must be the assistant's (the completion to learn), got role {last['role']!r}"
    if len(messages) < 2:
        return "needs at least one message (the prompt) before the final assistant message"
    if messages[0]["role"] == "assistant":
        return "message 0 (0-based) is the assistant's; a conversation starts with a system or user message"
    if not (last.get("content") or "").strip() and not last.get("tool_calls"):
        return "the final assistant message's content is empty"
    return None


# ---------------------------------------------------------------- encoding


def check_template(rows: list[dict], tokenizer) -> None:
    """Before encoding multi-turn rows: the tokenizer has a chat template, and — when a row has
    tool calls or tools — the template renders them (``PROBE``; a template that rewrites history
    is fine: its conversations are encoded turn by turn)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"{tokenizer_name(tokenizer)}: multi-turn 'messages' rows need a chat template and the "
            "tokenizer has none; set chat_template (e.g. 'chatml_tools' for ChatML models)"
        )
    with_tools = [r for r in rows if r.get("tools") or any(m.get("tool_calls") for m in r["messages"])]
    if with_tools:
        tools = next((r["tools"] for r in with_tools if r.get("tools")), None)
        try:
            check_prefix_preserving(tokenizer, tokenizer_name(tokenizer), tools)
        except NotPrefixPreserving:
            pass


def encode_conversation(
    messages: list[dict],
    tokenizer,
    max_length: int | None = None,
    tools: list | None = None,
    end_ids=None,
    first_trained: int = 0,
) -> TurnsEncoded:
    """One conversation, every assistant turn trained (the module docstring has the rules;
    ``end_ids``: the model's end ids); ``first_trained``: only the assistant turns from this message
    index on (a prompt-completion row's completion)."""
    text, spans = assistant_spans(tokenizer, messages, tools, end_ids=end_ids)
    turns = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
    spans = [span for k, span in zip(turns, spans) if k >= first_trained]
    try:
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except NotImplementedError:
        raise ValueError(
            f"{tokenizer_name(tokenizer)}: multi-turn SFT needs a fast tokenizer (character offsets "
            "map the assistant turns to tokens)"
        ) from None
    ids = list(encoding["input_ids"])
    mask = [int(any(a < end and b > start for start, end in spans)) for a, b in encoding["offset_mapping"]]
    if not any(mask):
        raise ValueError("the chat template renders no assistant text to train on")
    last = len(mask) - mask[::-1].index(1)
    ids, mask = ids[:last], mask[:last]
    if not text[spans[-1][0] : spans[-1][1]].endswith(end_texts(tokenizer, end_ids)):
        ids, mask = ids + [tokenizer.eos_token_id], mask + [1]
    return _truncate(ids, mask, max_length)


def encode_conversation_rows(
    messages: list[dict],
    tokenizer,
    max_length: int | None = None,
    tools: list | None = None,
    assistant_only: bool = True,
    end_ids=None,
    first_trained: int = 0,
) -> list[TurnsEncoded]:
    """The examples of one conversation: ``encode_conversation`` (one example) when the template
    renders it prefix-preservingly, else ``encode_turn_by_turn`` (see the module docstring).
    ``assistant_only=False``: every token trained — of the one example, or, for a template that
    rewrites history, of the conversation's final rendering (one example). ``end_ids``: the
    model's end ids (see the module docstring); ``first_trained``: with ``assistant_only``, only the
    assistant turns from this message index on."""
    try:
        enc = encode_conversation(messages, tokenizer, max_length, tools, end_ids, first_trained)
        return [enc if assistant_only else replace(enc, prompt_len=0, mask=(1,) * len(enc.input_ids))]
    except NotPrefixPreserving:
        if assistant_only:
            return encode_turn_by_turn(messages, tokenizer, max_length, tools, end_ids, first_trained)
    ids = tokenizer(render(tokenizer, messages, tools), add_special_tokens=False)["input_ids"]
    return [_truncate(ids, [1] * len(ids), max_length)]


def encode_turn_by_turn(
    messages: list[dict],
    tokenizer,
    max_length: int | None = None,
    tools: list | None = None,
    end_ids=None,
    first_trained: int = 0,
) -> list[TurnsEncoded]:
    """Every assistant turn trained after the template's rendering of the conversation before it
    plus the generation prompt (untrained), as the template renders the turn last (trained, to
    its first end text (``end_ids``: the model's end ids), or its end with the EOS id added for the
    last turn); consecutive turns share an example while each turn's context extends it (see the
    module docstring; ``first_trained``: only the assistant turns from this message index on)."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ends, examples = end_texts(tokenizer, end_ids), []
    ids: list[int] = []
    mask: list[int] = []
    turns = [k for k, m in enumerate(messages) if m.get("role") == "assistant" and k >= first_trained]
    for k in turns:
        prompt = render(tokenizer, messages[:k], tools, generation=True)
        upto = render(tokenizer, messages[: k + 1], tools)
        if not upto.startswith(prompt):
            raise ValueError(
                f"{tokenizer_name(tokenizer)}: the chat template does not render assistant message {k} "
                "(0-based) after the conversation before it and the generation prompt, so the turn "
                "cannot be told apart from its context; set chat_template (e.g. 'chatml_tools')"
            )
        found = turn_end(upto, len(prompt), ends)
        turn = encode(upto[len(prompt) : found if found >= 0 else len(upto)])
        if found < 0 and k == turns[-1]:
            turn.append(tokenizer.eos_token_id)
        context = encode(prompt)
        if ids and context[: len(ids)] != ids:  # the history was rewritten: a new example
            examples.append(_truncate(ids, mask, max_length))
            ids, mask = [], []
        mask += [0] * (len(context) - len(ids)) + [1] * len(turn)
        ids = context + turn
    return examples + [_truncate(ids, mask, max_length)]


def encode_completion_turns(
    prompt: list[dict],
    completion: list[dict],
    tokenizer,
    max_length: int | None = None,
    tools: list | None = None,
    completion_only: bool = True,
    assistant_only: bool = True,
    end_ids=None,
) -> list[TurnsEncoded]:
    """A prompt-completion row whose completion holds several messages (an assistant turn, a user
    or tool message, another assistant turn, ...), rendered as one conversation. Trained: with
    ``assistant_only``, its assistant turns (``encode_conversation_rows``), those of the completion
    only with ``completion_only``; without, every token of the conversation, or with
    ``completion_only`` every token after the prompt's rendering with the generation prompt (where
    the two renderings' tokens part, as TRL finds the completion)."""
    messages = list(prompt) + list(completion)
    if assistant_only:
        first = len(prompt) if completion_only else 0
        return encode_conversation_rows(messages, tokenizer, max_length, tools, True, end_ids, first)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids, start = encode(render(tokenizer, messages, tools)), 0
    if completion_only:
        before = encode(render(tokenizer, prompt, tools, generation=True))
        start = next((j for j, (a, b) in enumerate(zip(before, ids)) if a != b), min(len(before), len(ids)))
    return [_truncate(ids, [0] * start + [1] * (len(ids) - start), max_length)]


def _truncate(ids: list[int], mask: list[int], max_length: int | None) -> TurnsEncoded:
    """``encode_pair``'s policy: the untrained start loses tokens first (down to one), then the end."""
    over, truncated = False, False
    if max_length is not None and len(ids) > max_length:
        over = True
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        excess = len(ids) - max_length
        cut = max(0, min(excess, mask.index(1) - 1))
        ids, mask = ids[cut:], mask[cut:]
        if excess > cut:
            ids, mask, truncated = ids[:max_length], mask[:max_length], True
    return TurnsEncoded(ids, mask.index(1), truncated, over, tuple(mask))


__all__ = [
    "TurnsEncoded",
    "check_template",
    "encode_completion_turns",
    "encode_conversation",
    "encode_conversation_rows",
    "encode_turn_by_turn",
    "is_multi_turn",
    "messages_problem",
    "tools_problem",
    "turn_problem",
]
