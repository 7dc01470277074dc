"""The scalar model (critic and reward model: built from a causal LM, its values and scores, saved and
loaded) and the reward-model reward function (rlhfkit.rewards.reward_model)."""

import json

import pytest
import torch
from transformers import LlamaForSequenceClassification

from rlhfkit.models import (
    ScalarModel,
    freeze,
    load_causal_lm,
)
from rlhfkit.models.policy import position_ids_from_mask
from rlhfkit.rewards.reward_model import RewardModelFunction
from rlhfkit.tasks.tiny import char_tokenizer, save_tiny_model

from .test_models import HIDDEN, _batch, _llama_config, _model

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
