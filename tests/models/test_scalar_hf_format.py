"""ScalarModel.save_pretrained writes an HF ``<Arch>ForSequenceClassification`` directory (what
TRL, OpenRLHF and vLLM load with ``AutoModelForSequenceClassification``): HF's logits minus the
saved ``rlhfkit_score_shift`` are ``ScalarModel.score``, HF reads the same (EOS) token, and
``ScalarModel.from_pretrained`` gives back identical scores and values."""

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    GPT2Config,
    GPT2Model,
    LlamaConfig,
    LlamaForSequenceClassification,
    LlamaModel,
)

from rlhfkit.models import ScalarModel, freeze
from rlhfkit.models.heads import BIAS_KEY, HEAD_FILE, META_FILE, OFFSET_KEY, SHIFT_KEY
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

HIDDEN = 32
TEXTS = ["ab", "hello world", "x", "12+3=15", "zz top"]


def _llama(tok, seed=0):
    return ScalarModel.from_causal_lm(tiny_causal_lm(tok, hidden_size=HIDDEN, layers=2, heads=4, seed=seed))


def _gpt2(tok, seed=0):
    config = GPT2Config(
        vocab_size=len(tok),
        n_embd=HIDDEN,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    backbone = GPT2Model(config)
    with torch.no_grad():
        backbone.wpe.weight.normal_(std=0.5)  # absolute positions matter: HF must use the same ones
    return ScalarModel(backbone)


def _trained_looking(sm, bias=0.0, offset=0.7, seed=1):
    """A head that is not the init (a trained reward model's bias stays 0; a critic's moves)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sm.head.weight.copy_(torch.randn(sm.head.weight.shape, generator=g) * 0.5)
        if sm.head.bias is not None:
            sm.head.bias.fill_(bias)
    sm.set_offset(offset)
    return freeze(sm)


def _right_padded(tok, texts=TEXTS):
    """Rows of different lengths, each text + EOS by id (as rlhfkit scores them), right-padded."""
    seqs = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
    assert len(set(map(len, seqs))) > 1 and mask.sum(1).lt(width).any()
    return ids, mask, seqs


def _hf(path, **kwargs):
    seq, info = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, output_loading_info=True, **kwargs
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return seq.eval()


# ------------------------------------------------------------------ (1) HF scores == ScalarModel.score


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("bias", [0.0, 0.3], ids=["reward_model", "critic_bias"])
def test_hf_sequence_classification_scores_equal_score_minus_shift(tmp_path, arch, bias):
    tok = char_tokenizer()
    sm = _trained_looking((_llama if arch == "llama" else _gpt2)(tok), bias=bias, offset=0.7)
    sm.save_pretrained(tmp_path / "rm")

    config = json.loads((tmp_path / "rm" / "config.json").read_text())
    expected_arch = {"llama": "LlamaForSequenceClassification", "gpt2": "GPT2ForSequenceClassification"}[arch]
    assert config["architectures"] == [expected_arch] and len(config["id2label"]) == 1  # num_labels = 1
    assert config["pad_token_id"] == tok.pad_token_id != tok.eos_token_id
    assert config[OFFSET_KEY] == pytest.approx(0.7) and config[BIAS_KEY] == pytest.approx(bias)
    # the documented relation: no decoder HF head has a bias, so the offset and the bias are outside it
    assert config[SHIFT_KEY] == float(sm.offset) - float(sm.head.bias)

    hf = _hf(tmp_path / "rm")
    prefix = {"llama": "model.", "gpt2": "transformer."}[arch]
    assert set(hf.state_dict()) == {prefix + k for k in sm.backbone.state_dict()} | {"score.weight"}
    assert torch.equal(hf.score.weight, sm.head.weight) and hf.score.bias is None

    ids, mask, seqs = _right_padded(tok)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits
        scores = sm.score(ids, mask)
        alone = torch.cat([sm.score(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.long)) for s in seqs])
    assert logits.shape == (len(TEXTS), 1)
    torch.testing.assert_close(logits[:, 0] - config[SHIFT_KEY], scores, atol=1e-5, rtol=0)
    torch.testing.assert_close(scores, alone, atol=1e-5, rtol=0)  # both read each row's EOS
    # the shift is real: HF alone is off by offset - bias (0.7 or 0.4), not by rounding
    assert (logits[:, 0] - scores - (0.7 - bias)).abs().max() < 1e-5


def test_pad_equal_to_eos_is_saved_as_null(tmp_path):
    """With pad == EOS HF's "last non-pad token" is the token *before* the final EOS: the saved
    config then has no pad id (batch 1 exact, batches refused) rather than a wrong score."""
    tok = char_tokenizer(pad_is_eos=True)
    sm = _trained_looking(_llama(tok), offset=0.7)
    assert sm.config.pad_token_id == tok.eos_token_id
    with pytest.warns(UserWarning, match="EOS"):
        sm.save_pretrained(tmp_path / "rm")
    assert json.loads((tmp_path / "rm" / "config.json").read_text())["pad_token_id"] is None
    hf = _hf(tmp_path / "rm")
    shift = hf.config.rlhfkit_score_shift

    ids, mask, seqs = _right_padded(tok)
    with torch.no_grad():
        scores = sm.score(ids, mask)
        for i, s in enumerate(seqs):  # one sequence, no padding: HF reads the last token, the EOS
            one = hf(input_ids=torch.tensor([s])).logits[0, 0]
            torch.testing.assert_close(one - shift, scores[i], atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="padding token"):
            hf(input_ids=ids, attention_mask=mask)

        # why: with pad_token_id = EOS, HF scores each row's token before its EOS
        hf.config.pad_token_id = tok.eos_token_id
        wrong = hf(input_ids=ids, attention_mask=mask).logits[:, 0] - shift
        without_eos = torch.cat(
            [sm.score(torch.tensor([s[:-1]]), torch.ones(1, len(s) - 1, dtype=torch.long)) for s in seqs]
        )
    torch.testing.assert_close(wrong, without_eos, atol=1e-5, rtol=0)
    assert (wrong - scores).abs().min() > 1e-4


def test_tokenizer_pad_id_is_the_saved_pad_id(tmp_path):
    tok = char_tokenizer()
    sm = _trained_looking(_llama(tok))
    sm.config.pad_token_id = None  # e.g. Llama 3: no pad id in the model config
    sm.save_pretrained(tmp_path / "rm", tokenizer=tok)
    assert json.loads((tmp_path / "rm" / "config.json").read_text())["pad_token_id"] == tok.pad_token_id
    eos_pad = char_tokenizer(pad_is_eos=True)
    with pytest.warns(UserWarning, match="EOS"):
        sm.save_pretrained(tmp_path / "rm2", tokenizer=eos_pad)
    assert json.loads((tmp_path / "rm2" / "config.json").read_text())["pad_token_id"] is None


# ------------------------------------------------------------------ (2) ScalarModel round trip


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("bias", [0.0, 0.3, None], ids=["reward_model", "critic_bias", "no_bias"])
def test_round_trip_scores_and_values_identical(tmp_path, arch, bias):
    """Both sides frozen: on CPU a parameter's requires_grad alone can move values by ~1e-6
    (another kernel), so identical weights are compared under identical settings."""
    tok = char_tokenizer()
    sm = (_llama if arch == "llama" else _gpt2)(tok)
    if bias is None:
        sm.head = torch.nn.Linear(HIDDEN, 1, bias=False)
    sm = _trained_looking(sm, bias=bias or 0.0, offset=-1.25)
    sm.save_pretrained(tmp_path / "rm")
    loaded = freeze(ScalarModel.from_pretrained(tmp_path / "rm"))
    assert type(loaded.backbone) is type(sm.backbone)
    assert float(loaded.offset) == float(sm.offset)
    assert (loaded.head.bias is None) == (bias is None)
    if bias is not None:
        assert torch.equal(loaded.head.bias, sm.head.bias)
    assert torch.equal(loaded.head.weight, sm.head.weight)
    ids, mask, _ = _right_padded(tok)
    with torch.no_grad():
        assert torch.equal(loaded.score(ids, mask), sm.score(ids, mask))
        assert torch.equal(loaded.values(ids, mask, 3), sm.values(ids, mask, 3))

    # and again (a loaded model saves the same numbers)
    loaded.save_pretrained(tmp_path / "again")
    again = freeze(ScalarModel.from_pretrained(tmp_path / "again"))
    for key in (OFFSET_KEY, BIAS_KEY, SHIFT_KEY):
        assert getattr(again.config, key) == getattr(loaded.config, key)
    with torch.no_grad():
        assert torch.equal(again.score(ids, mask), sm.score(ids, mask))
        assert torch.equal(again.values(ids, mask, 3), sm.values(ids, mask, 3))


# ------------------------------------------------------------------ (3) the older layout still loads


def test_old_scalar_layout_still_loads(tmp_path):
    tok = char_tokenizer()
    sm = _trained_looking(_llama(tok), bias=0.3, offset=0.7)
    old = tmp_path / "old"
    sm.backbone.save_pretrained(old)  # written the old way, by hand
    save_file({k: v.detach().contiguous() for k, v in sm.head.state_dict().items()}, str(old / HEAD_FILE))
    (old / META_FILE).write_text(json.dumps({"hidden_size": HIDDEN, "bias": True, "offset": float(sm.offset)}))
    assert AutoConfig.from_pretrained(old).architectures == ["LlamaModel"]

    loaded = freeze(ScalarModel.from_pretrained(old))
    assert float(loaded.offset) == float(sm.offset)
    ids, mask, _ = _right_padded(tok)
    with torch.no_grad():
        assert torch.equal(loaded.score(ids, mask), sm.score(ids, mask))
        assert torch.equal(loaded.values(ids, mask, 3), sm.values(ids, mask, 3))


def test_backbone_without_sequence_classification_class_falls_back_to_old_layout(tmp_path):
    class OwnLlama(LlamaModel):  # not what AutoModelForSequenceClassification builds
        pass

    tok = char_tokenizer()
    base = _llama(tok).backbone
    own = OwnLlama(base.config)
    own.load_state_dict(base.state_dict())
    sm = _trained_looking(ScalarModel(own), bias=0.3)
    with pytest.warns(UserWarning, match="scalar layout"):
        sm.save_pretrained(tmp_path / "rm")
    assert (tmp_path / "rm" / HEAD_FILE).exists()
    loaded = freeze(ScalarModel.from_pretrained(tmp_path / "rm"))
    ids, mask, _ = _right_padded(tok)
    with torch.no_grad():
        assert torch.equal(loaded.score(ids, mask), sm.score(ids, mask))

    # the HF layout saved over it leaves no stale head file behind
    llama = _trained_looking(_llama(tok), offset=0.2)
    llama.save_pretrained(tmp_path / "rm")
    assert not (tmp_path / "rm" / HEAD_FILE).exists()
    with torch.no_grad():
        assert torch.equal(
            freeze(ScalarModel.from_pretrained(tmp_path / "rm")).score(ids, mask), llama.score(ids, mask)
        )


# ------------------------------------------------------------------ (4) HF needs nothing rlhfkit-only


def test_hf_loading_needs_no_rlhfkit_files(tmp_path):
    tok = char_tokenizer()
    sm = _trained_looking(_llama(tok), offset=0.7)
    sm.save_pretrained(tmp_path / "rm")
    files = sorted(p.name for p in (tmp_path / "rm").iterdir())
    assert files == ["config.json", "model.safetensors", META_FILE]  # no scalar_head.safetensors
    (tmp_path / "rm" / META_FILE).unlink()  # informational only

    hf = _hf(tmp_path / "rm")
    assert type(hf) is LlamaForSequenceClassification
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()  # num_labels from config
    ids, mask, _ = _right_padded(tok)
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask).logits[:, 0]
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits[:, 0], logits)
        torch.testing.assert_close(logits - hf.config.rlhfkit_score_shift, sm.score(ids, mask), atol=1e-5, rtol=0)
        loaded = freeze(ScalarModel.from_pretrained(tmp_path / "rm"))  # rlhfkit needs only config.json either
        assert torch.equal(loaded.score(ids, mask), sm.score(ids, mask))


def test_plain_hf_sequence_classifier_round_trips_its_offset(tmp_path):
    """A directory HF wrote (no rlhfkit keys) loads with offset 0; an offset set here survives saving."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        pad_token_id=0,
        eos_token_id=1,
        num_labels=1,
    )
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "hf")
    sm = ScalarModel.from_pretrained(tmp_path / "hf")
    assert float(sm.offset) == 0.0 and sm.head.bias is None
    sm.set_offset(0.7)
    sm.save_pretrained(tmp_path / "rm")
    loaded = freeze(ScalarModel.from_pretrained(tmp_path / "rm"))
    assert float(loaded.offset) == float(sm.offset) and loaded.head.bias is None
    assert loaded.config.rlhfkit_score_shift == float(sm.offset)
    ids = torch.randint(3, 48, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(loaded.score(ids, mask), sm.score(ids, mask))


# ------------------------------------------------------------------ a head with a bias: the offset is folded in


class _BiasedConfig(LlamaConfig):
    model_type = "rlhfkit_test_biased_llama"


class _BiasedModel(LlamaModel):
    config_class = _BiasedConfig


class _BiasedForSequenceClassification(LlamaForSequenceClassification):
    """A Llama classifier whose score head has a bias (no transformers decoder has one)."""

    config_class = _BiasedConfig

    def __init__(self, config):
        super().__init__(config)
        self.score = torch.nn.Linear(config.hidden_size, config.num_labels, bias=True)


@pytest.fixture(scope="module")
def biased_arch():
    try:
        AutoConfig.register(_BiasedConfig.model_type, _BiasedConfig)
        AutoModel.register(_BiasedConfig, _BiasedModel)
        AutoModelForSequenceClassification.register(_BiasedConfig, _BiasedForSequenceClassification)
    except ValueError:  # already registered in this process
        pass


def test_head_with_bias_folds_the_offset(tmp_path, biased_arch):
    tok = char_tokenizer()
    base = _llama(tok).backbone
    backbone = _BiasedModel(_BiasedConfig(**base.config.to_dict()))
    backbone.load_state_dict(base.state_dict())
    sm = _trained_looking(ScalarModel(backbone), bias=0.3, offset=0.7)
    sm.save_pretrained(tmp_path / "rm")
    hf = _hf(tmp_path / "rm")
    assert type(hf) is _BiasedForSequenceClassification
    assert hf.config.rlhfkit_score_shift == 0.0
    assert hf.score.bias.item() == pytest.approx(0.3 - 0.7)
    ids, mask, _ = _right_padded(tok)
    with torch.no_grad():
        torch.testing.assert_close(
            hf(input_ids=ids, attention_mask=mask).logits[:, 0], sm.score(ids, mask), atol=1e-5, rtol=0
        )
        loaded = freeze(ScalarModel.from_pretrained(tmp_path / "rm"))  # the bias comes back exactly, not re-derived
        assert torch.equal(loaded.head.bias, sm.head.bias) and float(loaded.offset) == float(sm.offset)
        assert torch.equal(loaded.score(ids, mask), sm.score(ids, mask))
        assert torch.equal(loaded.values(ids, mask, 3), sm.values(ids, mask, 3))
