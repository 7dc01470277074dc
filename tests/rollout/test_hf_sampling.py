"""The HF engine samples exactly the distribution the config names and the trainer's log-probs
model: nothing of the model's own ``generation_config.json`` (penalties, n-gram bans, minimum
lengths, banned words, its own top-k) reaches the sampler."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig

from rlhfkit.models import forward_response
from rlhfkit.rollout import HFEngine, SamplingParams
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

# What a model's generation_config.json may say (Qwen2.5-Instruct ships repetition_penalty 1.05).
MEDDLING = dict(
    repetition_penalty=1.8,
    no_repeat_ngram_size=1,
    min_new_tokens=3,
    top_k=3,
    top_p=0.5,
    temperature=0.3,
    bad_words_ids=[[5], [6]],
    suppress_tokens=[7],
    do_sample=False,
    num_beams=1,
)


def _peaked_model(tok):
    """A tiny Llama whose next-token distribution is peaked, so a token often follows itself."""
    model = tiny_causal_lm(tok, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    return model.eval()


def _sample(model, tok, n, sampling, seed=0, seeded=False):
    """``n`` samples of one prompt: from torch's global stream seeded with ``seed``, or (``seeded``)
    from the engine's per-row streams with ``seed`` as the prompt's seed."""
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, share_prompt=False)
    torch.manual_seed(seed)
    return engine.generate(
        [tok("ab", add_special_tokens=False)["input_ids"]], n, sampling, seed=[seed] if seeded else None
    )


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=6, temperature=1.0),
        SamplingParams(max_new_tokens=6, temperature=0.8, top_k=4, top_p=0.9),
        SamplingParams(max_new_tokens=6, greedy=True),
    ],
)
def test_the_models_generation_config_changes_nothing(sampling):
    tok = char_tokenizer()
    plain = _peaked_model(tok)
    meddling = copy.deepcopy(plain)
    meddling.generation_config = GenerationConfig(
        **MEDDLING, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    a, b = _sample(plain, tok, 64, sampling), _sample(meddling, tok, 64, sampling)
    assert torch.equal(a.input_ids, b.input_ids)
    assert meddling.generation_config.no_repeat_ngram_size == 1  # restored after generate


@pytest.mark.parametrize("seeded", [False, True], ids=["global-stream", "per-row-seeds"])
def test_sampled_frequencies_are_the_trainers_distribution(seeded):
    """4,000 two-token samples from one prompt, under a generation config that bans repeats: the
    empirical first-token frequencies and the rate of a token following itself match what the
    trainer's log-probs (``forward_response``) predict — drawn from torch's stream or from the
    per-row seeded streams the trainer uses."""
    tok = char_tokenizer()
    model = _peaked_model(tok)
    model.generation_config = GenerationConfig(**MEDDLING, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    n = 4000
    r = _sample(model, tok, n, SamplingParams(max_new_tokens=2, temperature=1.0), seed=1, seeded=seeded)
    first = r.response_ids[:, 0]
    with torch.no_grad():  # p(a) and p(a | a) for every token a, by the trainer's forward pass
        V = len(tok)
        prompt = r.input_ids[:1, : r.prompt_len].expand(V, -1)
        pairs = torch.cat([prompt, torch.arange(V)[:, None], torch.arange(V)[:, None]], 1)
        lp = forward_response(model, pairs, torch.ones_like(pairs), 2).logprobs
    p_first, p_repeat_given = lp[:, 0].exp(), lp[:, 1].exp()
    freq = torch.bincount(first, minlength=V).float() / n
    assert 0.5 * (freq - p_first).abs().sum() < 0.04  # total variation; ~0.01 expected at n=4000
    continued = r.response_mask[:, 1].bool()  # rows whose first token was not EOS
    repeats = (r.response_ids[:, 1] == first) & continued
    expected = p_repeat_given[first[continued]].mean()
    observed = repeats.sum().float() / continued.sum()
    assert expected > 0.1  # the peaked model repeats itself often: a ban would show
    assert abs(observed - expected) < 0.04


# ----------------------------------------------------------------------------- per-prompt seeds


def _prompts(tok, words=("ab", "cdefg", "h", "abcabc")):
    return [tok(w, add_special_tokens=False)["input_ids"] for w in words]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=8, temperature=1.0),
        SamplingParams(max_new_tokens=8, temperature=0.7, top_k=5, top_p=0.9),
    ],
)
def test_a_seeded_prompt_samples_the_same_whatever_shares_the_batch(sampling):
    """Per-prompt seeds: prompt B's rows are the same tokens (and log-probs) whether B is generated
    with three other prompts — another padding width, other rows beside it — or alone, and the
    global random stream neither matters nor moves."""
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, seed=3).eval()
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, logprobs=True)
    prompts, seeds = _prompts(tok), [11, 22, 33, 44]
    torch.manual_seed(0)
    together = engine.generate(prompts, 3, sampling, seed=seeds)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(1))  # the seeded call drew nothing from the global stream
    torch.manual_seed(1)
    alone = engine.generate(prompts[1:2], 3, sampling, seed=seeds[1:2])
    rows = together.select(torch.arange(3, 6))
    width = int(alone.response_mask.sum(-1).max())
    assert width >= 2
    assert torch.equal(
        rows.response_ids[:, :width] * rows.response_mask[:, :width],
        alone.response_ids[:, :width] * alone.response_mask[:, :width],
    )
    assert torch.equal(rows.response_mask[:, :width], alone.response_mask[:, :width])
    assert not rows.response_mask[:, width:].any()
    torch.testing.assert_close(rows.logprobs[:, :width], alone.logprobs[:, :width], atol=1e-5, rtol=0)
    # Each row draws from its own stream: the three rows of a prompt are not copies of one another.
    assert len({tuple(r) for r in together.response_ids.tolist()}) > 4
    # An int seed s is the per-prompt seeds s + g*n.
    as_int = engine.generate(prompts, 3, sampling, seed=5)
    assert torch.equal(as_int.input_ids, engine.generate(prompts, 3, sampling, seed=[5, 8, 11, 14]).input_ids)


def test_the_sampler_reports_the_log_probs_of_the_distribution_it_drew_from():
    """The engine's log-probs (a generator rank's behaviour policy μ) are the trainer's own
    temperature-scaled log-probs of the same tokens (``forward_response``)."""
    tok = char_tokenizer()
    model = _peaked_model(tok)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id, logprobs=True)
    r = engine.generate(_prompts(tok), 2, SamplingParams(max_new_tokens=6, temperature=0.7), seed=[1, 2, 3, 4])
    with torch.no_grad():
        ref = forward_response(model, r.input_ids, r.attention_mask, r.response_mask.shape[1], temperature=0.7).logprobs
    m = r.response_mask.bool()
    torch.testing.assert_close(r.logprobs[m], ref[m], atol=1e-4, rtol=0)
    assert (r.logprobs[~m] == 0).all()


def test_seeds_must_be_one_per_prompt():
    tok = char_tokenizer()
    engine = HFEngine(tiny_causal_lm(tok, seed=0), tok.pad_token_id, tok.eos_token_id)
    with pytest.raises(ValueError, match="3 seeds for 4 prompts"):
        engine.generate(_prompts(tok), 2, SamplingParams(max_new_tokens=4), seed=[1, 2, 3])
