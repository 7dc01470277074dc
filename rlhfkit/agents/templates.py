"""The chat template's pieces an agent episode needs, rendered and tokenised once each.

Token-in/token-out: the model's sampled ids are never decoded and re-encoded. A tool result is
appended as the template's *tool-message suffix*: the text the template puts after an assistant
turn's end-of-turn token, through the tool messages, up to the next assistant header. It is
found by rendering a fixed probe conversation with and without the tool messages, so it never
depends on what the model wrote; a template whose longer rendering does not start with the
shorter one (not prefix-preserving) is refused in one line naming the model.
"""

from __future__ import annotations

from ..data.chat_templates import render

_PROBE = [{"role": "user", "content": "probe"},
          {"role": "assistant", "content": "probe",
           "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {}}}]}]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The episode's prompt: the conversation with the tools' schemas, up to the assistant header."""
    return encode(tokenizer, render(tokenizer, messages, tools, True))


def tool_suffix(tokenizer, tool_messages: list[dict], tools: list[dict] | None, name: str = "model") -> str:
    """The text between an assistant turn's end-of-turn token and the next assistant turn's first
    token, when ``tool_messages`` answer its calls (e.g. ChatML: ``"\\n<|im_start|>tool\\n…
    <|im_end|>\\n<|im_start|>assistant\\n"``)."""
    eos = tokenizer.eos_token
    base = render(tokenizer, _PROBE, tools, False)
    full = render(tokenizer, _PROBE + list(tool_messages), tools, True)
    if not full.startswith(base):
        raise ValueError(f"{name}: the chat template is not prefix-preserving (rendering the conversation plus a tool "
                         "message does not start with the rendering before it); multi-turn training needs one — set "
                         "chat_template (e.g. 'chatml_tools' for ChatML models)")
    turn_start = render(tokenizer, _PROBE[:1], tools, True)
    end = base.find(eos, len(turn_start)) if base.startswith(turn_start) else -1
    if end < 0:
        raise ValueError(f"{name}: the chat template does not end an assistant turn with the EOS token {eos!r}, so a "
                         "sampled turn cannot be continued token for token; set chat_template (e.g. 'chatml_tools')")
    return full[end + len(eos):]


def tool_suffix_ids(tokenizer, tool_messages: list[dict], tools: list[dict] | None, name: str = "model") -> list[int]:
    return encode(tokenizer, tool_suffix(tokenizer, tool_messages, tools, name))


def check_agent_template(tokenizer, tools: list[dict] | None, name: str = "model") -> None:
    """Refuse, before training, a template that cannot continue an episode token for token."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"{name}: the tokenizer has no chat template; tools need one — set chat_template "
                         "(e.g. 'chatml_tools' for ChatML models)")
    tool_suffix(tokenizer, [{"role": "tool", "content": "probe"}], tools, name)
