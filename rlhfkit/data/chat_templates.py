"""Chat templates for multi-turn and tool-use training: choosing one (``resolve_chat_template``,
``use_chat_template``), checking that it can serve multi-turn training (``check_prefix_preserving``)
and finding the text each assistant turn is trained on (``assistant_spans``).

Messages follow TRL and the OpenAI API: ``{"role": "assistant", "content": "", "tool_calls":
[{"type": "function", "function": {"name": ..., "arguments": {...}}}]}`` for a tool call,
``{"role": "tool", "content": ...}`` for its result; ``tools`` is a list of JSON schemas (what
``transformers.utils.get_json_schema`` returns), handed to the template's ``tools=``.

The rule of ``assistant_spans``, for the assistant message at index ``k``:

* start = ``len(render(messages[:k], add_generation_prompt=True))``: the assistant header
  (``<|im_start|>assistant\\n``) is the generation prompt, given at inference, so never trained;
* end = just after the first end text at or after the start in ``render(messages[:k + 1])``, so
  the model learns to stop, while the glue after it (ChatML's ``\\n``) is not trained; when the
  template emits no end text there, the end of that rendering (its whole turn). The end texts
  (``end_texts``) are those of the model's end ids (``models.loading.eos_token_ids``): the
  tokenizer's EOS (``<|im_end|>`` for Qwen) and every id the model's ``generation_config``
  declares (Gemma 2's ``<end_of_turn>`` beside its tokenizer's ``<eos>``); without them, the
  tokenizer's EOS alone.

This needs a *prefix-preserving* template: rendering a conversation and then one more message must
only append text (``chatml_tools``, shipped here, is one). Templates that rewrite earlier turns
(Qwen3's thinking template drops the reasoning of earlier assistant turns) raise
``NotPrefixPreserving`` here; multi-turn SFT then trains each assistant turn after the template's
rendering of the conversation before it (``sft_turns.encode_turn_by_turn``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..models.loading import eos_token_ids

SHIPPED = {"chatml_tools": "chatml_tools.jinja"}  # name -> file in rlhfkit/data/templates/

PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city."}},
                "required": ["city"],
            },
        },
    }
]
PROBE: list[dict] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "name": "get_weather", "content": "22 degrees and sunny"},
    {"role": "assistant", "content": "It is 22 degrees and sunny in Paris."},
]
ADVICE = "multi-turn training needs one — set chat_template (e.g. 'chatml_tools' for ChatML models)"


def resolve_chat_template(value: str | None, field: str = "chat_template") -> str | None:
    """The template text for ``value``: None → None (keep the tokenizer's own); a shipped name
    (``"chatml_tools"``) → that template; a path to an existing file → its text; a string holding
    ``{%`` or ``{{`` → itself (an inline template). Anything else: one-line ``ValueError`` naming
    ``field``."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(
            f"{field}: expected a string (a template name, file path or inline Jinja), got {type(value).__name__}"
        )
    if value in SHIPPED:
        # one part per step: Python 3.10's Traversable.joinpath (a zipped package's) takes one
        return (resources.files("rlhfkit.data") / "templates" / SHIPPED[value]).read_text(encoding="utf-8")
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if value.strip() and path.is_file():
        return path.read_text(encoding="utf-8")
    shown = value if len(value) <= 80 else value[:77] + "..."
    raise ValueError(
        f"{field}: {shown!r} is neither a shipped template ({', '.join(SHIPPED)}), an existing "
        "file, nor an inline Jinja template (text with '{%' or '{{'); None keeps the tokenizer's own"
    )


def use_chat_template(tokenizer, value: str | None):
    """Give ``tokenizer`` the template ``value`` names (``resolve_chat_template``); None leaves the
    tokenizer's own (or its lack of one: rendering chat messages then fails with its own message).
    Returns the tokenizer."""
    template = resolve_chat_template(value)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def tokenizer_name(tokenizer) -> str:
    """How errors name a tokenizer: its model path or Hub id, else its class."""
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def render(tokenizer, messages: list[dict], tools: list | None = None, generation: bool = False) -> str:
    """``apply_chat_template`` as text."""
    return tokenizer.apply_chat_template(
        list(messages), tools=tools or None, add_generation_prompt=generation, tokenize=False
    )


class NotPrefixPreserving(ValueError):
    """The chat template rewrites earlier turns when a message is added (one line naming the model)."""


def _one_line(err: Exception) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def check_prefix_preserving(tokenizer, name: str, tools: list | None = None) -> None:
    """Render the fixed ``PROBE`` conversation (system, user, assistant tool call, tool result,
    assistant answer; with ``tools`` when given) one message at a time and refuse, in one line
    starting with ``name``: a template that raises on the conversation or drops the tool call or
    its result, then (``NotPrefixPreserving``) a rendering that does not start with the one before
    (for an assistant message: with the one before plus the generation prompt)."""
    try:
        texts = [""] + [render(tokenizer, PROBE[:k], tools) for k in range(1, len(PROBE) + 1)]
        prompts = [""] + [render(tokenizer, PROBE[:k], tools, generation=True) for k in range(1, len(PROBE))]
    except Exception as e:  # noqa: BLE001 — jinja and template errors have many types
        raise ValueError(
            f"{name}: the chat template cannot render a tool-call conversation ({_one_line(e)}); {ADVICE}"
        ) from None
    call = texts[3][len(prompts[2]) :] if texts[3].startswith(prompts[2]) else texts[3][len(texts[2]) :]
    if "get_weather" not in call or "Paris" not in call or "22 degrees" not in texts[4]:
        lost = "the tool result" if "Paris" in call and "get_weather" in call else "the tool call"
        raise ValueError(f"{name}: the chat template cannot render tool calls (it drops {lost}); {ADVICE}")
    for k, message in enumerate(PROBE[1:], start=1):
        assistant = message["role"] == "assistant"
        if not texts[k + 1].startswith(prompts[k] if assistant else texts[k]):
            what = "rendering plus the generation prompt" if assistant else "rendering"
            raise NotPrefixPreserving(
                f"{name}: the chat template is not prefix-preserving (adding message {k} "
                f"({message['role']}) changes the {what} of the messages before it); {ADVICE}"
            )


def end_texts(tokenizer, end_ids=None) -> tuple[str, ...]:
    """The texts that end an assistant turn: the tokenizer's EOS text, then the text of each other
    end id (``eos_token_ids(tokenizer, end_ids)``; ``end_ids`` the model's, e.g.
    ``eos_token_ids(tokenizer, model)``), each once, none empty."""
    ids = [i for i in eos_token_ids(tokenizer, end_ids) if i != tokenizer.eos_token_id]
    texts = [tokenizer.eos_token or ""] + [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    return tuple(t for t in dict.fromkeys(texts) if t)


def turn_end(text: str, start: int, ends: tuple[str, ...]) -> int:
    """Just after the first of the end texts ``ends`` found in ``text`` at or after ``start`` (the
    longest where several begin there), or -1 when there is none."""
    found = [(at, -len(e)) for e in ends for at in [text.find(e, start)] if at >= 0]
    return min(found)[0] - min(found)[1] if found else -1


def assistant_spans(
    tokenizer, messages: list[dict], tools: list | None = None, name: str | None = None, end_ids=None
) -> tuple[str, list[tuple[int, int]]]:
    """(the rendering of ``messages``, the character span ``(start, end)`` of every assistant
    turn's trained text): content and tool calls and the end text (the first of ``end_texts(
    tokenizer, end_ids)``), not the header before or the glue after (the rule in the module
    docstring). The first message must not be the assistant's (the template renders no empty
    conversation to take its header from). A rendering that does not extend the one before is
    refused in one line naming the tokenizer (``name``)."""
    name = name or tokenizer_name(tokenizer)
    text = render(tokenizer, messages, tools)
    ends, spans, before = end_texts(tokenizer, end_ids), [], ""
    if messages[0]["role"] == "assistant":
        raise ValueError("the first message is the assistant's; a conversation starts with a system or user message")
    for k, message in enumerate(messages):
        upto = render(tokenizer, messages[: k + 1], tools)
        if message["role"] == "assistant":
            prompt = render(tokenizer, messages[:k], tools, generation=True)
            if not upto.startswith(prompt) or not prompt.startswith(before):
                raise NotPrefixPreserving(
                    f"{name}: the chat template is not prefix-preserving (the rendering of "
                    f"messages 0..{k} does not extend that of 0..{k - 1} plus the generation "
                    f"prompt); {ADVICE}"
                )
            end = turn_end(upto, len(prompt), ends)
            spans.append((len(prompt), end if end >= 0 else len(upto)))
        if not upto.startswith(before) or not text.startswith(upto):
            raise NotPrefixPreserving(
                f"{name}: the chat template is not prefix-preserving (adding message {k} "
                f"({message['role']}) changes the rendering of the messages before it); {ADVICE}"
            )
        before = upto
    return text, spans


__all__ = [
    "ADVICE",
    "NotPrefixPreserving",
    "PROBE",
    "PROBE_TOOLS",
    "SHIPPED",
    "assistant_spans",
    "check_prefix_preserving",
    "end_texts",
    "render",
    "resolve_chat_template",
    "tokenizer_name",
    "turn_end",
    "use_chat_template",
]
