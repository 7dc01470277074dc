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

    config = MistralConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=window,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
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


# Rope whose frequencies depend on the length seen (issue 41, 6): transformers picks Phi-3's long or
# short factors, and dynamic NTK's base, from max(position_ids) of the pass, and the packed row's
# largest position is one less than the padded rows' (a completion's last token is not in it).
def phi3_longrope(original=16):
    from transformers import Phi3Config, Phi3ForCausalLM

    rope = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0, 2.0, 4.0, 8.0], "rope_theta": 1e4}
    config = Phi3Config(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4 * original,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        original_max_position_embeddings=original,
        rope_parameters=rope,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Phi3ForCausalLM(config).eval()


def llama_dynamic(original=16):
    from transformers import LlamaConfig, LlamaForCausalLM

    rope = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=original,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters=rope,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def response_logprobs(build, ids, mask, T, index=None, grown_by=None):
    """A fresh model's log-probs of the response tokens, packed by ``index`` or not; ``grown_by``: a
    batch run first (dynamic NTK keeps the frequencies of the longest pass it has seen)."""
    model = build()
    with torch.no_grad():
        if grown_by is not None:
            forward_response(model, grown_by[0], grown_by[1], 2)
        return forward_response(model, ids, mask, T, prompt_index=index).logprobs[mask[:, -T:].bool()]


@pytest.mark.parametrize("build, limit", [(phi3_longrope, 16), (llama_dynamic, 15)])
@pytest.mark.parametrize("longest", [12, 15, 16, 17, 24])
def test_rope_that_depends_on_the_length_seen_is_packed_only_within_its_original_length(build, limit, longest):
    """Longrope's factors are the short ones up to original_max_position_embeddings tokens; dynamic
    NTK's frequencies are the original ones below max_position_embeddings whatever an earlier pass
    grew them to. Rows within that run packed; a batch with a longer row runs as it is."""
    T = 6
    ids, mask, index = grouped(T=T, prompt_lens=(4, longest - T))
    long_batch = grouped(G=1, T=2, prompt_lens=(30,))[:2]
    for grown_by in (None, long_batch):
        packed = response_logprobs(build, ids, mask, T, index, grown_by)
        plain = response_logprobs(build, ids, mask, T, None, grown_by)
        torch.testing.assert_close(packed, plain, atol=1e-5, rtol=0)
    model = build()
    assert packable_model(model, longest) is (longest <= limit)
    assert (pack_groups(model, ids, mask, T, index) is not None) is (longest <= limit)


def test_the_rope_type_is_read_from_rope_parameters_per_layer_type_and_from_old_rope_scaling():
    from rlhfkit.models.packing import rope_length_limit

    def config(**kw):
        return types.SimpleNamespace(max_position_embeddings=64, **kw)

    assert rope_length_limit(config()) is None
    assert rope_length_limit(config(rope_parameters={"rope_type": "yarn", "factor": 4.0})) is None
    assert rope_length_limit(config(rope_scaling={"type": "dynamic", "factor": 2.0})) == 63
    longrope = {"rope_type": "longrope", "original_max_position_embeddings": 8}
    assert rope_length_limit(config(rope_parameters=longrope)) == 8
    assert rope_length_limit(config(rope_scaling={"type": "longrope"}, original_max_position_embeddings=32)) == 32
    assert (
        rope_length_limit(
            config(
                rope_parameters={
                    "full_attention": {"rope_type": "default"},
                    "sliding_attention": {"rope_type": "dynamic"},
                }
            )
        )
        == 63
    )


# MoE checkpoints with output_router_logits=True (issue 41, 8): the model's load-balancing loss reads
# the attention mask as (batch, seq); rlhfkit never uses that loss.
def moe(kind):
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    config_class, model_class = {
        "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
        "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    }[kind]
    config = config_class(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        output_router_logits=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return model_class(config).eval()


def dpo_batch(pairs=((3, 4, 2), (5, 3, 5)), vocab=48):
    """trainers/dpo.py's layout: the chosen rows, then the rejected ones, each (prompt, chosen,
    rejected) lengths; prompts left padded, completions right padded."""
    g = torch.Generator().manual_seed(1)

    def tokens(n):
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    prompts = [tokens(p) for p, _, _ in pairs]
    prompt_ids, prompt_mask = pad(prompts * 2, 0, "left")
    completion_ids, completion_mask = pad([tokens(c) for _, c, _ in pairs] + [tokens(r) for _, _, r in pairs], 0)
    ids, mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    return ids, mask, torch.arange(len(pairs)).repeat(2), completion_ids.shape[1]


@pytest.mark.parametrize("kind", ["qwen2_moe", "qwen3_moe"])
def test_moe_models_with_router_logits_on_run_packed(kind):
    """The packed pass turns the router logits (and the load-balancing loss) off: same log-probs
    and gradients as the rows run as they are, for RL groups and DPO pairs."""
    model = moe(kind)
    ids, mask, index = grouped()
    assert pack_groups(model, ids, mask, 6, index) is not None
    assert_same_as_unpacked(model, ids, mask, index, 6)

    ids, mask, index, T = dpo_batch()
    assert pack_groups(model, ids, mask, T, index) is not None
    model.train()
    grads = []
    for prompt_index in (index, None):
        model.zero_grad()
        logprobs = forward_response(model, ids, mask, T, prompt_index=prompt_index).logprobs
        (logprobs * mask[:, -T:]).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for packed, plain in zip(*grads):
        torch.testing.assert_close(packed, plain, atol=1e-5, rtol=1e-4)
