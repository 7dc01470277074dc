"""Tiny models made locally from a config — no download — for tests, demos and the quickstart.

``char_tokenizer`` builds a character-level ``PreTrainedTokenizerFast`` with distinct pad, EOS and
unknown tokens and a minimal chat template; ``chatml_tokenizer`` a ChatML one: ``<|im_start|>``
and ``<|im_end|>`` (the EOS), printable ASCII (enough for JSON tool calls) and the shipped
``chatml_tools`` template. ``tiny_causal_lm`` builds a randomly initialised Llama of a few hundred
thousand parameters around either; ``tiny_turn_end_lm`` one whose turns end with a token other
than its tokenizer's EOS (Gemma 2's ``<end_of_turn>``, Llama 3 Instruct's ``<|eot_id|>``).
"""

from __future__ import annotations

import string

import torch

DEFAULT_ALPHABET = string.ascii_lowercase + string.digits + " +=?:.,!\n"
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET, pad_is_eos: bool = False):
    """A character-level fast tokenizer: one id per character of ``alphabet``.

    ``pad_is_eos=True`` makes the pad token the EOS token, as many real tokenizers do (tests use
    it to prove masks are built from positions, not token values).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in dict.fromkeys(alphabet):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # "." misses "\n"
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<eos>",
        pad_token="<eos>" if pad_is_eos else "<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


CHATML_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"
CHATML_SPECIAL_TOKENS = ("<pad>", "<|im_end|>", "<unk>", "<|im_start|>")


def chatml_tokenizer(alphabet: str = CHATML_ALPHABET, eos_token: str = "<|im_end|>"):
    """A character-level fast tokenizer for ChatML: one id per character of ``alphabet`` (by
    default printable ASCII, enough for JSON tool calls), ``<|im_start|>`` and ``<|im_end|>`` as
    special tokens with ``<|im_end|>`` the EOS (as in Qwen and SmolLM2 instruct models), a distinct
    pad token, and the shipped ``chatml_tools`` chat template.

    ``eos_token`` another name (e.g. ``"<eos>"``): a special token of its own, after the alphabet,
    is the tokenizer's EOS while the template still ends turns with ``<|im_end|>`` — as Gemma 2's
    ``<eos>`` and ``<end_of_turn>``; its model ends a turn only with ``tiny_causal_lm(end_of_turn=
    "<|im_end|>")``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ..data.chat_templates import resolve_chat_template

    specials = tuple(dict.fromkeys(CHATML_SPECIAL_TOKENS + (eos_token,)))
    vocab = {tok: i for i, tok in enumerate(CHATML_SPECIAL_TOKENS)}
    for ch in dict.fromkeys(alphabet):
        vocab.setdefault(ch, len(vocab))
    vocab.setdefault(eos_token, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos_token, pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )
    fast.chat_template = resolve_chat_template("chatml_tools")
    return fast


def tiny_causal_lm(
    tokenizer, hidden_size: int = 64, layers: int = 2, heads: int = 4, seed: int = 0, end_of_turn: str | None = None
):
    """A randomly initialised ``LlamaForCausalLM`` sized for the tokenizer (≈100k–500k params).

    ``end_of_turn``: a token other than the tokenizer's EOS that also ends a turn — the model's
    ``generation_config.eos_token_id`` is then ``[EOS, that token's id]``, as Gemma 2's ``[<eos>,
    <end_of_turn>]`` (and ``save_pretrained`` writes it to ``generation_config.json``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    if end_of_turn is not None:
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(end_of_turn)]
    return model


def tiny_turn_end_lm(tokenizer, end_of_turn: str = "<|im_end|>", end_bias: float = 3.0, **kwargs):
    """``tiny_causal_lm(tokenizer, end_of_turn=end_of_turn)`` whose head favours ``end_of_turn``
    (an untied head with a bias of ``end_bias`` on it), so its sampled turns end after a few tokens,
    with a token that is not its tokenizer's EOS when ``tokenizer`` is ``chatml_tokenizer(eos_token=
    "<eos>")``: a Gemma-2-like model for the tests of where a turn ends."""
    model = tiny_causal_lm(tokenizer, end_of_turn=end_of_turn, **kwargs)
    return with_biased_head(model, tokenizer.convert_tokens_to_ids(end_of_turn), end_bias)


def with_biased_head(model, token_id: int, bias: float):
    """``model`` with an untied output layer (its weights copied) whose bias is ``bias`` on ``token_id`` and 0
    elsewhere: a tiny model that favours one token."""
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight)
        head.bias.zero_()
        head.bias[token_id] = bias
    model.lm_head = head
    model.config.tie_word_embeddings = False
    return model


def save_tiny_model(path, tokenizer=None, **kwargs) -> str:
    """Build a tiny model and its tokenizer and save both as a local HF directory; returns it."""
    tokenizer = tokenizer or char_tokenizer()
    model = tiny_causal_lm(tokenizer, **kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def thinking_template(keep_current_reasoning: bool = True) -> str:
    """A compact ChatML template with tools that rewrites history the way Qwen3's does: an
    assistant message's ``<think>…</think>`` is split off its content (``content.split('</think>')``)
    and rendered — normalised to ``<think>\\n…\\n</think>\\n\\n`` — only for assistant turns after
    the last user message that have reasoning, or for the last message (an empty block then); the
    reasoning of every other turn is dropped. Tool results are user turns wrapped in
    ``<tool_response>``, as Qwen3 renders them. ``keep_current_reasoning=False`` drops the
    reasoning of every assistant turn but the last, after the last user message too (DeepSeek-R1's
    template; Qwen3's across user turns). Tools are listed by name only, so tiny models have room.
    (No whitespace control: every newline in it is rendered.)"""
    keep = "loop.index0 > ns.last_query and (loop.last or reasoning)" if keep_current_reasoning else "loop.last"
    return (
        "{% set ns = namespace(last_query=-1) %}"
        "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}"
        "{% endfor %}"
        "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
        "<|im_end|>\n{% endif %}"
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' %}"
        "{% set content = m['content'] or '' %}{% set reasoning = '' %}"
        "{% if '</think>' in content %}"
        "{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
        "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
        "<|im_start|>assistant\n"
        "{% if " + keep + " %}<think>\n{{ reasoning }}\n</think>\n\n{% endif %}"
        "{{ content }}{% for c in (m['tool_calls'] or []) %}<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
        "\"arguments\": {{ c['function']['arguments'] | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
        "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response>"
        "<|im_end|>\n"
        "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def openai_tool_loop(client, row, tools=(add,), max_turns: int | None = None) -> None:
    """An agent program written against the ``openai`` client only (``RLTrainer(agent_program=)``):
    send the conversation with the ``tools``' schemas (``transformers.utils.get_json_schema``), run
    every tool call the reply makes, send the results back; until a reply makes no call, or after
    ``max_turns`` replies (None: no limit). ``row["prompt"]``: the user's message. Returns None (the
    episode's reward comes from the trainer's reward functions)."""
    import json

    from transformers.utils import get_json_schema

    by_name = {fn.__name__: fn for fn in tools}
    schemas = [get_json_schema(fn) for fn in tools]
    messages = [{"role": "user", "content": row["prompt"]}]
    turn = 0
    while max_turns is None or turn < max_turns:
        turn += 1
        message = client.chat.completions.create(model="policy", messages=messages, tools=schemas).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None
        for call in message.tool_calls:
            result = by_name[call.function.name](**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    return None
