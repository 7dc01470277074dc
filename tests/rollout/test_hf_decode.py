"""The HF engine's decode modes (``HFEngine(decode=...)``) sample what ``generate`` samples: the
engine's own loop (``rollout.decode``: a cache allocated once, finished rows dropped) and
transformers' static cache give the same tokens for the same seeds, the same masks, the same
log-probs up to float rounding — sampling with temperature, top-k, top-p, min-p and the
repetition penalty (which reads each row's tokens so far), greedy, with and
without a shared prompt cache, rows ending at different steps, models with several EOS ids —, and
greedy decoding is ``model.generate``'s own."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models import efficiency
from rlhfkit.rollout import HFEngine, SamplingParams
from rlhfkit.rollout.cache import decode_cache
from rlhfkit.tasks.tiny import char_tokenizer, chatml_tokenizer, tiny_causal_lm, tiny_turn_end_lm

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SAMPLINGS = [
    SamplingParams(max_new_tokens=14, temperature=1.0),
    SamplingParams(max_new_tokens=14, temperature=0.7, top_k=6, top_p=0.9),
    SamplingParams(max_new_tokens=14, greedy=True),
    SamplingParams(max_new_tokens=14, temperature=0.8, top_p=0.95, min_p=0.05, repetition_penalty=1.3),
]
IDS = ["t1", "t0.7-topk-topp", "greedy", "minp-repetition-penalty"]


def _ending_model(tok, end_ids, bias: float = 2.5, seed: int = 3):
    """A tiny Llama with a peaked head and a bias of ``bias`` on each of ``end_ids``: its rows end
    after a few tokens, each at its own step."""
    model = tiny_causal_lm(tok, seed=seed)
    old = model.lm_head
    head = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight * 3.0)
        head.bias.zero_()
        for i in end_ids:
            head.bias[i] = bias
    model.lm_head = head
    model.config.tie_word_embeddings = False
    return model.eval()


def _prompts(tok, words=("ab", "cdefg", "hi", "abcabc")):
    """Left-padded prompts of 2+ tokens: with ``share_prompt`` every prompt's prefix is shared."""
    return [tok(w, add_special_tokens=False)["input_ids"] for w in words]


def _run(model, tok, decode, prompts, n, sampling, seed, share_prompt=True):
    engine = HFEngine(
        model, tok.pad_token_id, tok.eos_token_id, share_prompt=share_prompt, logprobs=True, decode=decode
    )
    return engine.generate(prompts, n, sampling, seed=seed)


def _assert_same(a, b, atol=1e-5):
    assert a.input_ids.shape == b.input_ids.shape
    assert torch.equal(a.input_ids, b.input_ids)
    assert torch.equal(a.attention_mask, b.attention_mask)
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.has_eos, b.has_eos)
    assert a.prompt_len == b.prompt_len and torch.equal(a.prompt_index, b.prompt_index)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=atol, rtol=0)


@pytest.mark.parametrize("share_prompt", [True, False], ids=["shared-prompt", "own-prompt"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=IDS)
@pytest.mark.parametrize("decode", ["loop", "static"])
def test_a_decode_mode_samples_what_generate_samples(decode, sampling, share_prompt):
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id])
    prompts, seeds = _prompts(tok), [11, 22, 33, 44]
    want = _run(model, tok, "generate", prompts, 4, sampling, seeds, share_prompt)
    got = _run(model, tok, decode, prompts, 4, sampling, seeds, share_prompt)
    _assert_same(want, got)
    lengths = want.response_mask.sum(-1)
    # the case the loop exists for: rows end at different steps, some before the limit
    assert want.has_eos.any() and len(set(lengths.tolist())) >= (2 if sampling.greedy else 4)
    assert not want.has_eos.all() or int(lengths.max()) < sampling.max_new_tokens


@pytest.mark.parametrize("decode", ["loop", "static"])
def test_greedy_is_model_generate(decode):
    """Greedy decoding gives ``model.generate(do_sample=False)``'s tokens, left padding and all."""
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id], bias=2.0, seed=0)  # rows of 5, 8, 12, 12 tokens
    prompts = _prompts(tok)
    r = _run(model, tok, decode, prompts, 1, SamplingParams(max_new_tokens=12, greedy=True), None, share_prompt=False)
    ids, mask = r.input_ids[:, : r.prompt_len], r.attention_mask[:, : r.prompt_len]
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=12,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    assert torch.equal(r.input_ids, ref)
    assert r.has_eos.any() and not r.has_eos.all()


@pytest.mark.parametrize("sampling", SAMPLINGS[:2], ids=IDS[:2])
def test_several_eos_ids_end_rows_in_the_loop_as_in_generate(sampling):
    """A Gemma-2-like model (``<eos>`` and ``<|im_end|>`` both end a turn): the loop drops a row at
    either, as ``generate`` stops at either."""
    tok = chatml_tokenizer(eos_token="<eos>")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    model = tiny_turn_end_lm(tok, seed=1, end_bias=2.0).eval()
    with torch.no_grad():
        model.lm_head.bias[tok.eos_token_id] = 2.0
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("hello", "12+3=", "x")]
    want = _run(model, tok, "generate", prompts, 6, sampling, [5, 6, 7])
    got = _run(model, tok, "loop", prompts, 6, sampling, [5, 6, 7])
    _assert_same(want, got)
    last = want.response_ids.gather(1, (want.response_mask.sum(-1, keepdim=True) - 1))[:, 0]
    assert {tok.eos_token_id, eot} <= set(last[want.has_eos].tolist())  # rows ended by each


def test_the_loop_drops_finished_rows_and_counts_what_it_ran():
    """The batch of each decode step holds only the rows still running, and the efficiency
    counters count those positions: fewer than generate's, the same needed ones."""
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id])
    prompts, seeds, sampling = _prompts(tok), [1, 2, 3, 4], SAMPLINGS[0]
    rows = []
    hook = model.model.register_forward_pre_hook(
        lambda m, args, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    counts = {}
    try:
        for decode in ("generate", "loop"):
            rows.clear()
            efficiency.reset()
            with efficiency.counting("generate"):
                r = _run(model, tok, decode, prompts, 4, sampling, seeds)
            counts[decode] = ((efficiency._computed["generate"], int(efficiency._needed["generate"])), list(rows))
    finally:
        hook.remove()
        efficiency.reset()
    loop_rows = counts["loop"][1]
    assert loop_rows[0] == 4 and loop_rows[1] == 16  # the shared prefix per prompt, then every row's last token
    steps = loop_rows[2:]
    assert steps == sorted(steps, reverse=True) and steps[-1] < 16  # finished rows left the batch
    assert set(counts["generate"][1][2:]) == {16}  # generate runs every row to the end
    assert len(steps) == r.response_mask.shape[1] - 1
    assert steps == [int((r.response_mask[:, s + 1]).sum()) for s in range(len(steps))]
    (loop_computed, loop_needed), (gen_computed, gen_needed) = counts["loop"][0], counts["generate"][0]
    assert loop_needed == gen_needed
    assert loop_computed == 4 * (r.prompt_len - 1) + 16 + sum(steps) < gen_computed


@pytest.mark.parametrize("decode", ["loop", "static"])
def test_the_shared_prompt_is_encoded_once_per_prompt(decode):
    """With ``share_prompt`` the first model call encodes each prompt's prefix once (4 rows), the
    next one only every row's last prompt token, as the ``generate`` path does."""
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id])
    shapes = []
    hook = model.model.register_forward_pre_hook(
        lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        r = _run(model, tok, decode, _prompts(tok), 4, SAMPLINGS[0], [1, 2, 3, 4])
    finally:
        hook.remove()
    assert shapes[:2] == [(4, r.prompt_len - 1), (16, 1)]
    assert all(s[1] == 1 for s in shapes[1:])


@pytest.mark.parametrize("sampling", SAMPLINGS[:2], ids=IDS[:2])
def test_unseeded_sampling_keeps_every_row_and_draws_what_generate_draws(sampling):
    """Without seeds both draw one ``torch.multinomial`` over the batch from torch's global stream:
    the loop then keeps finished rows (as ``generate``), so the same global seed gives the same
    tokens. (A one-token prompt: nothing to share, every row encodes its prompt.)"""
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id])
    out = {}
    for decode in ("generate", "loop"):
        torch.manual_seed(7)
        out[decode] = _run(model, tok, decode, _prompts(tok, ("ab", "cdefg", "h", "abcabc")), 3, sampling, None)
    _assert_same(out["generate"], out["loop"])
    assert out["loop"].has_eos.any()


def test_a_seeded_prompt_samples_the_same_alone_in_the_loop():
    """Rows leaving the batch change nothing for the others: a prompt sampled with three others
    gives the tokens it gives alone."""
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id])
    prompts, seeds = _prompts(tok), [11, 22, 33, 44]
    together = _run(model, tok, "loop", prompts, 3, SAMPLINGS[1], seeds)
    alone = _run(model, tok, "loop", prompts[1:2], 3, SAMPLINGS[1], seeds[1:2])
    rows = together.select(torch.arange(3, 6))
    width = alone.response_mask.shape[1]
    assert torch.equal(
        rows.response_ids[:, :width] * rows.response_mask[:, :width], alone.response_ids * alone.response_mask
    )
    assert torch.equal(rows.response_mask[:, :width], alone.response_mask)


def test_the_decode_cache_grows_in_place_and_drops_rows():
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, seed=0)
    cache = decode_cache(model, capacity=5)
    layer = cache.layers[0]
    k = torch.randn(3, 4, 2, 16)
    keys, _ = layer.update(k, k + 1)
    buffer = layer.key_buffer.data_ptr()
    keys, values = layer.update(k[:, :, :1] * 2, k[:, :, :1])
    assert layer.key_buffer.data_ptr() == buffer and layer.get_seq_length() == 3  # written in place
    assert torch.equal(keys, torch.cat([k, k[:, :, :1] * 2], 2))
    layer.batch_select_indices(torch.tensor([0, 2]))
    assert torch.equal(layer.keys, torch.cat([k, k[:, :, :1] * 2], 2)[[0, 2]])
    with pytest.raises(RuntimeError, match="capacity of 5"):
        layer.update(torch.randn(2, 4, 3, 16), torch.randn(2, 4, 3, 16))


def test_an_unknown_decode_mode_is_refused():
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="one of loop, generate, static"):
        HFEngine(tiny_causal_lm(tok), tok.pad_token_id, tok.eos_token_id, decode="fast")


def test_greedy_with_a_repetition_penalty_is_model_generate():
    """CTRL's penalty on the prompt's and the completion's tokens so far, left padding included, as
    ``generate`` applies it (also in greedy decoding); without it the tokens differ."""
    tok = char_tokenizer()
    model = _ending_model(tok, [tok.eos_token_id], bias=2.0, seed=0)
    prompts = _prompts(tok)
    sampling = SamplingParams(max_new_tokens=12, greedy=True, repetition_penalty=3.0)
    r = _run(model, tok, "loop", prompts, 1, sampling, None, share_prompt=False)
    ids, mask = r.input_ids[:, : r.prompt_len], r.attention_mask[:, : r.prompt_len]
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, repetition_penalty=3.0,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    assert torch.equal(r.input_ids, ref)
    plain = _run(model, tok, "loop", prompts, 1, SamplingParams(max_new_tokens=12, greedy=True), None, False)
    assert not torch.equal(plain.input_ids, r.input_ids)


def test_min_p_leaves_out_the_unlikely_tokens():
    """Every token drawn with min_p=0.3 has at least 0.3 x the probability of the most likely one."""
    tok = char_tokenizer()
    model = _ending_model(tok, [], seed=2)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, min_p=0.3)
    r = _run(model, tok, "loop", _prompts(tok), 4, sampling, [1, 2, 3, 4], share_prompt=False)
    with torch.no_grad():
        logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask).logits[:, r.prompt_len - 1 : -1]
    probs = logits.float().softmax(-1)
    drawn = probs.gather(-1, r.response_ids[..., None])[..., 0]
    assert (drawn >= 0.3 * probs.max(-1).values - 1e-6)[r.response_mask.bool()].all()
