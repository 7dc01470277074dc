"""The streamed LM head (``algorithms.linear_logprobs``, ``models.lm_head``): the same log-probs,
entropies, kept mass and gradients as the model's own logits, for tied and untied heads, a head with a
bias, float32 and bf16, packed and unpacked rows, LoRA and the SFT loss; heads it cannot stream run
unstreamed; and no tensor of tokens × vocabulary exists, forward or backward."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM

from rlhfkit.algorithms import entropy_from_logits, log_kept_mass, selective_logprobs
from rlhfkit.algorithms.linear_logprobs import linear_logprobs
from rlhfkit.models import forward_response
from rlhfkit.models.lm_head import streamable, streamed_forward

VOCAB = 61


def _llama(tied=True, bias=False, vocab=VOCAB, hidden=32, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config)
    if bias:  # an untied head with a bias (as tiny_turn_end_lm builds)
        head = torch.nn.Linear(hidden, vocab, bias=True)
        torch.nn.init.normal_(head.bias, std=1.0)
        model.lm_head = head
    return model.to(dtype).eval()


def _rows(B=4, P=5, T=6, vocab=VOCAB, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (B, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    mask[2, P + T - 2 :] = 0  # a shorter response
    return ids, mask


def _both(model, fn):
    """``fn(lm_head)`` streamed, then with ``lm_head='full'``: (outputs, parameter gradients) of each."""
    results = []
    for mode in ("chunked", "full"):
        model.zero_grad()
        out = fn(mode)
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    return results


def _close(a, b, atol, rtol=1e-4):
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


# ----------------------------------------------------------------------------- the formula


def test_linear_logprobs_equals_the_logits_path_with_gradients():
    torch.manual_seed(0)
    N, H, V, tau = 37, 16, 101, 0.7
    h, W, b = (torch.randn(*s, requires_grad=True) for s in ((N, H), (V, H), (V,)))
    y = torch.randint(0, V, (N,))
    weights = torch.randn(N)
    lp, ent, kept = linear_logprobs(h, W, y, b, tau, True, True, (5, 0.9), chunk_elements=V * 8)  # 5 chunks
    (lp @ weights + ent @ weights.flip(0)).backward()
    streamed = [t.grad.clone() for t in (h, W, b)]
    for t in (h, W, b):
        t.grad = None
    z = torch.nn.functional.linear(h, W, b) / tau
    lp2, ent2, kept2 = selective_logprobs(z, y), entropy_from_logits(z), log_kept_mass(z.detach(), y, 5, 0.9)
    (lp2 @ weights + ent2 @ weights.flip(0)).backward()
    _close(lp, lp2, 1e-5)
    _close(ent, ent2, 1e-4)
    _close(kept, kept2, 1e-5)
    assert (kept < 0).any()
    for g1, t in zip(streamed, (h, W, b)):
        _close(g1, t.grad, 1e-4)


def test_linear_logprobs_gradcheck_float64():
    torch.manual_seed(0)
    h, W, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((5, 3), (7, 3), (7,)))
    y = torch.randint(0, 7, (5,))
    assert torch.autograd.gradcheck(
        lambda h, W, b: linear_logprobs(h, W, y, b, 0.7, True, True, None, chunk_elements=14)[:2], (h, W, b)
    )


def test_entropy_has_no_gradient_unless_asked():
    h, W = torch.randn(3, 4, requires_grad=True), torch.randn(9, 4)
    lp, ent, _ = linear_logprobs(h, W, torch.tensor([0, 1, 2]), with_entropy=True)
    assert lp.requires_grad and not ent.requires_grad


def test_linear_logprobs_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="agree on H"):
        linear_logprobs(torch.randn(3, 4), torch.randn(9, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="targets must have shape"):
        linear_logprobs(torch.randn(3, 4), torch.randn(9, 4), torch.zeros(2, dtype=torch.long))


# ----------------------------------------------------------------------------- forward_response


@pytest.mark.parametrize("tied,bias", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("packed", [False, True])
def test_forward_response_streamed_equals_full_logits(tied, bias, packed):
    model = _llama(tied, bias)
    assert streamable(model)
    ids, mask = _rows()
    T = 6
    index = torch.tensor([0, 0, 1, 1]) if packed else None
    if packed:  # rows of one prompt share its columns
        ids[1], mask[1] = ids[0], mask[0]
        ids[3, :5], mask[3] = ids[2, :5], mask[2]

    def run(lm_head):
        out = forward_response(
            model,
            ids,
            mask,
            T,
            temperature=0.8,
            with_entropy=True,
            entropy_grad=True,
            prompt_index=index,
            support=(7, 0.9),
            lm_head=lm_head,
        )
        (out.logprobs.sum() + 0.3 * out.entropy.sum()).backward()
        return out

    (a, grads_a), (b, grads_b) = _both(model, run)
    _close(a.logprobs, b.logprobs, 1e-5)
    _close(a.entropy, b.entropy, 1e-4)
    _close(a.log_kept_mass, b.log_kept_mass, 1e-5)
    assert grads_a.keys() == grads_b.keys() and ("lm_head.weight" in grads_a or "model.embed_tokens.weight" in grads_a)
    for name in grads_a:
        _close(grads_a[name], grads_b[name], 1e-4)


def test_forward_response_streamed_bf16_within_bf16_tolerance():
    model = _llama(tied=False, dtype=torch.bfloat16)
    ids, mask = _rows()

    def run(lm_head):
        out = forward_response(model, ids, mask, 6, with_entropy=True, lm_head=lm_head)
        out.logprobs.sum().backward()
        return out

    (a, grads_a), (b, grads_b) = _both(model, run)
    assert a.logprobs.dtype == torch.float32
    _close(a.logprobs, b.logprobs, 2e-2, 2e-2)
    _close(a.entropy, b.entropy, 2e-2, 2e-2)
    for name in grads_a:
        _close(grads_a[name], grads_b[name], 2e-2, 5e-2)


def test_forward_response_streamed_under_autocast_runs_the_head_in_bf16():
    model = _llama()
    ids, mask = _rows()
    outs = []
    for mode in ("chunked", "full"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(forward_response(model, ids, mask, 6, lm_head=mode).logprobs)
    _close(outs[0], outs[1], 2e-2, 2e-2)
    assert (outs[0] - forward_response(model, ids, mask, 6).logprobs).abs().max() > 1e-4  # bf16, not float32


def test_forward_response_streamed_with_lora():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        _llama(tied=False), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    assert streamable(model)
    ids, mask = _rows()

    def run(lm_head):
        out = forward_response(model, ids, mask, 6, lm_head=lm_head)
        out.logprobs.sum().backward()
        return out

    (a, grads_a), (b, grads_b) = _both(model, run)
    _close(a.logprobs, b.logprobs, 1e-5)
    assert grads_a and all("lora" in n for n in grads_a)
    for name in grads_a:
        _close(grads_a[name], grads_b[name], 1e-4)


def test_a_lora_adapted_head_is_not_streamed():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_llama(tied=False), peft.LoraConfig(r=4, target_modules=["lm_head", "q_proj"]))
    assert not streamable(model)


def test_a_soft_capped_head_runs_unstreamed_and_right():
    """Gemma 2 soft-caps its logits after the head: the probe sees the head's output changed."""
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        final_logit_softcapping=2.0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    model = Gemma2ForCausalLM(config).eval()
    assert not streamable(model)
    ids, mask = _rows()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    expected = selective_logprobs(logits[:, -7:-1], ids[:, -6:])
    got = forward_response(model, ids, mask, 6).logprobs
    _close(got * mask[:, -6:], expected * mask[:, -6:], 1e-5)


def test_streamed_forward_scores_the_rows_it_is_given():
    """The SFT loss: every non-ignored position of a full pass, no logits_to_keep."""
    model = _llama()
    ids, mask = _rows()
    keep = mask[:, 1:].bool()
    targets = ids[:, 1:][keep]
    _, (lp, ent, kept) = streamed_forward(
        model, lambda h: h[:, :-1][keep], targets, input_ids=ids, attention_mask=mask, use_cache=False
    )
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    expected = -torch.nn.functional.cross_entropy(logits[:, :-1][keep], targets, reduction="none")
    _close(lp, expected, 1e-5)
    assert ent is None and kept is None


def head_outputs(model) -> list[int]:
    """The last dimension of each output the model's output layer returns from now on: the vocabulary for its
    own logits, 3 for the streamed head's statistics (``models.lm_head.streamed_forward``)."""
    seen: list[int] = []
    model.get_output_embeddings().register_forward_hook(lambda module, inputs, out: seen.append(out.shape[-1]))
    return seen


def test_each_pass_reads_the_head_as_its_argument_says():
    """The mode is an argument of the pass, not state on the model: a 'full' pass leaves the next default one
    streamed; a mode that is neither is refused."""
    model = _llama()
    assert streamable(model)  # the one-token probe runs before the hook watches
    ids, mask = _rows()
    seen = head_outputs(model)
    for mode in ("full", "chunked", "full"):
        forward_response(model, ids, mask, 6, lm_head=mode)
    forward_response(model, ids, mask, 6)
    assert seen == [VOCAB, 3, VOCAB, 3]
    assert not streamable(model, "full")
    with pytest.raises(ValueError, match="lm_head must be one of chunked, full, got 'fused'"):
        forward_response(model, ids, mask, 6, lm_head="fused")


# ----------------------------------------------------------------------------- memory


class _LargestVocabTensor(TorchDispatchMode):
    """The largest number of elements of any tensor an op produces whose last dimension is the vocabulary."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("mode", ["chunked", "full"])
def test_no_tokens_by_vocabulary_tensor_forward_or_backward(mode):
    """8 rows × 160 response tokens × 32,768 vocabulary = 42M logits; the chunks hold 2^24."""
    V, B, T = 32768, 8, 160
    model = _llama(tied=False, vocab=V, hidden=16)
    streamable(model)  # the head's one-token probe runs first, outside the watch
    ids = torch.randint(2, V, (B, 4 + T))
    watch = _LargestVocabTensor(V)
    with watch:
        out = forward_response(model, ids, torch.ones_like(ids), T, with_entropy=True, entropy_grad=True, lm_head=mode)
        (out.logprobs.sum() + out.entropy.sum()).backward()
    weight = V * 16  # the head's weight and its gradient
    if mode == "full":
        assert watch.largest >= B * T * V  # the detector sees the logits the model's own head makes
    else:
        assert watch.largest <= max(1 << 24, weight) < B * T * V


@pytest.mark.parametrize("autocast", [False, True], ids=["bf16-weights", "fp32-under-bf16-autocast"])
def test_the_unstreamed_head_reads_the_logits_as_the_sampler_draws_from_them(autocast):
    """``lm_head='full'`` (the path of every model the streamed head refuses), bfloat16 logits, τ = 0.7,
    top-k 5: the trainer's log-prob of the truncated distribution is the sampler's own arithmetic (float32
    logits / τ, then the truncation) to float rounding; dividing the bfloat16 logits first was not."""
    model = _llama(dtype=torch.float32 if autocast else torch.bfloat16, hidden=64)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (4, 12), generator=g)
    mask, T, tau = torch.ones_like(ids), 8, 0.7
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.no_grad()
    with context, torch.no_grad():
        out = forward_response(model, ids, mask, T, tau, support=(5, 1.0), lm_head="full")
        logits = model(input_ids=ids).logits[:, -T - 1 : -1]
    assert logits.dtype == torch.bfloat16
    targets = ids[:, -T:]
    z = logits.float() / tau
    sampler = z.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1) - log_kept_mass(z, targets, 5)
    trainer = out.logprobs - out.log_kept_mass
    assert (trainer - sampler).abs().max() < 1e-5
    rounded = logits / tau  # the old order: the division in bfloat16
    old = selective_logprobs(rounded, targets) - log_kept_mass(rounded, targets, 5)
    assert (old - sampler).abs().max() > 1e-3
