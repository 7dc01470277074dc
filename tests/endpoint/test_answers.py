"""What the endpoint answers is what was sampled and what it serves, through the real server and
the openai client: each token's ``bytes`` are its own (a byte-level BPE token, or a byte-fallback
``<0xNN>`` token, that holds part of a UTF-8 character — not U+FFFD's); special tokens (``<pad>``)
are not text of ``content`` (vLLM's ``skip_special_tokens``), the ids keep them; a model name the
endpoint does not serve is HTTP 404 ``model_not_found``, as OpenAI's API answers."""

import httpx
import openai
import pytest

from rlhfkit.endpoint import Endpoint
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.tasks.tiny import chatml_tokenizer

from .conftest import ScriptedEngine, serving

pytestmark = pytest.mark.usefixtures("one_thread")
USER = [{"role": "user", "content": "hi"}]
SPECIALS = ("<pad>", "<|im_end|>", "<unk>", "<|im_start|>")


class LogprobEngine(ScriptedEngine):
    """A scripted engine that reports a log-prob (-1) for each sampled token."""

    def generate(self, prompts, n, sampling, seed=None):
        out = super().generate(prompts, n, sampling, seed)
        out.logprobs = -out.response_mask.float()
        return out


def _fast(model, pre_tokenizer, decoder, vocab_extra=()):
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(model)
    tok.pre_tokenizer, tok.decoder = pre_tokenizer, decoder
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )
    fast.chat_template = chatml_tokenizer().chat_template
    return fast


def byte_level_tokenizer():
    """GPT-2's byte-level BPE without merges: a character of several UTF-8 bytes is several tokens."""
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for ch in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(ch, len(vocab))
    return _fast(
        models.BPE(vocab=vocab, merges=[]), pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    )


def byte_fallback_tokenizer():
    """A SentencePiece-style BPE (``▁`` for spaces) whose characters outside its vocabulary fall
    back to ``<0xNN>`` byte tokens, as Llama 2's and Mistral's do."""
    import string

    from tokenizers import decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for t in [f"<0x{b:02X}>" for b in range(256)] + ["▁"] + list(string.ascii_letters + string.digits + "<>|_"):
        vocab.setdefault(t, len(vocab))
    decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return _fast(
        models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
        decoder,
    )


def client(endpoint):
    return openai.OpenAI(base_url=endpoint.url, api_key="none", max_retries=0, timeout=30)


@pytest.mark.parametrize("make", [byte_level_tokenizer, byte_fallback_tokenizer])
def test_each_tokens_bytes_are_its_own(make):
    tok = make()
    text = "é€ a😀"
    ids = tok(text + "<|im_end|>", add_special_tokens=False)["input_ids"]
    assert len(ids) > len(text) + 1  # the characters really are split into byte tokens
    with serving(
        Endpoint(
            LogprobEngine(tok, [[text + "<|im_end|>"]]), tok, SamplingParams(max_new_tokens=40), "m", training=False
        )
    ) as endpoint:
        r = client(endpoint).chat.completions.create(model="m", messages=USER, logprobs=True)
    choice = r.choices[0]
    assert choice.message.content == text and choice.token_ids == ids
    pieces = [t.bytes for t in choice.logprobs.content]
    assert all(t.logprob == -1 for t in choice.logprobs.content)
    assert [0xEF, 0xBF, 0xBD] not in pieces  # no token reports U+FFFD's bytes
    assert bytes(b for p in pieces[:-1] for b in p).decode() == text  # the tokens' bytes spell the text
    assert pieces[-1] == list(b"<|im_end|>")


def test_special_tokens_are_not_text_of_content(chatml):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    turns = [
        ["hi<pad> <|im_start|>there<|im_end|>"],
        ["<tool_call><pad>"],
        ["x<pad>"],
        ['ok<pad><tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call><|im_end|>'],
    ]
    with serving(
        Endpoint(ScriptedEngine(chatml, turns), chatml, SamplingParams(max_new_tokens=120), "m", training=False)
    ) as endpoint:
        c = client(endpoint)
        plain = c.chat.completions.create(model="m", messages=USER)
        cut = c.chat.completions.create(model="m", messages=USER, max_tokens=12)
        stopped = c.chat.completions.create(model="m", messages=USER, stop=["x"])
        call = c.chat.completions.create(model="m", messages=USER, tools=tools)
    assert plain.choices[0].message.content == "hi there" and chatml.pad_token_id in plain.choices[0].token_ids
    assert cut.choices[0].message.content == "<tool_call>" and cut.choices[0].finish_reason == "length"
    assert stopped.choices[0].message.content == "" and stopped.choices[0].finish_reason == "stop"
    assert call.choices[0].message.content == "ok" and call.choices[0].message.tool_calls[0].function.name == "add"


def test_a_model_it_does_not_serve_is_404_model_not_found(chatml):
    with serving(
        Endpoint(
            ScriptedEngine(chatml, [["a<|im_end|>"]] * 3),
            chatml,
            SamplingParams(max_new_tokens=4),
            "tiny",
            training=False,
        )
    ) as endpoint:
        c = client(endpoint)
        with pytest.raises(openai.NotFoundError) as err:
            c.chat.completions.create(model="gpt-4o", messages=USER)
        assert err.value.status_code == 404 and err.value.code == "model_not_found"
        assert err.value.body["message"].startswith("The model `gpt-4o` does not exist")
        assert "tiny" in err.value.body["message"] and err.value.body["param"] == "model"
        assert c.chat.completions.create(model="tiny", messages=USER).model == "tiny"  # its own name is served
        raw = httpx.post(f"{endpoint.url}/chat/completions", json={"messages": USER}, timeout=30)
        assert raw.status_code == 200 and raw.json()["model"] == "tiny"  # no model given: the one it serves
        assert [m.id for m in c.models.list().data] == ["tiny"]


def test_a_training_endpoint_serves_policy_and_its_models_name(chatml):
    """Agent programs send ``policy`` (the documented name) or the name ``/v1/models`` lists."""
    endpoint = Endpoint(
        ScriptedEngine(chatml, [["a<|im_end|>"]] * 3),
        chatml,
        SamplingParams(max_new_tokens=4),
        "org/model",
        training=True,
    )
    with serving(endpoint):
        c = client(endpoint)
        names = [m.id for m in c.models.list().data]
        assert names == ["org/model", "policy"]
        assert [c.chat.completions.create(model=n, messages=USER).model for n in names] == ["org/model", "policy"]
        with pytest.raises(openai.NotFoundError, match="The model `gpt-4o` does not exist"):
            c.chat.completions.create(model="gpt-4o", messages=USER)


def test_a_stop_string_split_across_byte_tokens_stops(chatml):
    """``stop`` is found in the text, not token by token: ``€`` is three byte-level tokens; a
    special token's name is not text (``stop=["<pad>"]`` does not stop at a sampled ``<pad>``)."""
    tok = byte_level_tokenizer()
    turns = [["ab€cd<|im_end|>"], ["a<pad>b<|im_end|>"]]
    with serving(
        Endpoint(ScriptedEngine(tok, turns), tok, SamplingParams(max_new_tokens=40), "m", training=False)
    ) as endpoint:
        c = client(endpoint)
        euro = c.chat.completions.create(model="m", messages=USER, stop=["€"])
        pad = c.chat.completions.create(model="m", messages=USER, stop=["<pad>"])
    assert euro.choices[0].message.content == "ab" and euro.choices[0].finish_reason == "stop"
    assert euro.choices[0].token_ids == tok("ab€", add_special_tokens=False)["input_ids"]  # cut after the stop
    assert pad.choices[0].message.content == "ab" and pad.choices[0].token_ids[-1] == tok.eos_token_id
