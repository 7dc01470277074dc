"""SFT's per-token losses (``algorithms/sft_losses.py``) against values computed by hand."""

import math

import pytest
import torch

from rlhfkit.algorithms import SFT_LOSS_TYPES, sft_token_loss


def test_nll_is_minus_the_log_probability():
    logprobs = torch.tensor([math.log(0.5), math.log(0.25)], requires_grad=True)
    loss = sft_token_loss(logprobs, "nll")
    assert loss.tolist() == pytest.approx([math.log(2), math.log(4)])
    loss.sum().backward()
    assert logprobs.grad.tolist() == [-1.0, -1.0]


def test_dft_weights_each_token_by_its_probability_held_constant():
    # Wu et al. 2025 (arXiv:2508.05629): -sg(p) log p. p = 1/2 and 1/4: 0.5 ln 2 and 0.25 ln 4
    logprobs = torch.tensor([math.log(0.5), math.log(0.25)], requires_grad=True)
    loss = sft_token_loss(logprobs, "dft")
    assert loss.tolist() == pytest.approx([0.5 * math.log(2), 0.25 * math.log(4)])
    loss.sum().backward()
    # the weight is a constant: d/d(log p) of -sg(p) log p is -p (the gradient of -p itself through log p)
    assert logprobs.grad.tolist() == pytest.approx([-0.5, -0.25])


def test_dft_of_a_uniform_two_token_vocabulary_is_half_the_cross_entropy():
    # TRL's own check: with two equally likely tokens every p is 1/2, so DFT is the cross-entropy / 2
    logits = torch.zeros(5, 2)
    targets = torch.tensor([1, 0, 0, 1, 0])
    logprobs = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    assert torch.allclose(sft_token_loss(logprobs, "dft"), ce / 2)


def test_an_unknown_loss_type_is_one_line():
    assert SFT_LOSS_TYPES == ("nll", "dft")
    with pytest.raises(ValueError, match=r"^loss_type must be one of nll, dft, got 'mse'$"):
        sft_token_loss(torch.zeros(2), "mse")


def test_is_top1_reads_the_argmax_from_the_top1_kept_mass():
    from rlhfkit.algorithms import is_top1, log_kept_mass

    logits = torch.tensor([[2.0, 1.0, 0.0], [2.0, 1.0, 0.0], [0.0, 3.0, 3.0], [5.0, 0.0, 4.999]])
    targets = torch.tensor([0, 1, 2, 0])
    logprobs = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    kept = log_kept_mass(logits, targets, top_k=1)
    # the argmax; not it; tied with the argmax (counted not top-1, as argmax picks the first); by a hair
    assert is_top1(logprobs, kept).tolist() == [True, False, False, True]
