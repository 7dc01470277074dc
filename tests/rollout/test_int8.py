"""The int8 rollout copy (``rollout_precision='int8'``, ``rollout/int8.py``): per-token activation
scales keep a token's result independent of the other tokens in its batch — a massive activation in
one row (SmolLM2 has |x| ~ 3,000 at the first position) leaves the other rows' outputs as accurate
as without it — and the quantized model stays close to the float one."""

import pytest
import torch

from rlhfkit.rollout.int8 import Int8Linear, quantize_rows, to_int8
from rlhfkit.rollout.quantized import quantize
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm


def test_quantize_rows_by_hand():
    q, scale = quantize_rows(torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]]))
    assert scale[0, 0].item() == pytest.approx(2.0 / 127)
    assert q[0].tolist() == [64, -127, 32] and q[1].tolist() == [0, 0, 0]  # 63.5 rounds to even: 64


def test_a_massive_activation_in_one_row_leaves_the_others_exact():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64) * 0.06
    spiked = x.clone()
    spiked[0, 3] = 3000.0  # one token's massive activation
    layer = Int8Linear(linear)
    alone, together = layer(x[1:]), layer(spiked)[1:]
    assert torch.equal(alone, together)  # each row its own scale: its batch companions change nothing
    reference = linear(x[1:])
    assert (together - reference).abs().max() < 0.02 * reference.abs().max()


def test_int8_linear_matches_the_float_layer_with_bias_and_leading_dims():
    torch.manual_seed(1)
    linear = torch.nn.Linear(48, 24, bias=True)
    x = torch.randn(2, 5, 48)
    y = Int8Linear(linear)(x)
    assert y.shape == (2, 5, 24) and y.dtype == x.dtype
    torch.testing.assert_close(y, linear(x), rtol=0, atol=0.05)


def test_the_int8_copy_keeps_the_head_and_stays_close_to_the_model():
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, seed=3).eval()
    copy = quantize(model, "int8")
    assert isinstance(copy.get_output_embeddings(), torch.nn.Linear)  # the LM head kept in float
    assert any(isinstance(m, Int8Linear) for m in copy.modules())
    ids = torch.randint(5, 40, (3, 12))
    with torch.no_grad():
        p = model(ids).logits.log_softmax(-1)
        q = copy(ids).logits.log_softmax(-1)
    kl = (q.exp() * (q - p)).sum(-1).mean()
    assert kl < 1e-3


def test_a_gpt2_copy_quantizes_its_conv1d_projections_and_stays_close():
    """GPT-2's projections are transformers' Conv1D (weight (in, out)): each becomes an Int8Linear (4 a layer:
    c_attn, attn.c_proj, c_fc, mlp.c_proj) computing the same map; the copy samples from nearly the model."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=64)).eval()
    assert not any(isinstance(m, torch.nn.Linear) for m in model.transformer.modules())
    conv = model.transformer.h[0].mlp.c_fc
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(Int8Linear(conv)(x), conv(x), atol=0.05, rtol=0.05)
    copy = quantize(model, "int8")
    assert sum(isinstance(m, Int8Linear) for m in copy.modules()) == 8
    assert not any(isinstance(m, Conv1D) for m in copy.modules())
    ids = torch.randint(0, 61, (3, 12))
    with torch.no_grad():
        p = model(ids).logits.log_softmax(-1)
        q = copy(ids).logits.log_softmax(-1)
    assert (q.exp() * (q - p)).sum(-1).mean() < 1e-3


def test_a_model_with_nothing_to_quantize_is_refused_in_one_line():
    class Lookup(torch.nn.Module):  # an embedding and nothing else
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)

    with pytest.raises(ValueError, match=r"^rollout_precision='int8': Lookup has no torch.nn.Linear or transformers"):
        to_int8(Lookup())
