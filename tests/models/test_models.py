"""Models: dropout off, loading local HF directories, response log-probs / entropy / hidden
states (the shared prompt pass: test_shared_prompt.py; the scalar head and the reward-model
reward function: test_scalar_models.py)."""

import json

import pytest
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from rlhfkit.data.padding import pad
from rlhfkit.models import (
    ScalarModel,
    disable_dropout,
    forward_response,
    freeze,
    load_causal_lm,
    load_tokenizer,
)
from rlhfkit.models.policy import position_ids_from_mask
from rlhfkit.tasks.tiny import char_tokenizer, save_tiny_model, tiny_causal_lm

transformers.utils.logging.disable_progress_bar()

HIDDEN = 32


def _model(tok=None, seed=0):
    tok = tok or char_tokenizer()
    return tiny_causal_lm(tok, hidden_size=HIDDEN, layers=2, heads=4, seed=seed).eval()


def _batch(prompt_lens=(3, 6, 1), response_len=4, seed=0, vocab=40, pad_id=0):
    """Left-padded rows ``[pad | prompt | response]``; every response token attended."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, vocab, (p + response_len,), generator=g).tolist() for p in prompt_lens]
    return pad(seqs, pad_id, "left")


def _llama_config(**overrides):
    cfg = dict(
        vocab_size=48,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    cfg.update(overrides)
    return LlamaConfig(**cfg)


# ----------------------------------------------------------------------------- disable_dropout / freeze


class _WithDropout(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.lm = LlamaForCausalLM(config)
        self.drop = torch.nn.Dropout(0.3)
        self.nested = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))


def test_disable_dropout_zeroes_modules_and_config():
    torch.manual_seed(0)
    config = _llama_config(attention_dropout=0.1)
    wrapper = _WithDropout(config)
    assert wrapper.config.attention_dropout == 0.1
    out = disable_dropout(wrapper)
    assert out is wrapper
    dropouts = [m for m in wrapper.modules() if isinstance(m, torch.nn.Dropout)]
    assert len(dropouts) == 2
    assert all(m.p == 0.0 for m in dropouts)
    assert wrapper.config.attention_dropout == 0.0
    assert wrapper.lm.config.attention_dropout == 0.0


def test_disable_dropout_on_llama_config_floats():
    torch.manual_seed(0)
    model = LlamaForCausalLM(_llama_config(attention_dropout=0.1))
    disable_dropout(model)
    assert model.config.attention_dropout == 0.0
    for name in ("hidden_dropout", "dropout", "resid_pdrop", "classifier_dropout"):
        value = getattr(model.config, name, None)
        assert not isinstance(value, float) or value == 0.0, name


def test_disable_dropout_makes_train_mode_forward_deterministic():
    """The point of disable_dropout: a model in train mode gives the same log-probs twice (else the
    PPO ratio is not 1 on the first step). Llama reads attention dropout from an attribute each
    attention layer copied from the config at construction."""
    torch.manual_seed(0)
    model = disable_dropout(LlamaForCausalLM(_llama_config(attention_dropout=0.5))).train()
    ids = torch.randint(3, 48, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    a = model(input_ids=ids).logits
    torch.manual_seed(2)
    b = model(input_ids=ids).logits
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_freeze():
    model = _model().train()
    assert freeze(model) is model
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


# ----------------------------------------------------------------------------- loading


def test_load_causal_lm_and_tokenizer_round_trip(tmp_path):
    tok = char_tokenizer()
    path = save_tiny_model(tmp_path / "tiny", tokenizer=tok, hidden_size=HIDDEN, layers=2, heads=4, seed=0)
    original = tiny_causal_lm(tok, hidden_size=HIDDEN, layers=2, heads=4, seed=0).eval()

    model = load_causal_lm(path)
    assert isinstance(model, LlamaForCausalLM)
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, original(input_ids=ids).logits)

    loaded_tok = load_tokenizer(path)
    text = "hello 12+3=?"
    assert loaded_tok(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert loaded_tok.eos_token_id == tok.eos_token_id and loaded_tok.pad_token_id == tok.pad_token_id
    assert loaded_tok.padding_side == "left"

    bf16 = load_causal_lm(path, dtype="bfloat16")
    assert next(bf16.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        load_causal_lm(path, dtype="float64")


def test_load_causal_lm_model_object_passes_through():
    model = _model()
    assert load_causal_lm(model) is model


def test_missing_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(ValueError, match="does not exist") as err:
        load_causal_lm(missing)
    assert str(missing) in str(err.value)
    with pytest.raises(ValueError) as err:
        load_tokenizer(missing)
    assert str(missing) in str(err.value)
    with pytest.raises(ValueError) as err:
        ScalarModel.from_pretrained(missing)
    assert str(missing) in str(err.value)


def test_dir_without_config_is_a_clear_error(tmp_path):
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match="config.json") as err:
        load_causal_lm(empty)
    assert str(empty) in str(err.value)
    with pytest.raises(ValueError, match="config.json") as err:
        load_tokenizer(empty)
    assert str(empty) in str(err.value)


def _tokenizer_without_pad():
    base = char_tokenizer()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=base.backend_tokenizer, eos_token="<eos>", unk_token="<unk>", padding_side="right"
    )
    assert tok.pad_token is None
    return tok


def test_load_tokenizer_without_pad_falls_back_to_eos(tmp_path):
    tok = _tokenizer_without_pad()
    path = tmp_path / "tok"
    tok.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    loaded = load_tokenizer(path)
    assert loaded.eos_token_id == 1
    assert loaded.pad_token_id == loaded.eos_token_id
    assert loaded.padding_side == "left"
    batch = loaded(["ab", "abcd"], padding=True, add_special_tokens=False)
    assert batch["input_ids"][0][:2] == [1, 1]  # left padding with the EOS id
    assert batch["attention_mask"][0] == [0, 0, 1, 1]


def test_load_tokenizer_object():
    tok = _tokenizer_without_pad()
    out = load_tokenizer(tok)
    assert out is tok
    assert tok.pad_token_id == tok.eos_token_id and tok.padding_side == "left"


def test_load_tokenizer_without_eos_is_an_error():
    base = char_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=base.backend_tokenizer, unk_token="<unk>")
    with pytest.raises(ValueError, match="EOS"):
        load_tokenizer(tok)


# ----------------------------------------------------------------------------- forward_response


def _reference_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits.float()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_forward_response_logprobs_and_entropy(temperature):
    torch.manual_seed(0)
    model = _model()
    T = 4
    ids, mask = _batch(response_len=T)
    out = forward_response(model, ids, mask, T, temperature=temperature, with_entropy=True)
    logits = _reference_logits(model, ids, mask)[:, -(T + 1) : -1] / temperature
    logp_all = torch.log_softmax(logits, -1)
    expected = logp_all.gather(-1, ids[:, -T:, None]).squeeze(-1)
    assert out.logprobs.shape == (3, T) and out.logprobs.dtype == torch.float32
    torch.testing.assert_close(out.logprobs.detach(), expected, atol=1e-5, rtol=1e-5)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    assert out.entropy.shape == (3, T)
    torch.testing.assert_close(out.entropy, entropy, atol=1e-5, rtol=1e-5)
    assert out.hidden is None


def test_forward_response_entropy_grad_only_when_asked():
    model = _model().train()
    ids, mask = _batch()
    out = forward_response(model, ids, mask, 4, with_entropy=True)
    assert out.logprobs.requires_grad and not out.entropy.requires_grad
    out = forward_response(model, ids, mask, 4, with_entropy=True, entropy_grad=True)
    assert out.entropy.requires_grad
    with torch.no_grad():
        out = forward_response(model, ids, mask, 4, with_entropy=True, entropy_grad=True)
    assert not out.entropy.requires_grad and not out.logprobs.requires_grad
    assert forward_response(model, ids, mask, 4).entropy is None


def test_forward_response_with_hidden_is_final_hidden_state():
    model = _model()
    T = 4
    ids, mask = _batch(response_len=T)
    out = forward_response(model, ids, mask, T, with_hidden=True)
    assert out.hidden.shape == (3, T, HIDDEN)
    with torch.no_grad():
        last = model.model(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
        ).last_hidden_state
    # the (normalised) states the LM head reads: the value head sees what the policy sees
    torch.testing.assert_close(out.hidden.detach(), last[:, -(T + 1) : -1], atol=1e-5, rtol=1e-5)


def _tiny_gpt2(seed=0):
    """Absolute position embeddings (unlike RoPE, not invariant to a shift of every position)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=48,
        n_embd=HIDDEN,
        n_layer=2,
        n_head=4,
        n_positions=128,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = disable_dropout(GPT2LMHeadModel(config)).eval()
    with torch.no_grad():
        model.transformer.wpe.weight.normal_(std=0.5)
    return model


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_forward_response_invariant_to_left_padding(arch):
    """More left padding, and any ids under it, change nothing (position ids skip padding)."""
    model = _model() if arch == "llama" else _tiny_gpt2()
    T = 3
    ids, mask = _batch(prompt_lens=(2, 5), response_len=T)
    with torch.no_grad():
        base = forward_response(model, ids, mask, T).logprobs
        extra = 4
        mask2 = torch.cat([mask.new_zeros(2, extra), mask], 1)
        ids2 = torch.cat([ids.new_zeros(2, extra), ids], 1)
        ids2[mask2 == 0] = 17  # a real token id under the padding
        padded = forward_response(model, ids2, mask2, T).logprobs
        # each row alone, no padding at all
        singles = torch.cat(
            [
                forward_response(
                    model, ids[i][mask[i].bool()][None], torch.ones(1, int(mask[i].sum()), dtype=torch.long), T
                ).logprobs
                for i in range(2)
            ]
        )
    torch.testing.assert_close(padded, base, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(singles, base, atol=1e-5, rtol=1e-5)


def test_scalar_score_invariant_to_left_padding_gpt2():
    sm = freeze(ScalarModel.from_causal_lm(_tiny_gpt2()))
    ids, mask = _batch(prompt_lens=(2, 6), response_len=3)
    with torch.no_grad():
        s = sm.score(ids, mask)
        singles = torch.cat(
            [
                sm.score(ids[i][mask[i].bool()][None], torch.ones(1, int(mask[i].sum()), dtype=torch.long))
                for i in range(2)
            ]
        )
        values = sm.values(ids, mask, 3)
        values_single = sm.values(ids[0][mask[0].bool()][None], torch.ones(1, int(mask[0].sum()), dtype=torch.long), 3)
    torch.testing.assert_close(s, singles, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values[0], values_single[0], atol=1e-5, rtol=1e-5)


def test_forward_response_position_ids():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 1, 2, 2]]
