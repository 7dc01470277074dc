"""The chat template's pieces an agent episode needs, rendered and tokenised once each.

Token-in/token-out: the model's sampled ids are never decoded and re-encoded. A tool result is
appended as the template's *tool-message suffix*: the text the template puts after an assistant
turn's end-of-turn token, through the tool messages, up to the next assistant header. It is
found by rendering a fixed probe conversation with and without the tool messages, so it never
depends on what the model wrote — which needs a *prefix-preserving* template (the longer rendering
starts with the shorter one).

Templates that rewrite history are not: Qwen3's drops the ``<think>`` reasoning of earlier
assistant turns (and renders an empty one for the last). ``rewrites_history`` finds them by
rendering the probe with and without reasoning; an agent then renders each turn's prompt from the
conversation so far (``prompt_ids``), exactly as the model sees it at inference
(``agents.episode``). Either way the template must end an assistant turn with an EOS token — the
tokenizer's, or another id that ends the model's turns (``eos_ids``: ``models.loading.eos_token_ids``,
e.g. Gemma 2's ``<end_of_turn>``) — or a sampled turn could not end where the template ends it
(``check_agent_template``).
"""

from __future__ import annotations

from ..data.chat_templates import render
from ..models.loading import eos_token_ids

_PROBE: list[dict] = [
    {"role": "user", "content": "probe"},
    {
        "role": "assistant",
        "content": "probe",
        "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {}}}],
    },
]
_REASONING = "the probe's reasoning"
_THINKING_PROBE = [_PROBE[0], {**_PROBE[1], "content": f"<think>\n{_REASONING}\n</think>\n\nprobe"}]
_TOOL_ANSWER: list[dict] = [{"role": "tool", "name": "probe", "content": "probe"}]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The episode's prompt: the conversation with the tools' schemas, up to the assistant header."""
    return encode(tokenizer, render(tokenizer, messages, tools, True))


def rewrites_history(tokenizer, tools: list[dict] | None) -> bool:
    """Whether the template rewrites earlier turns: rendering the probe conversation (an assistant
    tool call without, then with, reasoning) plus a tool message does not start with its rendering
    before the tool message, or drops the reasoning the model wrote (DeepSeek-R1's template never
    renders it: prefix-preserving, yet not what the model sampled)."""
    for probe in (_PROBE, _THINKING_PROBE):
        after = render(tokenizer, probe + _TOOL_ANSWER, tools, True)
        if not after.startswith(render(tokenizer, probe, tools, False)):
            return True
    return _REASONING not in after


def tool_suffix(
    tokenizer, tool_messages: list[dict], tools: list[dict] | None, name: str = "model", eos_ids=None
) -> str:
    """The text between an assistant turn's end-of-turn token and the next assistant turn's first
    token, when ``tool_messages`` answer its calls (e.g. ChatML: ``"\\n<|im_start|>tool\\n…
    <|im_end|>\\n<|im_start|>assistant\\n"``); the template must be prefix-preserving. ``eos_ids``:
    the model's end ids besides the tokenizer's EOS (``_end_of_turn``)."""
    base = render(tokenizer, _PROBE, tools, False)
    full = render(tokenizer, _PROBE + list(tool_messages), tools, True)
    if not full.startswith(base):
        raise ValueError(
            f"{name}: the chat template is not prefix-preserving (rendering the conversation plus a tool "
            "message does not start with the rendering before it), so tool results cannot be appended "
            "as a suffix; its episodes render each turn instead (rewrites_history)"
        )
    return full[_end_of_turn(tokenizer, tools, name, eos_ids) :]


def _end_of_turn(tokenizer, tools: list[dict] | None, name: str, eos_ids=None) -> int:
    """Where the probe's assistant turn ends in its rendering: just after the first text of an
    end id (``eos_token_ids(tokenizer, eos_ids)``: the tokenizer's EOS, and ``eos_ids``)."""
    ends = dict.fromkeys(tokenizer.decode([i], skip_special_tokens=False) for i in eos_token_ids(tokenizer, eos_ids))
    base = render(tokenizer, _PROBE, tools, False)
    turn_start = render(tokenizer, _PROBE[:1], tools, True)
    found = [(base.find(e, len(turn_start)), e) for e in ends if e] if base.startswith(turn_start) else []
    found = [(at, e) for at, e in found if at >= 0]
    if not found:
        raise ValueError(
            f"{name}: the chat template does not end an assistant turn with an EOS token "
            f"({', '.join(map(repr, ends))}), so a sampled turn cannot be continued token for token; set "
            f"a chat_template whose assistant turns end with {' or '.join(map(repr, ends))}"
            f"{_chatml_advice(tokenizer, ends)}"
        )
    at, end = min(found)
    return at + len(end)


def _chatml_advice(tokenizer, ends) -> str:
    """ " (e.g. 'chatml_tools')" where the shipped ChatML template would pass: its turns end with
    ``<|im_end|>``, one of this model's end texts; else nothing (the advice could not work)."""
    return " (e.g. 'chatml_tools')" if "<|im_end|>" in ends else ""


def tool_suffix_ids(
    tokenizer, tool_messages: list[dict], tools: list[dict] | None, name: str = "model", eos_ids=None
) -> list[int]:
    return encode(tokenizer, tool_suffix(tokenizer, tool_messages, tools, name, eos_ids))


def check_agent_template(tokenizer, tools: list[dict] | None, name: str = "model", eos_ids=None) -> bool:
    """Refuse, before training, a template an agent cannot use (none; one that does not end an
    assistant turn with an EOS token: the tokenizer's, or one of ``eos_ids``, the model's end ids);
    return whether it rewrites history (``rewrites_history``: its episodes then render every turn's
    prompt)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"{name}: the tokenizer has no chat template; tools need one — set chat_template "
            "(e.g. 'chatml_tools' for ChatML models)"
        )
    _end_of_turn(tokenizer, tools, name, eos_ids)
    return rewrites_history(tokenizer, tools)
