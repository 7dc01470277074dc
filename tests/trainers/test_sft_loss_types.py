"""The SFT trainer's ``loss_type`` (``algorithms/sft_losses.py``): 'dft' trains and evaluates each
completion token's cross-entropy weighted by its probability, checked by hand against the logits;
and the entropy and token accuracy it logs, by hand too, through the streamed LM head and the full logits."""

import pytest
import torch

from rlhfkit.data.sft import collate
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ["cat", "dog", "sun", "pen", "box", "cup", "hat", "map"]
PAIRS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in WORDS]


def make(**config):
    tok = char_tokenizer()
    fields = {**dict(learning_rate=1e-2, batch_size=4, log_every=0, max_steps=2, lr_scheduler="constant"), **config}
    return SFTTrainer(tiny_causal_lm(tok), SFTConfig(**fields), PAIRS, PAIRS[:3], processing_class=tok)


def by_hand(model, examples, dft: bool) -> torch.Tensor:
    """Σ over the examples' completion tokens of -log p (nll) or -p log p (dft), each example alone."""
    total = torch.zeros(())
    with torch.no_grad():
        for e in examples:
            logprobs = model(input_ids=torch.tensor([e.input_ids])).logits[0].float().log_softmax(-1)
            for j in range(e.prompt_len, len(e.input_ids)):
                lp = logprobs[j - 1, e.input_ids[j]]
                total -= lp * lp.exp() if dft else lp
    return total


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_the_loss_and_the_eval_loss_are_the_loss_types_by_hand(loss_type):
    trainer = make(loss_type=loss_type)
    examples = [u[0] for u in trainer.units]
    with torch.no_grad():
        loss_sum, n = trainer.loss_sum(collate(examples, trainer.tokenizer.pad_token_id))
    expected = by_hand(trainer.model, examples, loss_type == "dft")
    assert loss_sum.item() == pytest.approx(expected.item(), rel=1e-5)
    evals = trainer.eval_examples
    assert trainer.evaluate()["eval/loss"] == pytest.approx(
        by_hand(trainer.model, evals, loss_type == "dft").item() / sum(len(e.input_ids) - e.prompt_len for e in evals),
        rel=1e-5,
    )


def test_dft_trains_and_an_unknown_loss_type_is_one_line():
    history = make(loss_type="dft").train()
    assert len(history) == 2 and all(r["sft/grad_norm"] > 0 for r in history)
    with pytest.raises(ValueError, match=r"^SFTConfig: config field 'loss_type' must be one of nll, dft, got 'mse'$"):
        SFTConfig(loss_type="mse")


@pytest.mark.parametrize("lm_head", ["chunked", "full"])
def test_entropy_and_token_accuracy_by_hand(lm_head):
    trainer = make(lm_head=lm_head, max_steps=15, learning_rate=3e-2)
    history = trainer.train()  # trained a little, some tokens become the most likely
    assert {"sft/entropy", "sft/token_accuracy", "eval/entropy", "eval/token_accuracy"} <= set(history[-1])
    examples = [u[0] for u in trainer.units]
    entropy, top1, n = 0.0, 0, 0
    with torch.no_grad():
        for e in examples:
            logits = trainer.model(input_ids=torch.tensor([e.input_ids])).logits[0].float()
            for j in range(e.prompt_len, len(e.input_ids)):
                p = logits[j - 1].softmax(-1)
                entropy -= float((p * p.log()).sum())
                top1, n = top1 + int(logits[j - 1].argmax() == e.input_ids[j]), n + 1
        stats = {}
        trainer.loss_sum(collate(examples, trainer.tokenizer.pad_token_id), stats=stats)
    assert 0 < top1 < n  # the check sees both kinds
    assert stats["top1"] == top1 and stats["entropy"] == pytest.approx(entropy, rel=1e-5)
