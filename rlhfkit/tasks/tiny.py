"""Tiny models made locally from a config — no download — for tests, demos and the quickstart.

``char_tokenizer`` builds a character-level ``PreTrainedTokenizerFast`` with distinct pad, EOS and
unknown tokens and a minimal chat template; ``chatml_tokenizer`` a ChatML one: ``<|im_start|>``
and ``<|im_end|>`` (the EOS), printable ASCII (enough for JSON tool calls) and the shipped
``chatml_tools`` template. ``tiny_causal_lm`` builds a randomly initialised Llama of a few hundred
thousand parameters around either.
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


def chatml_tokenizer(alphabet: str = CHATML_ALPHABET):
    """A character-level fast tokenizer for ChatML: one id per character of ``alphabet`` (by
    default printable ASCII, enough for JSON tool calls), ``<|im_start|>`` and ``<|im_end|>`` as
    special tokens with ``<|im_end|>`` the EOS (as in Qwen and SmolLM2 instruct models), a distinct
    pad token, and the shipped ``chatml_tools`` chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from ..data.chat_templates import resolve_chat_template

    vocab = {tok: i for i, tok in enumerate(CHATML_SPECIAL_TOKENS)}
    for ch in dict.fromkeys(alphabet):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CHATML_SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>",
                                   unk_token="<unk>", padding_side="left")
    fast.chat_template = resolve_chat_template("chatml_tools")
    return fast


def tiny_causal_lm(tokenizer, hidden_size: int = 64, layers: int = 2, heads: int = 4, seed: int = 0):
    """A randomly initialised ``LlamaForCausalLM`` sized for the tokenizer (≈100k–500k params)."""
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
    return LlamaForCausalLM(config)


def save_tiny_model(path, tokenizer=None, **kwargs) -> str:
    """Build a tiny model and its tokenizer and save both as a local HF directory; returns it."""
    tokenizer = tokenizer or char_tokenizer()
    model = tiny_causal_lm(tokenizer, **kwargs)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
