"""Rollout layout and masking: the response mask is built from the *position* of the first EOS
(pad may equal EOS), the HF engine's batches obey the layout, its log-probs are the ones
``forward_response`` recomputes, and nothing after EOS ever reaches a loss or a gradient."""

import pytest
import torch
import transformers

from rlhfkit.data.padding import pad
from rlhfkit.rollout import HFEngine, Rollout, SamplingParams, build_rollout
from rlhfkit.rollout.base import response_mask_from_ids
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

transformers.utils.logging.disable_progress_bar()

EOS = 1  # char_tokenizer: <pad>=0, <eos>=1, <unk>=2, then the alphabet from 3
PAD_DISTINCT = 0


# ----------------------------------------------------------------------------- helpers


def _tokenizer(pad_is_eos: bool):
    tok = char_tokenizer(pad_is_eos=pad_is_eos)
    assert tok.eos_token_id == EOS
    assert tok.pad_token_id == (EOS if pad_is_eos else PAD_DISTINCT)
    return tok


def _tiny_gpt2(tok, seed: int):
    """GPT-2 has *absolute* position embeddings: unlike Llama's RoPE (invariant to shifting every
    position by the left-padding width) it only gives matching log-probs if position ids skip the
    padding exactly as ``generate`` numbers them."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=128,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():  # random init is near-uniform; sharpen it so positions visibly matter
        model.transformer.wpe.weight.normal_(std=0.5)
    return model


def _model(tok, eos_bias: float = 0.0, seed: int = 0, arch: str = "llama"):
    """A tiny random Llama (or GPT-2) in eval mode; ``eos_bias`` adds to the EOS logit (an untied
    head with a bias) so that sampled completions end early often enough to exercise the masks."""
    if arch == "gpt2":
        model = _tiny_gpt2(tok, seed)
    else:
        model = tiny_causal_lm(tok, hidden_size=32, layers=2, heads=4, seed=seed)
    if eos_bias:
        old = model.lm_head
        head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
        with torch.no_grad():
            head.weight.copy_(old.weight)
            head.bias.zero_()
            head.bias[tok.eos_token_id] = eos_bias
        model.lm_head = head
    return model.eval()


def _prompts(tok):
    texts = ["ab", "hello wor", "x", "12+3="]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _first_eos_or_last(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Hand-rolled reference: index of the first EOS, or T-1 when there is none."""
    T = responses.shape[1]
    out = []
    for row in responses.tolist():
        out.append(row.index(eos_id) if eos_id in row else T - 1)
    return torch.tensor(out)


# ----------------------------------------------------------------------------- response_mask_from_ids


def test_response_mask_pad_equals_eos_hand_typed():
    responses = torch.tensor(
        [
            [5, 6, 1, 1, 1],  # ended early: EOS then pads that are the same id
            [5, 6, 7, 8, 9],  # truncated: no EOS at all
            [1, 1, 1, 1, 1],  # EOS at position 0 (and pads = EOS after it)
            [1, 5, 6, 7, 8],  # EOS at position 0, followed by other ids
            [5, 6, 7, 8, 1],  # EOS on the very last position
            [5, 1, 5, 1, 5],  # several EOS: only the first counts
        ]
    )
    mask, has_eos = response_mask_from_ids(responses, EOS)
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1],
            [1, 0, 0, 0, 0],
            [1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1],
            [1, 1, 0, 0, 0],
        ]
    )
    assert torch.equal(mask, expected)
    assert mask.dtype == torch.long
    assert has_eos.dtype == torch.bool
    assert has_eos.tolist() == [True, False, True, True, True, True]


def test_response_mask_distinct_pad_hand_typed():
    responses = torch.tensor(
        [
            [5, 1, 0, 0],
            [5, 6, 7, 8],
            [1, 0, 0, 0],
        ]
    )
    mask, has_eos = response_mask_from_ids(responses, EOS)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert has_eos.tolist() == [True, False, True]


def test_response_mask_single_column():
    mask, has_eos = response_mask_from_ids(torch.tensor([[1], [7]]), EOS)
    assert mask.tolist() == [[1], [1]]
    assert has_eos.tolist() == [True, False]


# ----------------------------------------------------------------------------- build_rollout


@pytest.mark.parametrize("pad_id", [EOS, PAD_DISTINCT], ids=["pad_is_eos", "distinct_pad"])
def test_build_rollout_layout(pad_id):
    prompts = [[5, 6, 7], [8, 9]]
    responses = [[10, 1], [11, 12, 13], [1], [14, 15, 1]]
    r = build_rollout(prompts, responses, n=2, pad_id=pad_id, eos_id=EOS)
    p = pad_id
    assert r.prompt_len == 3
    assert r.input_ids.tolist() == [
        [5, 6, 7, 10, 1, p],
        [5, 6, 7, 11, 12, 13],
        [p, 8, 9, 1, p, p],
        [p, 8, 9, 14, 15, 1],
    ]
    # rows g*n .. g*n+n-1 share prompt g
    assert torch.equal(r.input_ids[0, :3], r.input_ids[1, :3])
    assert torch.equal(r.input_ids[2, :3], r.input_ids[3, :3])
    assert r.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]]
    assert r.has_eos.tolist() == [True, False, True, True]
    prompt_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]])
    assert torch.equal(r.attention_mask, torch.cat([prompt_mask, r.response_mask], 1))
    assert torch.equal(r.response_ids, r.input_ids[:, 3:])


def test_build_rollout_repeats_prompts_consecutively():
    prompts = [[5], [6, 7], [8, 9, 10]]
    n = 3
    responses = [[20 + i, EOS] for i in range(len(prompts) * n)]
    r = build_rollout(prompts, responses, n=n, pad_id=PAD_DISTINCT, eos_id=EOS)
    ids, mask = pad(prompts, PAD_DISTINCT, "left")
    for g in range(len(prompts)):
        for j in range(n):
            assert torch.equal(r.input_ids[g * n + j, : r.prompt_len], ids[g])
            assert torch.equal(r.attention_mask[g * n + j, : r.prompt_len], mask[g])
            assert r.input_ids[g * n + j, r.prompt_len] == 20 + g * n + j


def test_build_rollout_select_keeps_rows():
    r = build_rollout([[5, 6], [7]], [[10, 1], [11, 12], [1], [13, 1]], n=2, pad_id=EOS, eos_id=EOS)
    rows = torch.tensor([3, 0])
    s = r.select(rows)
    assert isinstance(s, Rollout)
    assert s.prompt_len == r.prompt_len
    for name in ("input_ids", "attention_mask", "response_mask", "has_eos"):
        assert torch.equal(getattr(s, name), getattr(r, name)[rows])


@pytest.mark.parametrize("count", [3, 5, 0])
def test_build_rollout_wrong_number_of_completions(count):
    with pytest.raises(ValueError, match="completions"):
        build_rollout([[5, 6], [7]], [[10, 1]] * count, n=2, pad_id=EOS, eos_id=EOS)


@pytest.mark.parametrize("pad_id", [EOS, PAD_DISTINCT], ids=["pad_is_eos", "distinct_pad"])
def test_build_rollout_empty_completion_has_no_eos(pad_id):
    """An engine that returns no token for a completion: nothing is masked in, and it did not emit
    EOS — whatever the pad id is (the pad filler must never be read as an EOS)."""
    r = build_rollout([[5, 6]], [[], [10, 11, 1]], n=2, pad_id=pad_id, eos_id=EOS)
    assert r.response_mask.tolist() == [[0, 0, 0], [1, 1, 1]]
    assert r.attention_mask[0, r.prompt_len :].tolist() == [0, 0, 0]
    assert r.has_eos.tolist() == [False, True]


@pytest.mark.parametrize("pad_id", [EOS, PAD_DISTINCT], ids=["pad_is_eos", "distinct_pad"])
def test_build_rollout_short_completion_without_eos(pad_id):
    """A completion that stopped without EOS (a stop string, or an engine that strips EOS) and is
    shorter than the longest one: the right-padding filler is not part of the response — it must
    not be masked in (distinct pad) nor read as an EOS (pad == EOS)."""
    r = build_rollout([[5, 6]], [[10], [11, 12, 1]], n=2, pad_id=pad_id, eos_id=EOS)
    assert r.response_mask.tolist() == [[1, 0, 0], [1, 1, 1]]
    assert r.has_eos.tolist() == [False, True]


# ----------------------------------------------------------------------------- HFEngine.generate


@pytest.mark.parametrize("pad_is_eos", [True, False], ids=["pad_is_eos", "distinct_pad"])
def test_hf_engine_generate_layout_and_masks(pad_is_eos):
    tok = _tokenizer(pad_is_eos)
    model = _model(tok, eos_bias=2.5)
    prompts = _prompts(tok)
    n, max_new = 4, 10
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    torch.manual_seed(0)
    r = engine.generate(prompts, n, SamplingParams(max_new_tokens=max_new, temperature=1.0))

    B, P = len(prompts) * n, max(len(p) for p in prompts)
    T = r.response_mask.shape[1]
    assert 1 <= T <= max_new
    assert r.prompt_len == P
    assert r.input_ids.shape == (B, P + T)
    assert r.attention_mask.shape == (B, P + T)
    assert r.has_eos.shape == (B,) and r.has_eos.dtype == torch.bool

    ids, mask = pad(prompts, tok.pad_token_id, "left")
    assert torch.equal(r.input_ids[:, :P], ids.repeat_interleave(n, 0))
    assert torch.equal(r.attention_mask, torch.cat([mask.repeat_interleave(n, 0), r.response_mask], 1))

    expected_mask, expected_eos = response_mask_from_ids(r.response_ids, tok.eos_token_id)
    for i in range(B):
        row = r.response_ids[i : i + 1]
        m, e = response_mask_from_ids(row, tok.eos_token_id)
        assert torch.equal(r.response_mask[i], m[0]), f"row {i}: {row.tolist()}"
        assert bool(r.has_eos[i]) == bool(e[0])
    assert torch.equal(r.response_mask, expected_mask)
    assert torch.equal(r.has_eos, expected_eos)

    # the seed gives both kinds of completion: some end early, some are cut at the limit
    assert bool(r.has_eos.any()) and bool((~r.has_eos).any()), r.response_ids.tolist()
    assert T == max_new  # a truncated row runs to the limit
    for i in torch.nonzero(~r.has_eos).flatten().tolist():
        assert r.response_mask[i].tolist() == [1] * T
        assert tok.eos_token_id not in r.response_ids[i].tolist()
    for i in torch.nonzero(r.has_eos).flatten().tolist():
        ids_i = r.response_ids[i].tolist()
        first = ids_i.index(tok.eos_token_id)
        assert r.response_mask[i].tolist() == [1] * (first + 1) + [0] * (T - first - 1)
        # generate fills the rest with the pad id
        assert all(t == tok.pad_token_id for t in ids_i[first + 1 :])


def test_hf_engine_distinct_pad_fills_after_eos_with_pad():
    tok = _tokenizer(pad_is_eos=False)
    model = _model(tok, eos_bias=2.5)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    torch.manual_seed(1)
    r = engine.generate(_prompts(tok), 3, SamplingParams(max_new_tokens=8))
    resp = r.response_ids
    # positions masked out are exactly the pad-filled ones after the first EOS
    assert bool((r.response_mask == 0).any())
    assert torch.equal(resp[r.response_mask == 0], torch.full_like(resp[r.response_mask == 0], PAD_DISTINCT))


@pytest.mark.parametrize("pad_is_eos", [True, False], ids=["pad_is_eos", "distinct_pad"])
def test_hf_engine_greedy_identical_within_group(pad_is_eos):
    tok = _tokenizer(pad_is_eos)
    model = _model(tok)
    prompts = _prompts(tok)
    n = 3
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    r = engine.generate(prompts, n, SamplingParams(max_new_tokens=6, greedy=True))
    for g in range(len(prompts)):
        rows = r.input_ids[g * n : g * n + n]
        assert (rows == rows[0]).all(), rows.tolist()
        masks = r.response_mask[g * n : g * n + n]
        assert (masks == masks[0]).all()
    # greedy is deterministic: a second call gives the same batch
    r2 = engine.generate(prompts, n, SamplingParams(max_new_tokens=6, greedy=True))
    assert torch.equal(r.input_ids, r2.input_ids)


def test_hf_engine_restores_training_mode():
    tok = _tokenizer(True)
    model = _model(tok).train()
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    engine.generate([[5, 6]], 2, SamplingParams(max_new_tokens=3))
    assert model.training
    model.eval()
    engine.generate([[5, 6]], 2, SamplingParams(max_new_tokens=3))
    assert not model.training


@pytest.mark.parametrize("max_new", [0, -1])
def test_hf_engine_rejects_non_positive_max_new_tokens(max_new):
    tok = _tokenizer(True)
    engine = HFEngine(_model(tok), tok.pad_token_id, tok.eos_token_id)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[5, 6]], 2, SamplingParams(max_new_tokens=max_new))


def test_hf_engine_generation_config_honours_sampling_params():
    tok = _tokenizer(True)
    engine = HFEngine(_model(tok), tok.pad_token_id, tok.eos_token_id)
    cfg = engine.generation_config(SamplingParams(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=0))
    assert cfg.do_sample and cfg.max_new_tokens == 7
    assert cfg.temperature == 0.7 and cfg.top_p == 0.9 and not cfg.top_k
    assert cfg.eos_token_id == EOS and cfg.pad_token_id == EOS
    assert not engine.generation_config(SamplingParams(greedy=True)).do_sample


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hf_engine_shared_prompt_cache_samples_the_same(arch):
    """Encoding each prompt once and repeating its cache for the n rows gives the same samples (same
    seed) as encoding the n repeated prompts, and fills ``prompt_index`` with each row's prompt."""
    tok = _tokenizer(True)
    model = _model(tok, eos_bias=1.5, arch=arch)
    prompts = _prompts(tok)
    outs = []
    for share in (False, True):
        torch.manual_seed(3)
        outs.append(
            HFEngine(model, tok.pad_token_id, tok.eos_token_id, share).generate(
                prompts, 3, SamplingParams(max_new_tokens=6, temperature=1.0)
            )
        )
    assert torch.equal(outs[0].input_ids, outs[1].input_ids)
    assert torch.equal(outs[0].response_mask, outs[1].response_mask)
    for r in outs:
        assert r.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
        assert r.select(torch.tensor([4, 9])).prompt_index.tolist() == [1, 3]
