"""The benchmarks' offline models: a character-level tokenizer padded to a vocabulary
(``qwen_like_tokenizer``) and a randomly initialised Qwen2 built from a config (``build_model``).
Nothing is downloaded. Used by ``gpu_check.py`` and ``scale.py``."""

from __future__ import annotations

import string

import torch

# Qwen2.5-0.5B's shape (~494M parameters with the tied embedding of 151936 x 896).
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
)
ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"
SPECIALS = ("<pad>", "<|im_end|>", "<unk>", "<|im_start|>")


def qwen_like_tokenizer(vocab_size: int):
    """A character-level fast tokenizer of exactly ``vocab_size`` ids (as ``rlhfkit.tasks.tiny``
    builds its own, no download): Qwen's special tokens (``<|im_end|>`` the EOS, a distinct pad),
    printable ASCII, then filler tokens that text never encodes to but sampled ids decode to."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in ALPHABET:
        vocab.setdefault(ch, len(vocab))
    for i in range(len(vocab), vocab_size):
        vocab[f"<t{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )


def build_model(shape: dict, tokenizer, device: torch.device, dtype: torch.dtype):
    """A randomly initialised Qwen2 of ``shape``, made on ``device`` (no weights fetched)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        **shape,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model.to(dtype)
