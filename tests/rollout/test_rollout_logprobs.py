"""What the rollout's log-probs and masks feed (tests/rollout/test_rollout.py has its layout): the HF
engine's log-probs are the ones forward_response recomputes, and nothing after EOS ever reaches a loss, a
gradient or a token-level reward."""

import pytest
import torch

from rlhfkit.algorithms import pg_loss, ppo_policy_loss, token_level_rewards
from rlhfkit.data.padding import pad
from rlhfkit.models import forward_response
from rlhfkit.rollout import HFEngine, Rollout, SamplingParams, build_rollout
from rlhfkit.rollout.base import response_mask_from_ids

from .test_rollout import EOS, _first_eos_or_last, _model, _prompts, _tokenizer

# ----------------------------------------------------------------------------- log-prob consistency


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("pad_is_eos", [True, False], ids=["pad_is_eos", "distinct_pad"])
@pytest.mark.parametrize("greedy", [False, True], ids=["sampled", "greedy"])
def test_forward_response_matches_generate_logits(pad_is_eos, greedy, arch):
    """The log-probs recomputed for training are those of the sampling distribution: same
    position ids under left padding, same logits column per token, same temperature."""
    temperature = 0.7
    tok = _tokenizer(pad_is_eos)
    model = _model(tok, eos_bias=2.0, seed=3, arch=arch)
    prompts = _prompts(tok)  # lengths 2, 9, 1, 5: heavy left padding
    n = 2
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    sampling = SamplingParams(max_new_tokens=8, temperature=temperature, greedy=greedy)
    ids, mask = pad(prompts, tok.pad_token_id, "left")
    ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=engine.generation_config(sampling),
            output_logits=True,
            return_dict_in_generate=True,
        )
    P = ids.shape[1]
    responses = out.sequences[:, P:]
    T = responses.shape[1]
    logits = torch.stack(out.logits, 1).float()  # raw logits, (B, T, V)
    assert logits.shape[:2] == (len(prompts) * n, T)
    expected = torch.log_softmax(logits / temperature, -1).gather(-1, responses[..., None]).squeeze(-1)

    response_mask, has_eos = response_mask_from_ids(responses, tok.eos_token_id)
    if not greedy:
        assert bool(has_eos.any()), "seed should give at least one early EOS"
    attention = torch.cat([mask, response_mask], 1)
    with torch.no_grad():
        got = forward_response(model, out.sequences, attention, T, temperature=temperature).logprobs
    m = response_mask.bool()
    assert got.shape == (len(prompts) * n, T)
    assert torch.isfinite(got[m]).all()
    torch.testing.assert_close(got[m], expected[m], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_forward_response_matches_engine_rollout_logits(arch):
    """Same, through ``HFEngine.generate``'s own Rollout (its attention mask ends at the EOS),
    against a teacher-forced pass over each row alone, without any padding."""
    temperature = 0.7
    tok = _tokenizer(True)
    model = _model(tok, eos_bias=2.0, seed=5, arch=arch)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    sampling = SamplingParams(max_new_tokens=8, temperature=temperature)
    prompts = _prompts(tok)
    torch.manual_seed(7)
    r = engine.generate(prompts, 2, sampling)
    T = r.response_mask.shape[1]
    # Teacher-forced reference: one token at a time with the prompt's own positions.
    with torch.no_grad():
        got = forward_response(model, r.input_ids, r.attention_mask, T, temperature=temperature).logprobs
        ref = torch.zeros_like(got)
        for i in range(r.input_ids.shape[0]):
            real = r.input_ids[i][r.attention_mask[i].bool()]  # prompt + response up to EOS, no padding
            plen = int(r.attention_mask[i, : r.prompt_len].sum())
            logits = model(input_ids=real[None]).logits[0].float() / temperature
            logp = torch.log_softmax(logits, -1)
            n_resp = int(r.response_mask[i].sum())
            for t in range(n_resp):
                ref[i, t] = logp[plen + t - 1, real[plen + t]]
    m = r.response_mask.bool()
    torch.testing.assert_close(got[m], ref[m], atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- no gradient after EOS


def _gradient_rollout():
    """Prompts of different lengths; rows that end early (EOS then pad = EOS), one truncated row."""
    prompts = [[5, 6, 7], [8, 9]]
    responses = [[10, 11, 1], [12, 13, 14, 15, 16], [17, 1], [18, 19, 20, 1]]
    return build_rollout(prompts, responses, n=2, pad_id=EOS, eos_id=EOS)


def _loss_and_grads(model, rollout, old, adv, loss_name):
    model.zero_grad(set_to_none=True)
    T = rollout.response_mask.shape[1]
    out = forward_response(model, rollout.input_ids, rollout.attention_mask, T, temperature=0.7)
    logprobs = out.logprobs
    logprobs.retain_grad()
    mask = rollout.response_mask
    if loss_name == "ppo":
        loss, _ = ppo_policy_loss(logprobs, old, adv, mask, agg="token-mean")
    else:
        loss, _ = pg_loss(logprobs, old, adv, mask, agg="seq-mean-token-sum")
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), logprobs.grad.detach().clone(), grads


@pytest.mark.parametrize("loss_name", ["ppo", "pg"])
def test_tokens_after_eos_get_no_gradient(loss_name):
    tok = _tokenizer(True)
    model = _model(tok, seed=1).train()
    r = _gradient_rollout()
    mask = r.response_mask.bool()
    assert r.has_eos.tolist() == [True, False, True, True]
    B, T = mask.shape
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(B, T, generator=g)
    with torch.no_grad():
        base = forward_response(model, r.input_ids, r.attention_mask, T, temperature=0.7).logprobs
    old = base + 0.05 * torch.randn(B, T, generator=g)

    loss, lp_grad, grads = _loss_and_grads(model, r, old, adv, loss_name)
    assert torch.isfinite(loss)
    assert (lp_grad[~mask] == 0).all(), lp_grad
    assert (lp_grad[mask] != 0).any()
    assert grads and all(torch.isfinite(v).all() for v in grads.values())

    # Replace every token after the first EOS by other ids: nothing observable may change.
    ids = r.input_ids.clone()
    resp = ids[:, r.prompt_len :]
    after = ~mask
    resp[after] = torch.randint(20, 40, (int(after.sum()),), generator=g)
    assert not torch.equal(ids, r.input_ids)
    changed = Rollout(ids, r.attention_mask, r.response_mask, r.has_eos, r.prompt_len)
    loss2, lp_grad2, grads2 = _loss_and_grads(model, changed, old, adv, loss_name)
    torch.testing.assert_close(loss2, loss, atol=1e-6, rtol=1e-6)
    assert (lp_grad2[~mask] == 0).all()
    assert grads2.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_token_level_rewards_on_hand_built_rollout():
    r = _gradient_rollout()  # first EOS at 2, truncated (T=5), EOS at 1, EOS at 3
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rewards = token_level_rewards(scores, None, r.response_mask, 0.0)
    expected = torch.zeros(4, 5)
    expected[0, 2], expected[1, 4], expected[2, 1], expected[3, 3] = 1.0, 2.0, 3.0, 4.0
    assert torch.equal(rewards, expected)

    kl = torch.ones(4, 5)
    shaped = token_level_rewards(scores, kl, r.response_mask, kl_coef=0.1)
    expected_kl = -0.1 * r.response_mask.float() + expected
    torch.testing.assert_close(shaped, expected_kl)
    assert (shaped[r.response_mask == 0] == 0).all()


def test_token_level_rewards_on_generated_rollout():
    tok = _tokenizer(True)
    model = _model(tok, eos_bias=2.5)
    engine = HFEngine(model, tok.pad_token_id, tok.eos_token_id)
    torch.manual_seed(0)
    r = engine.generate(_prompts(tok), 4, SamplingParams(max_new_tokens=10))
    assert bool(r.has_eos.any()) and bool((~r.has_eos).any())
    B, T = r.response_mask.shape
    scores = torch.arange(1, B + 1, dtype=torch.float32)
    rewards = token_level_rewards(scores, None, r.response_mask, 0.0)
    where = _first_eos_or_last(r.response_ids, tok.eos_token_id)
    expected = torch.zeros(B, T)
    expected[torch.arange(B), where] = scores
    assert torch.equal(rewards, expected)
    for i in range(B):
        pos = int(where[i])
        if bool(r.has_eos[i]):
            assert r.response_ids[i, pos] == tok.eos_token_id
        else:
            assert pos == T - 1
