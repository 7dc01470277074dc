"""The weights a rollout engine receives (``hf_weights``): every adapter kind PEFT merges goes in as
PEFT's own ``merge_and_unload`` merges it, by the base model's names, without touching the trained
model; a kind the engine cannot take is refused in one line."""

import copy
import re
import warnings

import pytest
import torch

from rlhfkit.rollout.weight_sync import check_engine_weights, hf_weights, load_weights
from rlhfkit.tasks.tiny import char_tokenizer

TOK = char_tokenizer()

# name: (tiny Llama options, LoraConfig options)
KINDS = {
    "lora": ({}, dict(target_modules=["q_proj", "v_proj", "up_proj"])),
    "dora": ({}, dict(target_modules=["q_proj", "down_proj"], use_dora=True)),
    "rslora_alpha_pattern": (
        {},
        dict(
            target_modules=["q_proj", "v_proj"],
            use_rslora=True,
            lora_alpha=16,
            alpha_pattern={"v_proj": 3},
            rank_pattern={"v_proj": 2},
        ),
    ),
    "embedding": ({"tied": False}, dict(target_modules=["embed_tokens", "o_proj"])),
    "embedding_dora": ({"tied": False}, dict(target_modules=["embed_tokens"], use_dora=True)),
    "modules_to_save_lm_head": ({"tied": False}, dict(target_modules=["q_proj"], modules_to_save=["lm_head"])),
    "modules_to_save_tied": (
        {},
        dict(target_modules=["q_proj"], modules_to_save=["embed_tokens"], ensure_weight_tying=True),
    ),
    "lora_bias": ({"bias": True}, dict(target_modules=["q_proj", "o_proj", "up_proj"], lora_bias=True)),
    "trainable_tokens": ({"tied": False}, dict(target_modules=["q_proj"], trainable_token_indices=[3, 4, 5])),
}


def tiny_llama(tied=True, bias=False, seed=0):
    """A tiny random Llama (head size 32, as vLLM's CPU attention needs), tied embeddings or not,
    with biases on the attention and MLP projections or not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(TOK),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        attention_bias=bias,
        mlp_bias=bias,
        pad_token_id=TOK.pad_token_id,
        eos_token_id=TOK.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def adapted(kind, seed=0):
    """A PEFT model of ``kind`` whose every trainable tensor is moved off its initial value (LoRA B
    starts at zero: the merge would be invisible)."""
    from peft import LoraConfig, get_peft_model

    model_options, lora_options = KINDS[kind]
    options = dict(r=4, lora_alpha=8, lora_dropout=0.0) | lora_options
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(tiny_llama(**model_options, seed=seed), LoraConfig(**options)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model


IDS = torch.tensor([TOK("hello world 12+3=15", add_special_tokens=False)["input_ids"]])


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_engine_weights_are_peft_merge_and_unload_by_the_base_names_and_leave_the_model_bit_identical(kind):
    from transformers import LlamaForCausalLM

    model = adapted(kind)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights = list(hf_weights(model))

    plain = LlamaForCausalLM(copy.deepcopy(model.get_base_model().config)).eval()
    names = [name for name, _ in weights]
    assert names == list(plain.state_dict()), names  # tied weights under each name, nothing more
    exported = dict(weights)
    plain.load_state_dict(exported, strict=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = copy.deepcopy(model).merge_and_unload()
    for name, tensor in merged.state_dict().items():  # PEFT's own numbers, bit for bit
        assert torch.equal(exported[name], tensor), name
    if plain.config.tie_word_embeddings:  # a tied engine reads one of the two
        assert torch.equal(exported["model.embed_tokens.weight"], exported["lm_head.weight"])

    with torch.no_grad():
        ours, theirs, peft = (m(input_ids=IDS).logits for m in (plain, merged, model))
        base = model.get_base_model()
        with model.disable_adapter():
            unadapted = model(input_ids=IDS).logits
    assert (ours - unadapted).abs().max() > 1e-2  # the adapter matters here
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours, peft, atol=1e-5, rtol=0)

    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert not changed, changed
    assert not any(getattr(m, "merged", False) for m in base.modules())


def test_a_model_without_an_adapter_goes_out_as_its_own_parameters():
    model = tiny_llama()
    weights = list(hf_weights(model))
    assert [n for n, _ in weights] == list(model.state_dict())
    assert all(t.data_ptr() == model.state_dict()[n].data_ptr() for n, t in weights)  # no copies


def test_a_receiver_loads_the_merged_weights_and_generates_as_the_adapted_model():
    """``load_weights`` is ``hf_weights``' counterpart on a generator rank: a plain copy of the base
    model given an adapted model's merged weights computes what the adapted model computes."""
    sender, receiver = adapted("lora"), tiny_llama(seed=1)
    load_weights(receiver, hf_weights(sender))
    with torch.no_grad():
        torch.testing.assert_close(receiver(IDS).logits, sender(IDS).logits, rtol=1e-5, atol=1e-5)


def test_a_weight_the_receiver_lacks_is_refused_in_one_line_naming_it():
    receiver = tiny_llama()
    for weights in (
        [("model.layers.9.mlp.up_proj.weight", torch.zeros(128, 64))],
        [("lm_head.weight", torch.zeros(3, 64))],
    ):
        with pytest.raises(
            RuntimeError,
            match=r"^generator rank: the trainers sent weight '[^']+' \(\d+, 64\), which "
            r"its copy of the model does not have in that shape$",
        ):
            load_weights(receiver, weights)


def _refused(model):
    with pytest.raises(ValueError) as err:
        check_engine_weights(model)
    message = str(err.value)
    assert "\n" not in message
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        hf_weights(model)  # refused before anything is yielded
    return message


@pytest.mark.parametrize(
    "lora_options, expected",
    [
        (dict(target_modules=["embed_tokens"]), "model.embed_tokens.weight and lm_head.weight are one tied weight"),
        (dict(target_modules=["embed_tokens"], ensure_weight_tying=True), "are one tied weight"),
        (dict(target_modules=["q_proj"], modules_to_save=["lm_head"]), "are one tied weight"),
        (dict(target_modules=["q_proj"], lora_bias=True), "q_proj: lora_bias=True on a layer without a bias"),
    ],
    ids=["embedding_lora_tied", "embedding_lora_ensure_tying", "modules_to_save_tied_lm_head", "lora_bias_no_bias"],
)
def test_an_adapter_the_engine_cannot_take_merged_is_refused_in_one_line(lora_options, expected):
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, **lora_options))
    assert expected in _refused(model)


def test_other_peft_methods_are_refused_in_one_line():
    from peft import IA3Config, PromptTuningConfig, get_peft_model

    ia3 = get_peft_model(
        tiny_llama(), IA3Config(target_modules=["q_proj", "down_proj"], feedforward_modules=["down_proj"])
    )
    assert "q_proj: a peft.tuners.ia3.layer.Linear adapter layer cannot be merged" in _refused(ia3)
    prompt = get_peft_model(tiny_llama(), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    assert "PROMPT_TUNING (prompt learning)" in _refused(prompt)
