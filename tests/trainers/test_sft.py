"""SFT end to end on tiny random models: the loss falls, only completion tokens count (checked by
hand against the logits), packing and gradient accumulation change nothing, eval and the final
directory work, and every data error is raised before a model is loaded."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhfkit.data.sft import collate, collate_groups
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.sft import SFTConfig, SFTTrainer

WORDS = ["cat", "dog", "sun", "pen", "box", "cup", "hat", "map", "owl", "fig", "jam", "kit", "log", "nut", "rug", "van"]
PAIRS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in WORDS]
MESSAGES = [{"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": w[::-1]}]} for w in WORDS]
FAST = dict(learning_rate=1e-2, batch_size=4, log_every=0, lr_scheduler="constant")


def make(data=PAIRS, tokenizer=None, hidden_size=32, eval_dataset=None, **config):
    tok = tokenizer or char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=hidden_size)
    return SFTTrainer(model, SFTConfig(**{**FAST, **config}), data, eval_dataset, processing_class=tok)


def completion_nll_by_hand(model, encoded) -> torch.Tensor:
    """Σ over examples, each run alone (no padding), of -log p(token | prefix) over its
    completion positions j >= prompt_len: logits at j-1 predict token j."""
    total = torch.zeros(())
    with torch.no_grad():
        for e in encoded:
            ids = torch.tensor([e.input_ids])
            logprobs = model(input_ids=ids).logits[0].float().log_softmax(-1)
            for j in range(e.prompt_len, len(e.input_ids)):
                total -= logprobs[j - 1, e.input_ids[j]]
    return total


# ---------------------------------------------------------------- learning


def test_loss_falls_on_a_tiny_dataset():
    history = make(max_steps=40).train()
    assert len(history) == 40 and [r["step"] for r in history] == list(range(1, 41))
    start, end = history[0]["sft/loss"], sum(r["sft/loss"] for r in history[-5:]) / 5
    assert end < 0.5 * start, (start, end)
    for key in ["sft/loss", "sft/lr", "sft/grad_norm", "sft/tokens", "sft/epoch"]:
        assert key in history[0], key
    assert history[0]["sft/tokens"] == 4 * 4  # 4 rows x (3 completion chars + EOS)


def test_messages_rows_train():
    history = make(MESSAGES, max_steps=3).train()
    assert len(history) == 3 and history[0]["sft/tokens"] == 16


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_loss_is_the_mean_over_completion_tokens_only(pad_is_eos):
    tok = char_tokenizer(pad_is_eos=pad_is_eos)
    trainer = make(PAIRS[:3] + [{"prompt": "a long prompt=", "completion": "x"}], tokenizer=tok, max_steps=1)
    encoded = [u[0] for u in trainer.units]
    batch = collate(encoded, tok.pad_token_id)
    assert (batch["labels"][:, 1:] == tok.eos_token_id).sum() == 4  # every EOS is a label
    trainer.model.eval()
    with torch.no_grad():
        loss_sum, n = trainer.loss_sum(batch)
    assert n == sum(len(e.input_ids) - e.prompt_len for e in encoded) == 3 * 4 + 2
    torch.testing.assert_close(loss_sum, completion_nll_by_hand(trainer.model, encoded), rtol=1e-5, atol=1e-5)
    padded = batch["attention_mask"] == 0
    assert padded.any()
    batch["input_ids"][padded] = 7  # whatever the padding holds, the loss is the same
    with torch.no_grad():
        torch.testing.assert_close(trainer.loss_sum(batch)[0], loss_sum)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packing_gives_the_same_loss_as_one_example_per_row(attn):
    trainer = make(max_steps=1, packing=True, max_length=32)
    trainer.model.set_attn_implementation(attn)
    trainer.model.eval()
    encoded = [e for unit in trainer.units for e in unit]
    assert len(trainer.units) == 4 and all(len(u) == 4 for u in trainer.units)  # 4 examples x 8 tokens per row
    with torch.no_grad():
        packed, n_packed = trainer.loss_sum(collate(encoded, 0, packing=True, max_length=32), packed=True)
        plain, n_plain = trainer.loss_sum(collate(encoded, 0))
    assert n_packed == n_plain == 16 * 4
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(packed, completion_nll_by_hand(trainer.model, encoded), rtol=1e-5, atol=1e-4)


def test_packed_training_runs_and_counts_tokens():
    history = make(max_steps=2, packing=True, max_length=32, batch_size=2).train()
    assert history[0]["sft/tokens"] == 2 * 4 * 4  # rows of 4 examples of 8 tokens, 4 labels each


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_gradient_accumulation_gives_the_gradient_of_one_large_batch():
    data = PAIRS[:3] + [{"prompt": "a long prompt=", "completion": "xy"}]  # unequal token counts
    one = make(data, max_steps=1, batch_size=4)
    acc = make(data, max_steps=1, batch_size=1, grad_accumulation=4)
    for trainer in (one, acc):  # keep the step's gradient: no update, no zeroing
        trainer.run.optimizer.step = trainer.run.optimizer.zero_grad = lambda *a, **k: None
        trainer.train()
    h1, h2 = one.run.logger.history[0], acc.run.logger.history[0]
    assert h1["sft/tokens"] == h2["sft/tokens"] == 3 * 4 + 3
    assert h1["sft/loss"] == pytest.approx(h2["sft/loss"], rel=1e-6)
    assert h1["sft/grad_norm"] == pytest.approx(h2["sft/grad_norm"], rel=1e-5)
    for a, b in zip(one.model.parameters(), acc.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def test_seeded_runs_repeat_and_epochs_follow_the_data():
    a, b = make(num_epochs=2, seed=3), make(num_epochs=2, seed=3)
    assert a.total_steps == 8  # 2 epochs x 16 rows / batch 4
    assert [r["sft/loss"] for r in a.train()] == [r["sft/loss"] for r in b.train()]
    assert a.run.logger.history[-1]["sft/epoch"] == 2.0


# ---------------------------------------------------------------- eval and outputs


def test_eval_loss_at_eval_every_and_at_the_end():
    trainer = make(max_steps=5, eval_every=2, eval_dataset=PAIRS[:5])
    history = trainer.train()
    assert [r["step"] for r in history if "eval/loss" in r] == [2, 4, 5]
    encoded = [u[0] for u in make(PAIRS[:5]).units]
    trainer.model.eval()
    by_hand = completion_nll_by_hand(trainer.model, encoded) / (5 * 4)
    assert trainer.evaluate()["eval/loss"] == pytest.approx(float(by_hand), rel=1e-5)
    assert history[-1]["eval/loss"] == pytest.approx(trainer.evaluate()["eval/loss"], rel=1e-6)


def test_run_directory_and_a_model_from_a_path(tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in PAIRS[:8]), encoding="utf-8")
    out = tmp_path / "run"
    SFTTrainer(
        tiny_model_dir,
        SFTConfig(**{**FAST, "max_steps": 2, "output_dir": str(out)}),
        str(data),
        eval_dataset=MESSAGES[:2],
    ).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "eval/loss" in rows[-1] and "sft/loss" in rows[0]
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    tok = AutoTokenizer.from_pretrained(out / "final")
    assert model.config.vocab_size == len(tok) == len(char_tokenizer())


# ---------------------------------------------------------------- errors first


@pytest.mark.parametrize(
    "content,expected",
    [
        ('{"prompt": "a"}\n', r"line 1: missing field 'completion'"),
        (
            '{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": ""}\n',
            r"line 2: field 'completion': .*empty",
        ),
        (b'{"prompt": "a", "completion": "\xff"}\n', r"line 1: not valid UTF-8"),
        ('{"prompt": "a", "completion": "b"\n', r"line 1: invalid JSON"),
        ('{"messages": [{"role": "user", "content": "hi"}]}\n', r"line 1: field 'messages': .*last message"),
        (None, r"data file not found"),
    ],
)
def test_data_errors_come_before_the_model_is_loaded(tmp_path, content, expected):
    path = tmp_path / "train.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=expected) as err:
        SFTTrainer(str(tmp_path / "no-such-model"), SFTConfig(), str(path))
    assert str(path) in str(err.value)


def test_eval_data_errors_and_then_the_model_path(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ValueError, match=r"eval_dataset: row index 0 \(0-based\): missing field 'prompt'"):
        SFTTrainer(missing, SFTConfig(), PAIRS, eval_dataset=[{"question": "x"}])
    with pytest.raises(ValueError, match=r"path does not exist: .*no-such-model"):
        SFTTrainer(missing, SFTConfig(), PAIRS)


def test_argument_errors():
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="processing_class .* is required"):
        SFTTrainer(tiny_causal_lm(tok), SFTConfig(), PAIRS)
    with pytest.raises(ValueError, match="train_dataset is required"):
        SFTTrainer(tiny_causal_lm(tok), SFTConfig(), processing_class=tok)
    with pytest.raises(ValueError, match="SFTConfig: config field 'lr_scheduler' must be"):
        SFTConfig(lr_scheduler="step")
    with pytest.raises(ValueError, match=r"SFTConfig: config field 'max_length' must be in \[2, 1e7\]"):
        SFTConfig(max_length=1)
    with pytest.raises(ValueError, match="evaluate\\(\\) needs an eval_dataset"):
        make(max_steps=0).evaluate()


def test_collate_groups_pads_to_the_longest_row_by_default():
    from rlhfkit.data.encode import Encoded

    batch = collate_groups([[Encoded([1, 2], 1, False)], [Encoded([3, 4, 5], 1, False)]], pad_id=9)
    assert batch["input_ids"].tolist() == [[1, 2, 9], [3, 4, 5]]
