"""The rlhfkit features TRL's SFT, DPO and reward configs translate to (tests/trl/test_supervised_dropin.py):
the reward trainer's centring term, gradient accumulation, activation checkpointing and bf16 autocast."""

import math

import pytest
import torch

from rlhfkit.algorithms import bradley_terry_loss
from rlhfkit.trainers.reward_model import Pair
from rlhfkit.trl import RewardConfig, RewardTrainer

from .test_supervised_dropin import CPU, PREFS, STORIES

pytestmark = pytest.mark.usefixtures("one_thread")

# ---------------------------------------------------------------- rlhfkit features the translation needs


def test_center_rewards_coefficient_is_trls_term():
    chosen, rejected = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0])
    loss, _ = bradley_terry_loss(chosen, rejected, center_coefficient=0.1)
    by_hand = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(0.5))) / 2 + 0.1 * (1.0**2 + 1.5**2) / 2
    assert loss.item() == pytest.approx(by_hand, rel=1e-6)


def test_the_reward_trainer_adds_the_centring_term(models, tmp_path):
    config = RewardConfig(
        output_dir=str(tmp_path / "o"), center_rewards_coefficient=0.5, max_steps=1, eval_strategy="steps", **CPU
    )
    trainer = RewardTrainer(models["chat"], args=config, train_dataset=PREFS, eval_dataset=PREFS)
    pairs = [Pair(row["chosen_ids"], row["rejected_ids"], None) for row in trainer.eval_dataset]
    with torch.no_grad():
        chosen, rejected, _ = trainer._score_pairs(pairs)
    plain, _ = bradley_terry_loss(chosen, rejected)
    centre = 0.5 * ((chosen + rejected) ** 2).mean().item()
    assert trainer.evaluate()["eval_loss"] == pytest.approx(plain.item() + centre)


def _trained(kind, model, tmp_path, name, **fields):
    from rlhfkit.trainers import DPOConfig as D
    from rlhfkit.trainers import DPOTrainer as DT
    from rlhfkit.trainers import RewardModelConfig as R
    from rlhfkit.trainers import RewardModelTrainer as RT
    from rlhfkit.trainers import SFTConfig as S
    from rlhfkit.trainers import SFTTrainer as ST

    config, trainer = {"SFT": (S, ST), "DPO": (D, DT), "Reward": (R, RT)}[kind]
    rows = STORIES[:4] if kind == "SFT" else PREFS
    args = config(
        output_dir=str(tmp_path / name),
        learning_rate=1e-2,
        log_every=0,
        progress_bar=False,
        seed=0,
        device="cpu",
        **fields,
    )
    t = trainer(model, args, rows)
    grads, step = [], t.run.optimizer_step
    t.run.optimizer_step = lambda *a: (
        grads.append([p.grad.clone() for p in t.model.parameters() if p.grad is not None]) or step(*a)
    )
    history = t.train()
    # checkpointing ran where asked, and the default ('auto', memory to spare) never checkpointed
    checkpointed = [row.get("perf/checkpointed_frac", 0.0) for row in history if "perf/checkpointed_frac" in row]
    assert checkpointed and all(f == (1.0 if fields.get("gradient_checkpointing") else 0.0) for f in checkpointed)
    return grads[0]  # the first step's gradient (AdamW's first update is about sign(gradient): too coarse to compare)


@pytest.mark.parametrize("kind", ["DPO", "Reward"])
def test_gradient_accumulation_gives_the_gradient_of_one_large_batch(kind, models, tmp_path):
    one = _trained(kind, models["chat"], tmp_path, "one", batch_size=4, max_steps=1)
    two = _trained(kind, models["chat"], tmp_path, "two", batch_size=2, grad_accumulation=2, max_steps=1)
    assert len(one) == len(two) > 0 and all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(one, two))


@pytest.mark.parametrize("kind", ["SFT", "DPO", "Reward"])
def test_activation_checkpointing_gives_the_same_gradient(kind, models, tmp_path):
    model = models["chat" if kind != "SFT" else "plain"]
    plain = _trained(kind, model, tmp_path, "plain", batch_size=4, max_steps=1)
    checkpointed = _trained(kind, model, tmp_path, "ckpt", batch_size=4, max_steps=1, gradient_checkpointing=True)
    assert len(plain) == len(checkpointed) > 0
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(plain, checkpointed))


def test_autocast_runs_the_forward_in_bfloat16(models, tmp_path, monkeypatch):
    seen = []
    original = torch.nn.functional.linear
    monkeypatch.setattr(
        torch.nn.functional,
        "linear",
        lambda x, *a, **k: seen.append(original(x, *a, **k).dtype) or original(x, *a, **k),
    )
    _trained("SFT", models["plain"], tmp_path, "bf16", batch_size=2, max_steps=1, autocast="bfloat16")
    assert torch.bfloat16 in seen
