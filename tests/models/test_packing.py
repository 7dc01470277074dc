"""Where group packing (``rlhfkit/models/packing.py``) applies: only where it gives the model's own
results (full causal attention, positions from ``position_ids``, no sliding window narrower than the
rows) and computes less; elsewhere the rows run as they are, with the same outputs."""

import types

import pytest
import torch

from rlhfkit.data.padding import pad
from rlhfkit.models import forward_response
from rlhfkit.models.packing import pack_groups, packable_model, packing_computes_less


def grouped(G=3, T=6, prompt_lens=(4, 7), vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (p,), generator=g).tolist() for p in prompt_lens]
    seqs = [p + torch.randint(3, vocab, (T,), generator=g).tolist() for p in prompts for _ in range(G)]
    ids, mask = pad(seqs, 0, "left")
    return ids, mask, torch.arange(len(prompts)).repeat_interleave(G)


def mistral(window):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=window,
                           max_position_embeddings=128, attn_implementation="sdpa")
    torch.manual_seed(0)
    return MistralForCausalLM(config).eval()


def bloom():
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    return BloomForCausalLM(BloomConfig(vocab_size=48, hidden_size=32, n_layer=2, n_head=4)).eval()


def assert_same_as_unpacked(model, ids, mask, index, T):
    resp = mask[:, -T:].bool()
    with torch.no_grad():
        packed = forward_response(model, ids, mask, T, prompt_index=index).logprobs
        plain = forward_response(model, ids, mask, T).logprobs
    torch.testing.assert_close(packed[resp], plain[resp], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window, packs", [(3, False), (64, True)])
def test_a_sliding_window_narrower_than_the_rows_is_not_packed(window, packs):
    """A 4-D mask replaces the model's window: packed only where no row is wider than it."""
    model = mistral(window)
    ids, mask, index = grouped()
    assert packable_model(model, ids.shape[1]) is packs
    assert (pack_groups(model, ids, mask, 6, index) is not None) is packs
    assert_same_as_unpacked(model, ids, mask, index, 6)


def test_alibi_models_are_not_packed_and_run_as_they_are():
    """Bloom builds its ALiBi biases from a 2-D mask: not packable, the rows run unpacked."""
    model = bloom()
    ids, mask, index = grouped()
    assert not packable_model(model, ids.shape[1])
    assert_same_as_unpacked(model, ids, mask, index, 6)


def test_the_config_is_read_through_a_ddp_wrapper():
    model = mistral(None)
    assert packable_model(types.SimpleNamespace(module=model), 16)


def test_packing_is_used_only_where_it_computes_less():
    model = mistral(None)
    assert packing_computes_less(model, (4, 136), (16, 72))  # the bench batch: prompt once, no padding
    # Long completions: one packed row per prompt is dense over G x T columns, the padded rows are not.
    assert not packing_computes_less(model, (1, 16 * 4096 + 1024), (16, 4096 + 1024))
    ids, mask, index = grouped(G=8, T=40, prompt_lens=(2,))
    assert pack_groups(model, ids, mask, 40, index) is None  # 1 x 314 columns cost more than 8 x 42
    assert pack_groups(model, *grouped()[:2], 6, grouped()[2]) is not None
