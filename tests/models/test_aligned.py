"""Left-aligned rows (``models.aligned``): a padded batch runs with no attention mask — SDPA gets
``is_causal`` and no materialised mask — and gives each row's results as if it ran alone, unpadded."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from rlhfkit.models import forward_response
from rlhfkit.models.aligned import align_left
from rlhfkit.models.lm_head import streamable

VOCAB = 53


def _model(attn="sdpa"):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config).eval()


def _batch(P=6, T=5):
    """Rows [left pad | prompt | response | right pad] of different prompt and response lengths."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (3, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a 3-token prompt
    mask[1, P + 2 :] = 0  # a 2-token response
    mask[2, :1] = 0
    mask[2, P + 4 :] = 0
    return ids, mask


class _SDPACalls:
    def __init__(self, monkeypatch):
        self.calls = []
        original = F.scaled_dot_product_attention

        def spy(q, k, v, attn_mask=None, *args, **kwargs):
            self.calls.append((attn_mask is None, kwargs.get("is_causal", False)))
            return original(q, k, v, attn_mask, *args, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)


def test_a_padded_batch_runs_sdpa_causal_with_no_mask(monkeypatch):
    model = _model()
    ids, mask = _batch()
    streamable(model)  # the head's one-token probe runs first, outside the watch
    sdpa = _SDPACalls(monkeypatch)
    forward_response(model, ids, mask, 5)
    assert sdpa.calls and all(no_mask and causal for no_mask, causal in sdpa.calls)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_each_row_gets_what_it_gets_alone_unpadded(attn):
    model = _model(attn)
    ids, mask = _batch()
    P, T = 6, 5
    out = forward_response(model, ids, mask, T, with_entropy=True, with_hidden=True)
    (out.logprobs * mask[:, P:]).sum().backward()
    for b in range(3):
        real = mask[b].bool()
        row = ids[b, real][None]
        n = int(mask[b, P:].sum())
        alone = forward_response(model, row, torch.ones_like(row), n, with_entropy=True, with_hidden=True)
        torch.testing.assert_close(out.logprobs[b, :n], alone.logprobs[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out.entropy[b, :n], alone.entropy[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out.hidden[b, :n], alone.hidden[0], atol=1e-5, rtol=1e-4)


def test_the_gradient_is_the_masked_passes():
    """The same weights' gradient as the 2-D-mask pass (the layout before alignment)."""
    model = _model()
    ids, mask = _batch()
    out = forward_response(model, ids, mask, 5)
    (out.logprobs * mask[:, 6:]).sum().backward()
    aligned = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, 5:-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 6:, None]).squeeze(-1)
    (lp * mask[:, 6:]).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(aligned[n], p.grad, atol=1e-5, rtol=1e-4)


def test_no_alignment_without_padding_or_with_holes():
    model = _model()
    ids, mask = _batch()
    assert align_left(model, ids, mask, 5) is not None
    assert align_left(model, ids, torch.ones_like(ids), 5) is None  # no mask to drop
    holed = mask.clone()
    holed[1, 3] = 0  # a hole inside a row: the causal mask alone would let tokens see it
    assert align_left(model, ids, holed, 5) is None


def test_sft_rows_padded_at_their_end_run_with_no_mask(monkeypatch):
    from rlhfkit.data.sft import collate_groups
    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
    from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

    tok = char_tokenizer()
    rows = [{"prompt": f"{w}=", "completion": w[::-1] * k} for k, w in enumerate(["cat", "sun", "owl"], 1)]
    trainer = SFTTrainer(
        tiny_causal_lm(tok, hidden_size=32), SFTConfig(batch_size=3, log_every=0), rows, processing_class=tok
    )
    batch = collate_groups([[e] for e in trainer.units[0] + trainer.units[1] + trainer.units[2]], tok.pad_token_id)
    assert not batch["attention_mask"].bool().all()
    sdpa = _SDPACalls(monkeypatch)
    loss, count = trainer.loss_sum(batch)
    assert sdpa.calls and all(no_mask and causal for no_mask, causal in sdpa.calls)
    with torch.no_grad():  # the 2-D-mask pass
        logits = trainer.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    expected = F.cross_entropy(logits[:, :-1][keep].float(), targets[keep], reduction="sum")
    torch.testing.assert_close(loss.detach(), expected, atol=1e-4, rtol=1e-5)
