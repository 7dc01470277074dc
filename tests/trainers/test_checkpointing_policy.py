"""``gradient_checkpointing: off | on | auto`` and ``max_tokens_per_micro_batch: auto`` in the trainers
(``models/memory.py``): every mode trains the same weights, 'auto' checkpoints the micro-batches
that would not fit (and only those), the budget splits micro-batches by memory, and a row that cannot
fit is refused before anything is written."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.config import RLConfig, load_config
from rlhfkit.models.memory import SAFETY
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import SFTConfig, SFTTrainer

from .test_rl_options import comparable_adam, make_trainer, trained_params, varied_experience

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def fixed_free(plan, tokens: int) -> None:
    """The plan's free memory fixed so that a pass over more than ``tokens`` tokens (rows x width)
    does not fit without checkpointing."""
    plan.free = lambda: plan.cost.kept(1, tokens, False) / SAFETY


def updated(mode: str, free_tokens: int | None = None, **config):
    trainer = make_trainer(algorithm="grpo", gradient_checkpointing=mode, **config)
    if free_tokens is not None:
        fixed_free(trainer.models.memory, free_tokens)
    comparable_adam(trainer)
    exp = varied_experience(trainer)
    metrics = trainer.update(exp) | trainer.models.memory.metrics()
    return [p.detach().clone() for _, p in trained_params(trainer)], metrics


def test_every_mode_trains_the_same_weights_and_auto_checkpoints_only_what_would_not_fit():
    """One update of one experience in micro-batches of up to 60 tokens: off, on, and auto with the
    free memory of a 40-token pass (so the larger micro-batches checkpoint, the smaller do not)."""
    base = dict(max_tokens_per_micro_batch=60, loss_agg="token-mean")
    off, m_off = updated("off", **base)
    on, m_on = updated("on", **base)
    auto, m_auto = updated("auto", free_tokens=40, **base)
    assert "perf/checkpointed_frac" not in m_off or m_off["perf/checkpointed_frac"] == 0
    assert m_on["perf/checkpointed_frac"] == 1.0
    assert 0 < m_auto["perf/checkpointed_frac"] < 1
    for a, b, c in zip(off, on, auto):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c, a, atol=1e-6, rtol=1e-5)


def test_a_lora_policy_trains_the_same_adapter_checkpointed_or_not():
    from peft import LoraConfig

    from rlhfkit import RLTrainer

    from .test_rl_options import PROMPTS, varied_reward

    adapters = {}
    for mode in ("off", "on"):
        tok = char_tokenizer()
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        args = RLConfig(
            algorithm="grpo", learning_rate=3e-3, max_new_tokens=6, max_steps=2, log_every=0, seed=0,
            prompts_per_step=2, kl_coef=0.1, gradient_checkpointing=mode,
        )  # fmt: skip
        trainer = RLTrainer(
            tiny_causal_lm(tok, seed=0), [varied_reward], args, train_dataset=PROMPTS, processing_class=tok,
            peft_config=lora,
        )  # fmt: skip
        history = trainer.train()
        assert [h["perf/checkpointed_frac"] for h in history] == [float(mode == "on")] * 2
        adapters[mode] = [p.detach().clone() for _, p in trained_params(trainer)]
    assert len(adapters["on"]) == 8  # 2 layers x (q, v) x (A, B): the adapter alone trains
    for a, b in zip(adapters["off"], adapters["on"]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_auto_with_room_to_spare_never_checkpoints():
    _, metrics = updated("auto", max_tokens_per_micro_batch=60)
    assert metrics["perf/checkpointed_frac"] == 0.0


def test_an_automatic_token_budget_splits_by_memory_and_gives_the_update_of_one_batch():
    """max_tokens_per_micro_batch='auto' with the memory of a 30-token pass (checkpointed: a few rows)
    runs several micro-batches where the default runs one, and ends with the same weights."""
    one, _ = updated("off")
    trainer = make_trainer(algorithm="grpo", gradient_checkpointing="on", max_tokens_per_micro_batch="auto")
    assert trainer.models.memory.cost is not None  # measured: something plans with it
    fixed_free(trainer.models.memory, 30)
    exp = varied_experience(trainer)
    budget = trainer.models.token_budget(exp.rollout)
    assert budget is not None and budget < trainer.models.micro_batches(exp.rollout)[0].numel() * 20
    assert len(trainer.models.micro_batches(exp.rollout)) > 1
    comparable_adam(trainer)
    trainer.update(exp)
    for (name, p), q in zip(trained_params(trainer), one):
        torch.testing.assert_close(p.detach(), q, atol=1e-6, rtol=1e-5, msg=name)


def test_a_row_that_cannot_fit_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ValueError) as err:
        make_trainer(algorithm="grpo", memory_budget_gb=0.001, output_dir=str(out))
    text = str(err.value)
    assert "\n" not in text and "memory_budget_gb=0.001" in text and "max_new_tokens" in text
    assert not out.exists()


def sft(mode: str, free_tokens: int | None = None):
    tok = char_tokenizer()
    rows = [{"prompt": p, "completion": c} for p, c in [("ab", "bc"), ("hello", "ifmmp"), ("x", "y"), ("cat", "dbu")]]
    config = SFTConfig(batch_size=2, max_steps=2, learning_rate=1e-3, log_every=0, gradient_checkpointing=mode)
    trainer = SFTTrainer(tiny_causal_lm(tok, seed=0), config, rows, processing_class=tok)
    if free_tokens is not None:
        fixed_free(trainer.memory, free_tokens)
    history = trainer.train()
    return [p.detach().clone() for p in trainer.model.parameters()], history


def test_sft_trains_the_same_weights_in_every_mode():
    off, h_off = sft("off")
    on, h_on = sft("on")
    auto, h_auto = sft("auto", free_tokens=1)
    assert [h["perf/checkpointed_frac"] for h in h_on] == [1.0, 1.0]
    assert [h["perf/checkpointed_frac"] for h in h_auto] == [1.0, 1.0]
    assert [h.get("perf/checkpointed_frac", 0.0) for h in h_off] == [0.0, 0.0]
    for a, b, c in zip(off, on, auto):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(c, a, atol=1e-6, rtol=1e-5)


def test_the_config_takes_the_modes_and_tlrs_booleans(tmp_path):
    assert RLConfig().gradient_checkpointing == "auto" and SFTConfig().gradient_checkpointing == "auto"
    assert RLConfig(gradient_checkpointing=True).gradient_checkpointing == "on"
    assert SFTConfig(gradient_checkpointing=False).gradient_checkpointing == "off"
    with pytest.raises(ValueError, match="'gradient_checkpointing' must be one of off, on, auto"):
        RLConfig(gradient_checkpointing="sometimes")
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        RLConfig(max_tokens_per_micro_batch="automatic")
    path = tmp_path / "c.yaml"
    path.write_text("gradient_checkpointing: true\nmax_tokens_per_micro_batch: auto\nmemory_budget_gb: 24\n")
    config = load_config(RLConfig, path)
    assert (config.gradient_checkpointing, config.max_tokens_per_micro_batch, config.memory_budget_gb) == (
        "on",
        "auto",
        24.0,
    )
