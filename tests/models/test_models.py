"""Models: dropout off, loading local HF directories, response log-probs / entropy / hidden
states, the scalar head (critic and reward model) and the reward-model reward function."""

import json

import pytest
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rlhfkit.data.padding import pad
from rlhfkit.models import (
    ScalarModel,
    disable_dropout,
    enable_activation_checkpointing,
    forward_response,
    freeze,
    load_causal_lm,
    load_tokenizer,
)
from rlhfkit.models.lm_head import streamable
from rlhfkit.models.policy import position_ids_from_mask
from rlhfkit.rewards.reward_model import RewardModelFunction
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


# ----------------------------------------------------------------------------- ScalarModel


def test_scalar_from_causal_lm_copies_backbone():
    policy = _model()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    sm = ScalarModel.from_causal_lm(policy)
    assert sm.backbone is not policy.model
    assert isinstance(sm.head, torch.nn.Linear) and sm.head.out_features == 1
    assert float(sm.offset) == 0.0
    torch.testing.assert_close(sm.backbone.embed_tokens.weight, policy.model.embed_tokens.weight)
    with torch.no_grad():
        for p in sm.backbone.parameters():
            p.add_(1.0)
    for k, v in policy.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_scalar_values_shape_and_positions():
    sm = ScalarModel.from_causal_lm(_model())
    T = 4
    ids, mask = _batch(response_len=T)
    values = sm.values(ids, mask, T)
    assert values.shape == (3, T) and values.dtype == torch.float32
    with torch.no_grad():
        hidden = sm.backbone(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
        ).last_hidden_state
        expected = sm.head(hidden[:, -(T + 1) : -1]).squeeze(-1)
    torch.testing.assert_close(values.detach(), expected, atol=1e-5, rtol=1e-5)


def test_scalar_score_reads_last_attended_token():
    torch.manual_seed(0)
    sm = freeze(ScalarModel.from_causal_lm(_model()))
    ids, mask = _batch(prompt_lens=(2, 5, 0), response_len=3)
    with torch.no_grad():
        s = sm.score(ids, mask)
        assert s.shape == (3,) and s.dtype == torch.float32
        hidden = sm.backbone(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
        ).last_hidden_state
        torch.testing.assert_close(s, sm.head(hidden[:, -1]).squeeze(-1), atol=1e-5, rtol=1e-5)

        # right padding with attention 0 (any ids) does not move the score
        right = torch.randint(3, 40, (3, 4), generator=torch.Generator().manual_seed(1))
        s_right = sm.score(torch.cat([ids, right], 1), torch.cat([mask, torch.zeros_like(right)], 1))
        torch.testing.assert_close(s_right, s, atol=1e-5, rtol=1e-5)

        # uneven right padding: row 1 loses its last two tokens by mask → equals scoring it truncated
        mask_short = mask.clone()
        mask_short[1, -2:] = 0
        s_short = sm.score(ids, mask_short)
        alone = sm.score(ids[1:2, :-2], mask[1:2, :-2])
        torch.testing.assert_close(s_short[1], alone[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(s_short[[0, 2]], s[[0, 2]], atol=1e-5, rtol=1e-5)

        # changing an attended token before the last one changes the score
        changed = ids.clone()
        changed[:, -2] = torch.where(changed[:, -2] == 10, 11, 10)
        assert (sm.score(changed, mask) - s).abs().min() > 1e-6

        # changing a left-padding token does not
        pad_changed = ids.clone()
        pad_changed[mask == 0] = 33
        torch.testing.assert_close(sm.score(pad_changed, mask), s, atol=1e-5, rtol=1e-5)


def test_scalar_save_and_load_round_trip_with_offset(tmp_path):
    torch.manual_seed(0)
    sm = ScalarModel.from_causal_lm(_model())
    with torch.no_grad():
        sm.head.bias.fill_(0.3)
    ids, mask = _batch()
    with torch.no_grad():
        raw = sm.score(ids, mask)
    sm.set_offset(0.75)
    with torch.no_grad():
        centred = sm.score(ids, mask)
    torch.testing.assert_close(centred, raw - 0.75)

    sm.save_pretrained(tmp_path / "rm")
    meta = json.loads((tmp_path / "rm" / "rlhfkit_scalar.json").read_text())
    assert meta["offset"] == 0.75 and meta["hidden_size"] == HIDDEN and meta["bias"] is True
    loaded = ScalarModel.from_pretrained(tmp_path / "rm")
    assert float(loaded.offset) == 0.75
    with torch.no_grad():
        torch.testing.assert_close(loaded.score(ids, mask), centred, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(loaded.values(ids, mask, 4), sm.values(ids, mask, 4), atol=1e-5, rtol=1e-5)
        loaded.set_offset(0.0)
        torch.testing.assert_close(loaded.score(ids, mask), raw, atol=1e-5, rtol=1e-5)


def test_scalar_from_plain_causal_lm_dir_gets_fresh_head(tmp_path):
    tok = char_tokenizer()
    path = save_tiny_model(tmp_path / "lm", tokenizer=tok, hidden_size=HIDDEN, layers=2, heads=4, seed=0)
    lm = load_causal_lm(path)
    sm = ScalarModel.from_pretrained(path)
    for k, v in lm.model.state_dict().items():
        torch.testing.assert_close(sm.backbone.state_dict()[k], v, msg=k)
    assert sm.head.weight.shape == (1, HIDDEN)
    assert torch.equal(sm.head.bias, torch.zeros(1))
    assert float(sm.head.weight.detach().std()) > 0
    assert float(sm.offset) == 0.0
    ids, mask = _batch()
    with torch.no_grad():
        s = sm.score(ids, mask)
    assert s.shape == (3,) and torch.isfinite(s).all()


def test_scalar_from_sequence_classification_dir(tmp_path):
    torch.manual_seed(0)
    config = _llama_config(num_labels=1)
    seq = LlamaForSequenceClassification(config).eval()
    with torch.no_grad():
        seq.score.weight.normal_(std=0.5)
    seq.save_pretrained(tmp_path / "seqcls")
    sm = ScalarModel.from_pretrained(tmp_path / "seqcls")
    torch.testing.assert_close(sm.head.weight, seq.score.weight)
    ids = torch.randint(3, 48, (3, 7), generator=torch.Generator().manual_seed(0))  # no pad id inside
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = seq(input_ids=ids, attention_mask=mask).logits[:, 0]
        got = sm.score(ids, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    # and it saves / loads again through the rlhfkit layout (a head without bias)
    sm.save_pretrained(tmp_path / "again")
    again = ScalarModel.from_pretrained(tmp_path / "again")
    assert again.head.bias is None
    with torch.no_grad():
        torch.testing.assert_close(again.score(ids, mask), got, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- RewardModelFunction


PROMPTS = ["ab", "hello ", "x", "12+3="]
COMPLETIONS = ["c", "world", "yz1", "15"]


@pytest.mark.parametrize("pad_is_eos", [False, True], ids=["distinct_pad", "pad_is_eos"])
def test_reward_model_function_scores_text_plus_eos(pad_is_eos):
    tok = char_tokenizer(pad_is_eos=pad_is_eos)
    sm = freeze(ScalarModel.from_causal_lm(_model(tok)))
    with torch.no_grad():
        sm.head.bias.fill_(0.1)
    fn = RewardModelFunction(sm, tok)
    scores = fn(PROMPTS, COMPLETIONS)
    assert isinstance(scores, list) and len(scores) == len(PROMPTS)
    assert all(isinstance(s, float) for s in scores)

    for p, c, s in zip(PROMPTS, COMPLETIONS, scores):
        ids = tok(p + c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            manual = sm.score(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
            without_eos = sm.score(torch.tensor([ids[:-1]]), torch.ones(1, len(ids) - 1, dtype=torch.long))
        assert s == pytest.approx(float(manual), abs=1e-5)
        assert abs(s - float(without_eos)) > 1e-6

    for bs in (1, 3):
        small = RewardModelFunction(sm, tok, batch_size=bs)(PROMPTS, COMPLETIONS)
        assert small == pytest.approx(scores, abs=1e-5)


def test_reward_model_function_encodes_like_reward_model_training_and_subtracts_offset():
    from rlhfkit.data.encode import encode_pair

    tok = char_tokenizer()
    sm = freeze(ScalarModel.from_causal_lm(_model(tok)))
    chat = [[{"role": "user", "content": p}] for p in PROMPTS[:2]]
    fn = RewardModelFunction(sm, tok, encode=encode_pair, name="rm")
    assert fn.__name__ == "rm"
    scores = fn(chat, COMPLETIONS[:2], answer=["x", "y"])
    direct = RewardModelFunction(sm, tok)(["u:" + p + "\na:" for p in PROMPTS[:2]], COMPLETIONS[:2])
    assert scores == pytest.approx(direct, abs=1e-6)  # the chat template renders "u:...\na:"
    sm.set_offset(2.0)
    shifted = fn(chat, COMPLETIONS[:2])
    assert shifted == pytest.approx([s - 2.0 for s in scores], abs=1e-5)


# ----------------------------------------------------------------------------- shared prompt pass


def _grouped_batch(G=3, T=4, prompt_lens=(2, 5, 1), seed=0):
    """Rows g*G .. g*G+G-1 share prompt g (identical prompt columns), with different responses."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 40, (p,), generator=g).tolist() for p in prompt_lens]
    seqs = [p + torch.randint(3, 40, (T,), generator=g).tolist() for p in prompts for _ in range(G)]
    ids, mask = pad(seqs, 0, "left")
    mask[1, -1] = 0  # a response that ended early: its last column is not attended
    return ids, mask, torch.arange(len(prompts)).repeat_interleave(G)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_forward_response_shared_prompt_matches_full_pass(arch):
    """Running each prompt once and sharing its cache gives the same log-probs, entropies, hidden
    states and parameter gradients as running every row in full (and rows may come in any order)."""
    model = (_model() if arch == "llama" else _tiny_gpt2()).train()
    T = 4
    ids, mask, index = _grouped_batch(T=T)
    perm = torch.tensor([4, 0, 8, 1, 5, 2, 7, 3, 6])
    ids, mask, index = ids[perm], mask[perm], index[perm]
    results = []
    for prompt_index in (None, index):
        model.zero_grad()
        out = forward_response(
            model,
            ids,
            mask,
            T,
            temperature=0.7,
            with_entropy=True,
            entropy_grad=True,
            with_hidden=True,
            prompt_index=prompt_index,
            support=(5, 0.9),
        )
        resp = mask[:, -T:].bool()
        ((out.logprobs + out.entropy) * resp).sum().backward()
        results.append(
            (
                out.logprobs[resp],
                out.entropy[resp],
                out.hidden[resp],
                [p.grad.clone() for p in model.parameters() if p.grad is not None],
                out.log_kept_mass[resp],
            )
        )
    (lp0, ent0, h0, g0, k0), (lp1, ent1, h1, g1, k1) = results
    assert (k0 < 0).any()  # top-k 5 of the vocabulary truncates
    torch.testing.assert_close(k1, k0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h1, h0, atol=1e-5, rtol=1e-5)
    assert len(g1) == len(g0) > 0
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_forward_response_shared_prompt_packs_each_group_into_one_row():
    """One pass of one row per prompt: the prompt once, then each response's tokens but its last
    (row 1's ended a column early), no padding inside a group."""
    model = _model()
    ids, mask, index = _grouped_batch(G=3, T=4)
    seen = []
    assert streamable(model)  # asked once per model, by a one-token pass of its own (not counted below)
    model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].clone()))
    with torch.no_grad():
        forward_response(model, ids, mask, 4, prompt_index=index)
    P = ids.shape[1] - 4
    assert [tuple(x.shape) for x in seen] == [(3, P + 3 * 3)]
    assert seen[0][0, P:].tolist() == ids[0, P : P + 3].tolist() + ids[1, P : P + 2].tolist() + ids[
        2, P : P + 3
    ].tolist() + [0]


def test_forward_response_shared_prompt_under_gradient_checkpointing():
    """Packing is one plain forward pass, so it holds under activation checkpointing (which drops a
    cached prompt's keys): the same log-probs and gradients as the unpacked rows."""
    model = _model()
    enable_activation_checkpointing(model)
    model.train()
    ids, mask, index = _grouped_batch(T=3)
    resp = mask[:, -3:].bool()
    results = []
    for prompt_index in (None, index):
        model.zero_grad()
        out = forward_response(model, ids, mask, 3, prompt_index=prompt_index).logprobs
        (out * resp).sum().backward()
        results.append((out[resp], [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (lp0, g0), (lp1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    for a, b in zip(g1, g0, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_forward_response_skips_columns_no_row_attends():
    """Left padding common to every row and response columns after every row's end are not run
    through the model; the outputs keep their full width (zeros there) and are unchanged elsewhere."""
    model = _model()
    T, extra_left, extra_right = 5, 3, 2
    ids, mask = _batch(prompt_lens=(2, 4), response_len=T - extra_right)
    ids = torch.cat([torch.full((2, extra_left), 9), ids, torch.full((2, extra_right), 7)], 1)
    mask = torch.cat(
        [torch.zeros(2, extra_left, dtype=torch.long), mask, torch.zeros(2, extra_right, dtype=torch.long)], 1
    )
    widths = []
    streamable(model)  # the once-per-model probe of the streamed head runs before the hook counts
    model.model.embed_tokens.register_forward_hook(lambda mod, inp, out: widths.append(inp[0].shape[1]))
    with torch.no_grad():
        out = forward_response(model, ids, mask, T, with_entropy=True, with_hidden=True)
        plain = forward_response(
            model, ids[:, extra_left:-extra_right], mask[:, extra_left:-extra_right], T - extra_right
        )
    assert widths[0] == ids.shape[1] - extra_left - extra_right
    assert out.logprobs.shape == (2, T) and out.entropy.shape == (2, T) and out.hidden.shape == (2, T, HIDDEN)
    torch.testing.assert_close(out.logprobs[:, : T - extra_right], plain.logprobs, atol=1e-5, rtol=1e-5)
    assert out.logprobs[:, T - extra_right :].abs().sum() == 0
