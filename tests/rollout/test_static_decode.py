"""``HFEngine(decode="static")`` (transformers' ``StaticCache``) under autocast, as the RL trainer
runs it (``autocast: bfloat16``, TRL's ``bf16=True``): float32 weights under bfloat16 or float16
autocast, with and without a LoRA adapter, and bfloat16 weights.

Under autocast over float32 weights a layer writes its keys in float32 (RoPE's float32 cos / sin
promote the projection's bfloat16) and its values in bfloat16. transformers >= 5.24 allocates a
static layer's two buffers each in its own dtype; earlier releases (5.17, 5.21 and 5.23 read; the
GPU machine has 5.17) allocate the values in the keys' dtype, and the first bfloat16 value
written failed (``index_copy_(): self and source expected to have the same dtype, but got (self)
Float and (source) BFloat16``). The engine then allocates the layers itself
(``HFEngine._static_cache``). ``older_cache_allocation`` gives the installed transformers those
releases' allocation (a static layer's values in its keys' dtype, a dynamic layer's values
promoted to it), so these tests fail on the installed transformers too when the engine leaves
the allocation to transformers. (The bfloat16-weight cases never failed: keys and values are
both bfloat16 there.)"""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import pytest
import torch

from rlhfkit.rollout import HFEngine, SamplingParams
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# (weights, autocast dtype or None, LoRA adapter)
PRECISIONS = [
    ("float32", "bfloat16", False),
    ("float32", "float16", False),
    ("float32", "bfloat16", True),
    ("bfloat16", None, False),
    ("bfloat16", None, True),
]
IDS = ["fp32-autocast-bf16", "fp32-autocast-fp16", "fp32-lora-autocast-bf16", "bf16", "bf16-lora"]
SAMPLING = SamplingParams(max_new_tokens=10, temperature=0.8, top_k=8)


@contextmanager
def older_cache_allocation(monkeypatch):
    """transformers 5.17–5.23's cache allocation, on the installed transformers: a ``StaticLayer``
    allocates its values in its keys' dtype, a ``DynamicLayer`` starts its values empty in its
    keys' dtype (``torch.cat`` then promotes the values written to it)."""
    from transformers.cache_utils import DynamicLayer, StaticLayer

    static_init, dynamic_init = StaticLayer.lazy_initialization, DynamicLayer.lazy_initialization
    with monkeypatch.context() as m:
        m.setattr(StaticLayer, "lazy_initialization", lambda self, k, v: static_init(self, k, v.to(k.dtype)))
        m.setattr(DynamicLayer, "lazy_initialization", lambda self, k, v: dynamic_init(self, k, v.to(k.dtype)))
        yield


def _model(tok, weights: str, lora: bool):
    model = tiny_causal_lm(tok, seed=3)
    if lora:
        from peft import LoraConfig, get_peft_model

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"]))
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # an adapter that changes the outputs (peft starts lora_B at zero)
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.to(getattr(torch, weights)).eval()


def _prompts(tok, words=("ab", "cdefg", "hi", "abcabc")):
    return [tok(w, add_special_tokens=False)["input_ids"] for w in words]


def _generate(model, tok, autocast, share_prompt: bool, n: int, decode: str = "static"):
    engine = HFEngine(
        model, tok.pad_token_id, tok.eos_token_id, share_prompt=share_prompt, logprobs=True, decode=decode
    )
    dtype = getattr(torch, autocast) if autocast else torch.bfloat16
    with torch.autocast("cpu", dtype=dtype, enabled=autocast is not None):
        return engine.generate(_prompts(tok), n, SAMPLING, seed=[11, 22, 33, 44])


@pytest.mark.parametrize("weights,autocast,lora", PRECISIONS, ids=IDS)
def test_static_decode_runs_under_autocast_with_either_allocation(weights, autocast, lora, monkeypatch):
    """With a shared prompt cache (4 rows a prompt) and without (one row a prompt: generate encodes
    the prompts), static decode under 5.17–5.23's cache allocation samples exactly what it samples
    under the installed one: the same tokens, masks and log-probs (the buffers hold the same
    numbers, only allocated elsewhere)."""
    tok = char_tokenizer()
    model = _model(tok, weights, lora)
    for share_prompt, n in ((True, 4), (False, 1)):
        want = _generate(model, tok, autocast, share_prompt, n)
        with older_cache_allocation(monkeypatch):
            got = _generate(model, tok, autocast, share_prompt, n)
        assert torch.equal(got.input_ids, want.input_ids)
        assert torch.equal(got.response_mask, want.response_mask)
        assert torch.equal(got.logprobs, want.logprobs)
        assert want.response_mask.sum() > 0 and torch.isfinite(want.logprobs).all()


def test_the_static_cache_holds_float32_keys_and_bfloat16_values_under_autocast(monkeypatch):
    """Float32 weights under bfloat16 autocast, 5.17–5.23's allocation: each static layer holds its
    keys in float32 and its values in bfloat16, one row per completion and ``length`` columns: with
    a shared prompt, that prompt's columns first (the prompt cache's own), and without one, empty."""
    from rlhfkit.data.padding import pad

    tok = char_tokenizer()
    model = _model(tok, "float32", False)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, decode="static")
    prompt_ids, prompt_mask = pad(_prompts(tok), tok.pad_token_id, "left")
    ids, n, length = prompt_ids.repeat_interleave(3, 0), 3, prompt_ids.shape[1] + 5
    with older_cache_allocation(monkeypatch), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        prompt_cache = engine._prompt_cache(prompt_ids, prompt_mask, n)
        shared = engine._static_cache(prompt_cache, ids, length)
        own = engine._static_cache(None, ids, length)
    filled = prompt_ids.shape[1] - 1
    for cache, columns in ((shared, filled), (own, 0)):
        for layer, prompt in zip(cache.layers, prompt_cache.layers):
            assert (layer.keys.dtype, layer.values.dtype) == (torch.float32, torch.bfloat16)
            assert layer.keys.shape == (ids.shape[0], prompt.keys.shape[1], length, prompt.keys.shape[-1])
            assert layer.values.shape == (ids.shape[0], prompt.values.shape[1], length, prompt.values.shape[-1])
            assert int(layer.get_seq_length()) == columns
            if columns:
                assert torch.equal(layer.keys[:, :, :filled], prompt.keys)
                assert torch.equal(layer.values[:, :, :filled], prompt.values)
