"""The decode loop (``HFEngine(decode="loop")``) on every architecture the trainer packs
(``models.packing.PACKABLE_MODELS``) and on Falcon (rotary and ALiBi), in 16-bit on a CPU, where
the loop attends by ``rollout.decode.decode_attention``: it samples what ``generate`` samples, its
log-probs are the trainer's (``forward_response``), and it leaves transformers as it found it — no
model config names another attention, during the call or after, and the attention registries are
unchanged. Falcon tests the attention's name itself and calls PyTorch's kernel directly; it used
to be switched to an attention it does not implement and sampled from another distribution."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlhfkit.models import forward_response
from rlhfkit.models.packing import PACKABLE_MODELS
from rlhfkit.rollout import HFEngine, SamplingParams
from rlhfkit.rollout import decode as decode_module
from rlhfkit.tasks.tiny import char_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FALCONS = ["falcon-rotary", "falcon-alibi"]
ARCHITECTURES = sorted(PACKABLE_MODELS) + FALCONS
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
EXTRA = {"qwen2_moe": dict(MOE, shared_expert_intermediate_size=32), "qwen3_moe": MOE}
# the largest |loop - generate| (float16) and |loop - trainer| (bfloat16) log-prob of a token: the
# rounding of the decode steps' attention by matmuls (measured at most 9e-4 and 7e-3); Falcon switched
# to an attention it does not implement was off by 6e-2 (rotary) and 1e-2 (ALiBi) in float16
ATOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def _model(tok, architecture: str, dtype: torch.dtype):
    """A randomly initialised 2-layer model of ``architecture`` (hidden 32, 4 query heads over 2
    key/value heads where the architecture has them), its head scaled up so that its
    distributions are not flat, in ``dtype``."""
    from transformers import AutoConfig, AutoModelForCausalLM, FalconConfig

    ids = dict(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    if architecture in FALCONS:
        config = FalconConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            alibi=architecture == "falcon-alibi",
            **ids,
        )
    else:
        config = AutoConfig.for_model(
            architecture,
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=128,
            **ids,
            **EXTRA.get(architecture, {}),
        )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)
    return model.to(dtype)


def _prompts(tok):
    """Prompts of 2, 5, 2 and 6 tokens: left-padded to 6, each padded differently."""
    return [tok(w, add_special_tokens=False)["input_ids"] for w in ("ab", "cdefg", "hi", "abcabc")]


@contextlib.contextmanager
def _leaves_transformers_alone(model, monkeypatch):
    """Within the block, count the one-query 16-bit calls of ``decode_attention`` (the list
    yielded) and record the attention every model call's config names; after it, check that
    every config and transformers' attention and mask registries are as before."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    configs = list({id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}.values())
    names = [c._attn_implementation for c in configs]
    functions, masks = dict(ALL_ATTENTION_FUNCTIONS), dict(ALL_MASK_ATTENTION_FUNCTIONS)
    decode_steps, named = [], set()
    attention = decode_module.decode_attention

    def counted(module, query, *args, **kwargs):
        if query.shape[2] == 1 and query.dtype != torch.float32:
            decode_steps.append(query.shape[0])
        return attention(module, query, *args, **kwargs)

    monkeypatch.setattr(decode_module, "decode_attention", counted)
    hook = model.register_forward_pre_hook(lambda m, args: named.add(m.config._attn_implementation))
    try:
        yield decode_steps
    finally:
        hook.remove()
    assert named == {"sdpa"}  # no config was switched, even for the call
    assert [c._attn_implementation for c in configs] == names
    assert dict(ALL_ATTENTION_FUNCTIONS) == functions  # nothing left rebound or registered
    assert dict(ALL_MASK_ATTENTION_FUNCTIONS) == masks


def _sample(model, tok, decode: str):
    """Two completions of 6 tokens per prompt at temperature 1, one seed per prompt."""
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, logprobs=True, decode=decode)
    return engine.generate(_prompts(tok), 2, SamplingParams(max_new_tokens=6, temperature=1.0), seed=[1, 2, 3, 4])


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_loop_samples_what_generate_samples_in_float16(architecture, monkeypatch):
    """The same seeds give the same tokens, and the log-probs agree up to the rounding of the
    decode steps' attention (one query by matmuls): for Falcon exactly, as it keeps its own."""
    tok = char_tokenizer()
    model = _model(tok, architecture, torch.float16)
    want = _sample(model, tok, "generate")
    with _leaves_transformers_alone(model, monkeypatch) as decode_steps:
        got = _sample(model, tok, "loop")
    assert bool(decode_steps) == (architecture not in FALCONS)  # the path under test was taken (not by Falcon)
    assert torch.equal(got.input_ids, want.input_ids)
    assert torch.equal(got.response_mask, want.response_mask)
    torch.testing.assert_close(got.logprobs, want.logprobs, atol=ATOL[torch.float16], rtol=0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_the_loops_bfloat16_logprobs_are_the_trainers(architecture, monkeypatch):
    """In bfloat16 (``rollout_precision: bfloat16``) the log-prob the loop reports for each token
    it drew is the one the trainer computes for it (``forward_response`` over the rollout)."""
    tok = char_tokenizer()
    model = _model(tok, architecture, torch.bfloat16)
    with _leaves_transformers_alone(model, monkeypatch):
        rollout = _sample(model, tok, "loop")
    with torch.no_grad():
        trainer = forward_response(model, rollout.input_ids, rollout.attention_mask, rollout.response_mask.shape[1])
    real = rollout.response_mask.bool()
    assert int(real.sum()) >= 24  # most of the 8 rows x 6 tokens
    torch.testing.assert_close(rollout.logprobs[real], trainer.logprobs[real], atol=ATOL[torch.bfloat16], rtol=0)
