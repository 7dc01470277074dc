"""The numerical guard in every trainer: a step whose loss or gradient norm is not finite is
skipped (weights untouched) and counted; N in a row stop the run with one line; non-finite weights
are never loaded, trained or saved."""

import math
import subprocess
import sys

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, save_tiny_model, tiny_causal_lm
from rlhfkit.trainers import (
    DPOConfig,
    DPOTrainer,
    RewardModelConfig,
    RewardModelTrainer,
    RLTrainer,
    SFTConfig,
    SFTTrainer,
)

SFT_ROWS = [{"prompt": f"{w}=", "completion": w[::-1]} for w in ["abc", "hello", "xyz", "cat", "dog", "sun"]]
PAIRS = [{"prompt": w, "chosen": "aaa", "rejected": "bbb"} for w in ["ab", "cd", "ef", "gh"]]


class NaNOnCalls(torch.nn.Module):
    """Hooks a model so that its logits are NaN on the forward calls listed (counted from 1)."""

    def __init__(self, model, calls):
        super().__init__()
        self.calls, self.count = set(calls), 0
        model.register_forward_hook(self.hook)

    def hook(self, module, args, output):
        self.count += 1
        if self.count in self.calls:
            output.logits = output.logits * float("nan")
        return output


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def sft(model, tok, tmp_path, **overrides):
    args = dict(learning_rate=1e-2, batch_size=2, max_steps=4, log_every=0, output_dir=str(tmp_path / "run"))
    args.update(overrides)
    return SFTTrainer(model, SFTConfig(**args), SFT_ROWS, processing_class=tok)


def test_a_non_finite_sft_step_is_skipped_counted_and_the_run_goes_on(tmp_path, capsys):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    trainer = sft(model, tok, tmp_path)
    NaNOnCalls(model, calls=[2])  # one forward per step (batch 2, no accumulation): step 2 is NaN
    snapshots = []
    original = trainer._train_step

    def step(units):
        snapshots.append(weights(model))
        return original(units)

    trainer._train_step = step
    history = trainer.train()
    snapshots.append(weights(model))
    assert [r["perf/skipped_steps"] for r in history] == [0, 1, 1, 1]
    assert all(torch.equal(snapshots[1][k], snapshots[2][k]) for k in snapshots[1])  # step 2 changed nothing
    assert any(not torch.equal(snapshots[2][k], snapshots[3][k]) for k in snapshots[2])  # step 3 trained
    assert "optimizer step skipped: the loss is nan (1 skipped so far, 1 in a row)" in capsys.readouterr().err
    final = tmp_path / "run" / "final"
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(final)
    assert all(torch.isfinite(p).all() for p in loaded.parameters())


def test_consecutive_non_finite_steps_stop_the_run_in_one_line(tmp_path):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    trainer = sft(model, tok, tmp_path, max_consecutive_skips=2, max_steps=5)
    NaNOnCalls(model, calls=[2, 3])
    before = None
    with pytest.raises(ValueError) as err:
        before = weights(model)
        trainer.train()
    message = str(err.value)
    assert "\n" not in message and message.startswith("stopping: the loss was not finite in 2 optimizer steps in a row")
    assert all(torch.isfinite(v).all() for v in weights(model).values()) and before is not None
    assert not (tmp_path / "run" / "final").exists()


def test_reward_model_and_dpo_skip_non_finite_steps(tmp_path):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    rm = RewardModelTrainer(
        model,
        RewardModelConfig(learning_rate=1e-3, batch_size=4, max_steps=3, log_every=0),
        PAIRS,
        processing_class=tok,
    )
    rm.model.backbone.register_forward_hook(
        lambda m, a, out: (
            out.__setitem__("last_hidden_state", out.last_hidden_state * float("nan")) if rm.step == 2 else out
        )
    )
    assert [r["perf/skipped_steps"] for r in rm.train()] == [0, 1, 1]
    assert all(torch.isfinite(p).all() for p in rm.model.parameters())

    policy = tiny_causal_lm(tok, hidden_size=32, seed=0)
    dpo = DPOTrainer(
        policy, DPOConfig(learning_rate=1e-3, batch_size=4, max_steps=3, log_every=0), PAIRS, processing_class=tok
    )
    NaNOnCalls(policy, calls=[2])  # one call a step (a pair's completions packed after its prompt): step 2
    history = dpo.train()
    assert [r["perf/skipped_steps"] for r in history] == [0, 1, 1]
    assert all(torch.isfinite(p).all() for p in policy.parameters())


def test_rl_skips_non_finite_updates_and_stops_after_three_in_a_row(tmp_path):
    tok = char_tokenizer()

    def nan_reward(prompts, completions, **kwargs):
        return [math.nan] * len(completions)

    def rl(reward, **overrides):
        args = dict(
            algorithm="grpo",
            max_steps=5,
            max_new_tokens=4,
            prompts_per_step=2,
            log_every=0,
            output_dir=str(tmp_path / "run"),
            overwrite=True,
        )
        args.update(overrides)
        return RLTrainer(
            tiny_causal_lm(tok, hidden_size=32, seed=0),
            [reward],
            RLConfig(**args),
            train_dataset=[{"prompt": p} for p in ["ab", "cd", "ef"]],
            processing_class=tok,
        )

    with pytest.raises(ValueError, match="reward function 'nan_reward' returned nan at row 0, which is not finite"):
        rl(nan_reward).train()  # a NaN score never reaches the loss

    trainer = rl(lambda prompts, completions, **kw: [float(len(c)) for c in completions])
    policy = trainer.models.policy
    policy.register_forward_hook(  # NaN in every forward pass that builds a gradient (the updates)
        lambda m, a, out: setattr(out, "logits", out.logits * float("nan")) if torch.is_grad_enabled() else None
    )
    with pytest.raises(ValueError, match="stopping: the gradient norm was not finite in 3 optimizer steps in a row"):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in policy.parameters())
    assert not (tmp_path / "run" / "final").exists()


def test_non_finite_weights_are_never_loaded_trained_or_saved(tmp_path):
    tok = char_tokenizer()
    model = tiny_causal_lm(tok, hidden_size=32, seed=0)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    with pytest.raises(
        ValueError,
        match=r"model: the weights hold non-finite values \(NaN or inf\) in "
        r"model.model.layers.0.mlp.up_proj.weight",
    ):
        sft(model, tok, tmp_path)
    directory = save_tiny_model(tmp_path / "nan-model")
    from transformers import AutoModelForCausalLM

    broken = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        broken.lm_head.weight[1, 1] = float("inf")
    broken.save_pretrained(directory)
    done = (
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rlhfkit",
                "sft",
                f"model={directory}",
                f"train_dataset={tmp_path / 'rows.jsonl'}",
                "max_steps=1",
                f"output_dir={tmp_path / 'cli'}",
            ],
            capture_output=True,
            text=True,
            input=None,
            timeout=300,
            env=None,
        )
        if (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        else None
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "the weights hold non-finite values" in done.stderr and str(directory) in done.stderr
    # a save of weights that became non-finite is refused before anything is written
    good = sft(tiny_causal_lm(tok, hidden_size=32, seed=0), tok, tmp_path, output_dir=str(tmp_path / "saving"))
    with torch.no_grad():
        next(good.model.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match="the weights hold non-finite values"):
        good.save_checkpoint(tmp_path / "saving" / "checkpoint-1")
    with pytest.raises(ValueError, match="the weights hold non-finite values"):
        good.save_model(tmp_path / "saving" / "final")
    assert not (tmp_path / "saving" / "checkpoint-1").exists() and not (tmp_path / "saving" / "final").exists()
