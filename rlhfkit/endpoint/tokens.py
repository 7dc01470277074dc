"""What the endpoint tells of sampled tokens: the text of ``content`` without special tokens
(``visible_text``: vLLM's default ``skip_special_tokens``, the tool-call markers kept for the
parser), and each token's own UTF-8 bytes (``TokenBytes``: the ``bytes`` of OpenAI's log-probs,
which spell the text when joined even where one character spans several tokens).

A token's bytes: for a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen: a ``ByteLevel`` decoder)
its vocabulary string read through GPT-2's byte-to-unicode table; for a SentencePiece
byte-fallback token ``<0xNN>`` (Llama 2, Mistral) the byte ``NN``, and for its other pieces the
piece with ``▁`` as a space; otherwise (special tokens, character or word vocabularies) the
UTF-8 of its decoded text."""

from __future__ import annotations

import json
import re

from ..agents.parsing import OPEN_TAG

TOOL_MARKERS = (OPEN_TAG, "</tool_call>")  # kept in the text the tool-call parser reads, even if special
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: each byte to the printable character byte-level BPE vocabularies spell it with."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


def special_ids(tokenizer) -> set[int]:
    """The ids of the tokenizer's special tokens (its named ones and every added token marked special)."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    for i, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(i))
    return ids


def hidden_ids(tokenizer) -> set[int]:
    """The special ids left out of ``content``: all but the tool-call markers' (the parser reads them)."""
    vocab = tokenizer.get_vocab()
    return special_ids(tokenizer) - {vocab[m] for m in TOOL_MARKERS if m in vocab}


def visible_text(tokenizer, ids: list[int], hidden: set[int]) -> str:
    """The text of ``ids`` without the ``hidden`` ones."""
    return tokenizer.decode([i for i in ids if i not in hidden], skip_special_tokens=False)


def _decoder_kinds(tokenizer) -> set[str]:
    """The decoder types of a fast tokenizer's backend (nested sequences included), and
    ``"Metaspace"`` for a ``Replace`` of ``▁``; empty when it has none to read."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return set()
    try:
        spec = json.loads(decoder.__getstate__())
    except Exception:  # noqa: BLE001 — a decoder we cannot read: decoded text it is
        return set()
    kinds: set[str] = set()
    todo = [spec]
    while todo:
        d = todo.pop()
        if isinstance(d, dict):
            kind = d.get("type")
            if isinstance(kind, str):
                kinds.add(kind)
            if kind == "Replace" and "▁" in json.dumps(d.get("pattern"), ensure_ascii=False):
                kinds.add("Metaspace")
            todo += d.get("decoders") or []
    return kinds


class TokenBytes:
    """``self(ids)``: each id's own bytes (module docstring); built once per tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        kinds = _decoder_kinds(tokenizer)
        self.byte_level = "ByteLevel" in kinds or getattr(tokenizer, "byte_decoder", None) is not None
        self.byte_fallback = "ByteFallback" in kinds
        self.metaspace = "Metaspace" in kinds
        self.special = special_ids(tokenizer)

    def __call__(self, ids: list[int]) -> list[list[int]]:
        pieces = self.tokenizer.convert_ids_to_tokens(list(ids))
        return [self.one(i, p) for i, p in zip(ids, pieces)]

    def one(self, i: int, piece) -> list[int]:
        if i not in self.special and isinstance(piece, str) and piece:
            if self.byte_level and all(c in BYTE_DECODER for c in piece):
                return [BYTE_DECODER[c] for c in piece]
            match = _BYTE_TOKEN.fullmatch(piece) if self.byte_fallback else None
            if match:
                return [int(match.group(1), 16)]
            if self.metaspace:
                return list(piece.replace("▁", " ").encode())
        return list(self.tokenizer.decode([i], skip_special_tokens=False).encode())
