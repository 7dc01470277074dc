"""Quantized rollouts (``rollout_precision``): the HF engine sampling from a bfloat16 or int8 copy
of the policy, re-synced after every optimizer step, reporting its own log-probs, which the
rollout correction weighs against the trainer's. fp8 (torchao, CUDA) is only checked for its
refusals here: no CPU can run it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import rlhfkit.rl.update as update_module
from rlhfkit.algorithms import POLICY_LOSSES
from rlhfkit.config import RLConfig
from rlhfkit.models import forward_response
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.engines import engine_ready
from rlhfkit.rollout.quantized import QuantizedEngine, plain_copy, quantize
from rlhfkit.rollout.weight_sync import hf_weights, load_weights
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import toy_trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13]]


def _engine(precision, seed=0):
    tok = char_tokenizer()
    policy = tiny_causal_lm(tok, seed=seed)
    return policy, QuantizedEngine(policy, precision, tok.pad_token_id, tok.eos_token_id)


def _policy_logprobs(policy, rollout):
    with torch.no_grad():
        return forward_response(
            policy, rollout.input_ids, rollout.attention_mask, rollout.response_mask.shape[1]
        ).logprobs


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_the_quantized_copy_samples_close_to_but_not_as_the_float32_policy(precision):
    policy, engine = _engine(precision)
    with engine_ready(engine, SimpleNamespace(policy=policy), 0, {}):
        rollout = engine.generate(PROMPTS, 4, SamplingParams(max_new_tokens=8), seed=3)
    mask = rollout.response_mask.bool()
    assert rollout.logprobs is not None  # the engine reports the log-probs it sampled with
    gap = (rollout.logprobs - _policy_logprobs(policy, rollout)).abs()[mask]
    assert 1e-5 < gap.max().item() < 0.1, gap.max()  # a real mismatch, and a small one
    head = engine.model.get_output_embeddings()
    assert head.weight.dtype == (torch.bfloat16 if precision == "bfloat16" else torch.float32)
    layer = engine.model.model.layers[0].mlp.down_proj
    if precision == "int8":  # int8 weights, per-token int8 inputs everywhere but the LM head
        assert type(layer).__name__ == "Int8Linear"
        assert type(head) is torch.nn.Linear
    else:
        assert layer.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # the trained policy is untouched


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_after_an_optimizer_step_the_engine_samples_from_the_new_weights():
    policy, engine = _engine("int8")
    models, timings = SimpleNamespace(policy=policy), {}
    ids = torch.tensor([PROMPTS[0]])
    with engine_ready(engine, models, 0, timings):
        before = _logits(engine.model, ids)
    assert engine.synced_version == 0 and "weight_sync" in timings
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
    policy(input_ids=ids).logits[..., 3].sum().backward()
    optimizer.step()
    with engine_ready(engine, models, 0, {}):  # the same version: no sync, the old copy
        assert torch.equal(_logits(engine.model, ids), before)
    with engine_ready(engine, models, 1, {}):
        after = _logits(engine.model, ids)
    assert engine.synced_version == 1
    fresh = plain_copy(policy)
    load_weights(fresh, hf_weights(policy))
    assert torch.equal(after, _logits(quantize(fresh, "int8"), ids))  # the updated policy, quantized afresh
    assert not torch.allclose(after, before, atol=1e-3)


def test_the_engine_generates_only_after_its_first_sync():
    _, engine = _engine("bfloat16")
    with pytest.raises(RuntimeError, match="after its first sync_weights"):
        engine.generate(PROMPTS, 1, SamplingParams(max_new_tokens=2))


def test_an_int8_run_logs_the_mismatch_and_corrects_it(monkeypatch):
    trainer = toy_trainer("grpo", max_steps=2, rollout_precision="int8", skip_zero_gradient_rows=False)
    assert isinstance(trainer.sampler.engine, QuantizedEngine)
    calls = []

    class Recording:
        def get(self, name):
            def loss(inputs, **kw):
                calls.append((trainer.step, inputs.weights, inputs.response_mask.bool()))
                return POLICY_LOSSES.get(name)(inputs, **kw)

            return loss

        def traits(self, name):
            return POLICY_LOSSES.traits(name)

    monkeypatch.setattr(update_module, "POLICY_LOSSES", Recording())
    history = trainer.train()
    assert len(history) == 2 and trainer.sampler.engine.synced_version == 1  # re-synced after the first step
    for step, row in enumerate(history):
        assert "perf/time_weight_sync" in row
        assert 0 < row["rollout/logprob_diff_max"] < 0.1 and row["rollout/logprob_diff_mean"] > 0
        assert "rollout/is_weight_mean" in row and row["rollout/is_masked_frac"] == 0
        step_calls = [c for c in calls if c[0] == step]
        assert step_calls and all(w is not None for _, w, _ in step_calls)  # the correction reaches the loss
        assert any(bool((w[m] != 1).any()) for _, w, m in step_calls)


@pytest.mark.parametrize(
    "changes, expected",
    [
        (dict(rollout_precision="int4"), "None or one of bfloat16, int8, fp8"),
        (dict(rollout_precision="fp8", device="cpu"), "'fp8' (torchao's float8 kernels) runs on CUDA only"),
        (dict(rollout_precision="int8", rollout_engine="vllm"), "None with rollout_engine='vllm' (quantized rollouts"),
        (dict(rollout_precision="int8", rollout_workers=1), "None with rollout_workers (quantized rollouts are the HF"),
    ],
)
def test_the_config_refuses_what_cannot_run_in_one_line(changes, expected):
    with pytest.raises(ValueError) as err:
        RLConfig(**changes)
    assert "\n" not in str(err.value) and "'rollout_precision'" in str(err.value) and expected in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp8 is refused where no GPU is")
def test_fp8_is_refused_without_a_gpu():
    with pytest.raises(ValueError, match="CUDA only"):
        RLConfig(rollout_precision="fp8")  # device 'auto' on a CPU-only machine
    with pytest.raises(ValueError, match=re.escape("runs on CUDA only (the policy is on cpu)")):
        _engine("fp8")


def test_the_accepted_precisions_and_the_default():
    assert RLConfig().rollout_precision is None
    for precision in ("bfloat16", "int8"):
        assert RLConfig(rollout_precision=precision, device="cpu").rollout_precision == precision
    assert RLConfig(rollout_precision="fp8", device="cuda").rollout_precision == "fp8"


def test_turning_the_correction_off_says_so_in_one_line(capsys):
    trainer = toy_trainer("grpo", max_steps=1, rollout_precision="bfloat16", rollout_is="none")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "rollout_precision" in line]
    assert len(lines) == 1 and "not corrected" in lines[0], err
    history = trainer.train()
    assert history[0]["rollout/logprob_diff_max"] > 0  # still measured, only not corrected
    toy_trainer("grpo", max_steps=1, rollout_precision="bfloat16")
    assert "not corrected" not in capsys.readouterr().err
