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
(``agents.episode``). Either way the template must end an assistant turn with the EOS token, or
a sampled turn could not end where the template ends it (``check_agent_template``).
"""

from __future__ import annotations

from ..data.chat_templates import render

_PROBE = [{"role": "user", "content": "probe"},
          {"role": "assistant", "content": "probe",
           "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {}}}]}]
_REASONING = "the probe's reasoning"
_THINKING_PROBE = [_PROBE[0], {**_PROBE[1], "content": f"<think>\n{_REASONING}\n</think>\n\nprobe"}]
_TOOL_ANSWER = [{"role": "tool", "name": "probe", "content": "probe"}]


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


def tool_suffix(tokenizer, tool_messages: list[dict], tools: list[dict] | None, name: str = "model") -> str:
    """The text between an assistant turn's end-of-turn token and the next assistant turn's first
    token, when ``tool_messages`` answer its calls (e.g. ChatML: ``"\\n<|im_start|>tool\\n…
    <|im_end|>\\n<|im_start|>assistant\\n"``); the template must be prefix-preserving."""
    base = render(tokenizer, _PROBE, tools, False)
    full = render(tokenizer, _PROBE + list(tool_messages), tools, True)
    if not full.startswith(base):
        raise ValueError(f"{name}: the chat template is not prefix-preserving (rendering the conversation plus a tool "
                         "message does not start with the rendering before it), so tool results cannot be appended "
                         "as a suffix; its episodes render each turn instead (rewrites_history)")
    return full[_end_of_turn(tokenizer, tools, name):]


def _end_of_turn(tokenizer, tools: list[dict] | None, name: str) -> int:
    """Where the probe's assistant turn ends in its rendering: just after the EOS text."""
    eos = tokenizer.eos_token
    base = render(tokenizer, _PROBE, tools, False)
    turn_start = render(tokenizer, _PROBE[:1], tools, True)
    end = base.find(eos, len(turn_start)) if eos and base.startswith(turn_start) else -1
    if end < 0:
        raise ValueError(f"{name}: the chat template does not end an assistant turn with the EOS token {eos!r}, so a "
                         "sampled turn cannot be continued token for token; set chat_template (e.g. 'chatml_tools')")
    return end + len(eos)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], tools: list[dict] | None, name: str = "model") -> list[int]:
    return encode(tokenizer, tool_suffix(tokenizer, tool_messages, tools, name))


def check_agent_template(tokenizer, tools: list[dict] | None, name: str = "model") -> bool:
    """Refuse, before training, a template an agent cannot use (none; one that does not end an
    assistant turn with the EOS token); return whether it rewrites history (``rewrites_history``:
    its episodes then render every turn's prompt)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"{name}: the tokenizer has no chat template; tools need one — set chat_template "
                         "(e.g. 'chatml_tools' for ChatML models)")
    _end_of_turn(tokenizer, tools, name)
    return rewrites_history(tokenizer, tools)
