"""The shared prompt pass of forward_response (prompt_index): each prompt run once for its group gives the
full pass's log-probs, packed groups, under gradient checkpointing, and columns no row attends skipped."""

import pytest
import torch

from rlhfkit.data.padding import pad
from rlhfkit.models import (
    enable_activation_checkpointing,
    forward_response,
)
from rlhfkit.models.lm_head import streamable

from .test_models import HIDDEN, _batch, _model, _tiny_gpt2

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
