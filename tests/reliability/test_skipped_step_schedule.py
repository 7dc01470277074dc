"""A skipped (non-finite) optimizer step does not advance the learning-rate schedule: warm-up and
decay count applied updates, in every trainer (they share ``common.optimizer_step``), and a run
resumed after a skip continues the schedule where the uninterrupted run has it."""

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import DPOConfig, DPOTrainer, RLTrainer, SFTConfig, SFTTrainer

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat", "dog", "sun"]]
PAIRS = [{"prompt": w, "chosen": "aaa", "rejected": "bbb"} for w in ["ab", "cd", "ef", "gh"]]
PEAK, WARMUP = 1e-2, 3


def nan_logits_when(model, now):
    """Logits are NaN in the gradient passes made while ``now()`` is true."""

    def hook(module, args, out):
        if torch.is_grad_enabled() and now():
            out.logits = out.logits * float("nan")
        return out

    return model.register_forward_hook(hook)


def sft(tmp_path, name, **overrides):
    tok = char_tokenizer()
    args = dict(
        learning_rate=PEAK,
        warmup_steps=WARMUP,
        lr_scheduler="constant",
        batch_size=2,
        max_steps=6,
        log_every=0,
        output_dir=str(tmp_path / name),
        save_steps=3,
    )
    args.update(overrides)
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    return model, SFTTrainer(model, SFTConfig(**args), ROWS, processing_class=tok)


def test_a_skipped_sft_step_keeps_the_rate_and_warm_up_counts_applied_updates(tmp_path):
    model, trainer = sft(tmp_path, "a")
    nan_logits_when(model, lambda: trainer.step == 1)  # counted after the step
    history = trainer.train()
    assert [r["perf/skipped_steps"] for r in history] == [0, 1, 1, 1, 1, 1]
    used = [r["sft/lr"] for r in history]  # the rate each step used (step 2's: the one it would have used)
    assert used[2] == used[1] == used[0] * 2  # the step after the skip uses the rate from before it
    factors = [lr / PEAK for lr in used]  # (applied updates + 1) / (warmup + 1) until the peak
    assert factors == pytest.approx(
        [0.25, 0.5, 0.5, 0.75, 1.0, 1.0]
    )  # the peak after WARMUP (3) applied updates: steps 1, 3, 4
    # resumed from checkpoint-3 (after the skip): the schedule and the weights continue exactly
    final = {k: v.clone() for k, v in model.state_dict().items()}
    resumed_model, resumed = sft(tmp_path, "b", resume_from=str(tmp_path / "a" / "checkpoint-3"))
    assert [r["sft/lr"] / PEAK for r in resumed.train()] == pytest.approx(factors[3:])
    assert all(torch.equal(final[k], v) for k, v in resumed_model.state_dict().items())


def test_dpo_and_rl_do_not_advance_the_schedule_on_a_skipped_step(tmp_path):
    tok = char_tokenizer()
    policy = tiny_causal_lm(tok, hidden_size=32, seed=0)
    dpo = DPOTrainer(
        policy,
        DPOConfig(
            learning_rate=PEAK, warmup_steps=WARMUP, lr_scheduler="constant", batch_size=4, max_steps=5, log_every=0
        ),
        PAIRS,
        processing_class=tok,
    )
    nan_logits_when(policy, lambda: dpo.step == 2)  # counted before the step
    history = dpo.train()
    assert [r["perf/skipped_steps"] for r in history] == [0, 1, 1, 1, 1]
    assert [r["perf/lr"] / PEAK for r in history] == pytest.approx([0.25, 0.5, 0.5, 0.75, 1.0])

    rl = RLTrainer(
        tiny_causal_lm(tok, hidden_size=32, seed=0),
        [lambda prompts, completions, **kw: [float(len(c)) for c in completions]],
        RLConfig(
            algorithm="grpo",
            max_steps=4,
            max_new_tokens=4,
            prompts_per_step=2,
            log_every=0,
            learning_rate=PEAK,
            warmup_steps=WARMUP,
        ),
        train_dataset=[{"prompt": p} for p in ["ab", "cd", "ef"]],
        processing_class=tok,
    )
    nan_logits_when(rl.models.policy, lambda: rl.step == 1)  # counted after the step
    history = rl.train()
    assert [r["perf/skipped_steps"] for r in history] == [0, 1, 1, 1]
    assert [r["perf/lr"] / PEAK for r in history] == pytest.approx(
        [0.5, 0.5, 0.75, 1.0]
    )  # RL logs the rate after its step
