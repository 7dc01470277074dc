"""An update that makes the weights non-finite with a finite gradient (a huge learning rate,
float16 weights) stops the run in one line right after that step, in every trainer — before a
sampler, a loss or a save meets the NaN. Nothing is written from it."""

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers import (
    DPOConfig,
    DPOTrainer,
    RewardModelConfig,
    RewardModelTrainer,
    RLTrainer,
    SFTConfig,
    SFTTrainer,
)

ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat"]]
PAIRS = [{"prompt": w, "chosen": "aaa", "rejected": "bbb"} for w in ["ab", "cd", "ef", "gh"]]
COMMON = dict(max_steps=3, log_every=0, save_steps=1)


def build(kind, out, lr, dtype=torch.float32):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0).to(dtype)
    if kind == "sft":
        return SFTTrainer(
            model, SFTConfig(learning_rate=lr, batch_size=2, output_dir=out, **COMMON), ROWS, processing_class=tok
        )
    if kind == "rm":
        return RewardModelTrainer(
            model,
            RewardModelConfig(learning_rate=lr, batch_size=4, output_dir=out, **COMMON),
            PAIRS,
            processing_class=tok,
        )
    if kind == "dpo":
        return DPOTrainer(
            model, DPOConfig(learning_rate=lr, batch_size=4, output_dir=out, **COMMON), PAIRS, processing_class=tok
        )
    return RLTrainer(
        model,
        [lambda prompts, completions, **kw: [float(len(c)) for c in completions]],
        RLConfig(algorithm="grpo", max_new_tokens=4, prompts_per_step=2, learning_rate=lr, output_dir=out, **COMMON),
        train_dataset=[{"prompt": p} for p in ["ab", "cd", "ef"]],
        processing_class=tok,
    )


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo", "rl"])
def test_an_update_that_overflows_the_weights_stops_the_run_in_one_line(kind, tmp_path):
    trainer = build(kind, str(tmp_path / "run"), lr=1e300)
    with pytest.raises(ValueError) as err:
        trainer.train()
    message = str(err.value)
    assert "\n" not in message and message.startswith(
        "stopping: the weights became non-finite (NaN or inf) in an "
        "optimizer step with a finite gradient (learning rate 1e+300"
    )
    assert message.endswith("lower learning_rate")  # float32 weights: no dtype advice
    assert trainer.step == (1 if kind == "dpo" or kind == "rm" else 0)  # stopped inside the first step
    assert not list((tmp_path / "run").glob("checkpoint-*")) and not (tmp_path / "run" / "final").exists()


def test_float16_weights_that_overflow_name_the_dtype(tmp_path):
    # the reward model trains float16 weights as they are (SFT trains float32 masters of them:
    # tests/trainers/test_sft_float16.py)
    trainer = build("rm", None, lr=1.0, dtype=torch.float16)
    with pytest.raises(
        ValueError,
        match=r"weights in float16\): the update overflowed\. Nothing non-finite is "
        r"saved; lower learning_rate, or use dtype=float32$",
    ):
        trainer.train()


def test_the_weight_check_flags_nan_and_inf_but_not_a_finite_tensor_whose_norm_overflows():
    """The check's first pass is each tensor's 2-norm: 1e30s overflow it in float32, yet every
    element is finite, so nothing is raised; a NaN or an inf is."""
    from rlhfkit.run.training import NonFiniteGuard

    guard = NonFiniteGuard(limit=3)
    big = torch.full((8,), 1e30)
    assert not torch.isfinite(torch.linalg.vector_norm(big))
    guard.check_weights([big, torch.ones(3)], lr=1e-3)
    for value in (float("nan"), float("inf")):
        broken = torch.ones(5)
        broken[2] = value
        with pytest.raises(ValueError, match="weights became non-finite"):
            guard.check_weights([torch.ones(3), broken], lr=1e-3)
