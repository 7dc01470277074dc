"""The decode loop's attention on a CPU (``rollout.decode.decode_attention``): for one query per row
in bfloat16 it computes what ``sdpa`` computes (grouped-query heads, padding masks) by matrix
products; elsewhere it is ``sdpa`` itself; the loop binds it to ``sdpa`` only for its own call,
and a bfloat16 model decodes greedily as ``generate`` does."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.rollout import HFEngine, SamplingParams
from rlhfkit.rollout import decode as decode_module
from rlhfkit.rollout.decode import decode_attention, fast_decode_attention
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class _Module(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _qkv(dtype, rows=4, heads=6, kv_heads=2, keys=9, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, 1, dim, generator=g)
    buffer_k = torch.randn(rows, kv_heads, keys + 5, dim, generator=g)
    buffer_v = torch.randn(rows, kv_heads, keys + 5, dim, generator=g)
    # the loop's cache hands over views of the filled columns of larger buffers
    return q.to(dtype), buffer_k[:, :, :keys].to(dtype), buffer_v[:, :, :keys].to(dtype)


def _reference(q, k, v, mask, scaling):
    """float64 attention, each query head over key/value head ``head // groups``."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    scores = q.double() @ k.transpose(-1, -2) * scaling
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)  # (rows, queries, heads, dim)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "left-padding"])
def test_one_bfloat16_query_attends_as_sdpa_by_matmuls(masked):
    q, k, v = _qkv(torch.bfloat16)
    mask = None
    if masked:  # row 1 and 3 left-padded: their first columns are not attended
        mask = torch.ones(4, 1, 1, 9, dtype=torch.bool)
        mask[1, ..., :3] = False
        mask[3, ..., :6] = False
    out, weights = decode_attention(_Module(), q, k, v, mask, scaling=0.3)
    assert weights is None and out.dtype == torch.bfloat16 and out.shape == (4, 1, 6, 8)
    want = _reference(q, k, v, mask, 0.3)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=0)  # bfloat16 output rounding
    # the float32 softmax is as close to the exact value as sdpa's own bfloat16 kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    sdpa, _ = sdpa_attention_forward(_Module(), q, k, v, mask, scaling=0.3)
    assert (out.double() - want).abs().max() <= (sdpa.double() - want).abs().max() + 1e-3


def test_float32_and_several_queries_are_sdpa_itself():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv(torch.float32)
    assert torch.equal(
        decode_attention(_Module(), q, k, v, None)[0], sdpa_attention_forward(_Module(), q, k, v, None)[0]
    )
    q2 = torch.cat([q, q], 2).to(torch.bfloat16)  # a prefill: two queries per row
    k2, v2 = k.to(torch.bfloat16), v.to(torch.bfloat16)
    assert torch.equal(
        decode_attention(_Module(), q2, k2, v2, None)[0], sdpa_attention_forward(_Module(), q2, k2, v2, None)[0]
    )


def _sdpa_function():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS["sdpa"]


def test_the_loop_rebinds_sdpa_for_its_call_only(monkeypatch):
    """Within ``fast_decode_attention`` transformers' ``sdpa`` function is ``decode_attention``;
    the config keeps naming ``sdpa``; after the block, nested blocks and an exception included,
    ``sdpa`` is transformers' own again. The loop holds it for its call, and only then."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    tok = char_tokenizer()
    model = tiny_causal_lm(tok, seed=3).eval()
    with fast_decode_attention(model):
        assert _sdpa_function() is decode_attention and model.config._attn_implementation == "sdpa"
        with fast_decode_attention(model):
            assert _sdpa_function() is decode_attention
        assert _sdpa_function() is decode_attention  # the outer block still holds it
    assert _sdpa_function() is sdpa_attention_forward
    with pytest.raises(RuntimeError, match="inside"), fast_decode_attention(model):
        raise RuntimeError("inside")
    assert _sdpa_function() is sdpa_attention_forward
    seen = []
    original = decode_module.fast_decode_attention

    def spy(m):
        seen.append(m)
        return original(m)

    monkeypatch.setattr(decode_module, "fast_decode_attention", spy)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, decode="loop")
    engine.generate([[5, 6, 7]], 2, SamplingParams(max_new_tokens=3, greedy=True))
    HFEngine(model, tok.pad_token_id, tok.eos_token_id, decode="generate").generate(
        [[5, 6, 7]], 2, SamplingParams(max_new_tokens=3, greedy=True)
    )
    assert seen == [model] and _sdpa_function() is sdpa_attention_forward


def test_another_sdpa_function_is_left_alone(monkeypatch):
    """A function someone bound to ``sdpa`` themselves is neither replaced nor dropped."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def own(*args, **kwargs):
        raise AssertionError("not called here")

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", own)
    model = tiny_causal_lm(char_tokenizer(), seed=3).eval()
    with fast_decode_attention(model):
        assert _sdpa_function() is own
    assert _sdpa_function() is own


def _gqa_bf16_model(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peaked: rounding cannot tie the argmax
    return model.to(torch.bfloat16)


def test_a_bfloat16_grouped_query_model_decodes_greedily_as_generate(monkeypatch):
    tok = char_tokenizer()
    model = _gqa_bf16_model(tok)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[1].shape[2])
        return decode_attention(*args, **kwargs)

    monkeypatch.setattr(decode_module, "decode_attention", counted)  # what the loop binds to sdpa
    prompts = [tok(w, add_special_tokens=False)["input_ids"] for w in ("ab", "cdefg", "hi", "abcabc")]
    sampling = SamplingParams(max_new_tokens=10, greedy=True)
    runs = {
        mode: HFEngine(model, tok.pad_token_id, tok.eos_token_id, logprobs=True, decode=mode).generate(
            prompts, 2, sampling
        )
        for mode in ("generate", "loop")
    }
    assert calls and 1 in calls  # the loop's decode steps went through decode_attention
    assert torch.equal(runs["generate"].input_ids, runs["loop"].input_ids)
    torch.testing.assert_close(runs["loop"].logprobs, runs["generate"].logprobs, atol=5e-2, rtol=0)
