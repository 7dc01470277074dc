"""sync_ref_model in the RL loop (TR-DPO's soft update, TRL's sync_ref_model for GRPO / RLOO): every
ref_model_sync_steps optimizer steps ref <- alpha x policy + (1 - alpha) x ref; checkpoints hold the
reference; refused without a reference of its own."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.config import RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def varied(prompts, completions, **kwargs):
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def trainer(tmp_path, **overrides):
    tok = char_tokenizer()
    args = dict(
        algorithm="grpo", kl_coef=0.1, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.6,
        learning_rate=1e-2, max_new_tokens=6, max_steps=1, log_every=0, seed=0, prompts_per_step=2,
        num_iterations=2, output_dir=str(tmp_path),
    )  # fmt: skip
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, seed=0), [varied], RLConfig(**args), train_dataset=PROMPTS, processing_class=tok
    )


def test_the_reference_moves_toward_the_policy_every_sync_steps(tmp_path):
    t = trainer(tmp_path)
    start = {n: p.detach().clone() for n, p in t.models.reference.named_parameters()}
    policies = []
    step = t.optimizer_step

    def stepping():  # the policy after each optimizer step
        out = step()
        policies.append({n: p.detach().clone() for n, p in t.models.policy.named_parameters()})
        return out

    t.optimizer_step = stepping
    t.train()  # one generation, two optimizer steps (num_iterations=2): one sync, after the second
    assert t.weights_version == 2 and len(policies) == 2
    for n, p in t.models.reference.named_parameters():
        torch.testing.assert_close(p.detach(), 0.6 * policies[1][n] + 0.4 * start[n])
    assert any(not torch.equal(p.detach(), start[n]) for n, p in t.models.reference.named_parameters())


def test_a_resumed_run_continues_with_the_synced_reference(tmp_path):
    first = trainer(tmp_path / "a", ref_model_sync_steps=1, save_steps=1)
    first.train()
    synced = {n: p.detach().clone() for n, p in first.models.reference.named_parameters()}
    resumed = trainer(
        tmp_path / "b", ref_model_sync_steps=1, max_steps=2, resume_from=str(tmp_path / "a" / "checkpoint-1")
    )
    for n, p in resumed.models.reference.named_parameters():
        torch.testing.assert_close(p.detach(), synced[n])
    fresh = trainer(tmp_path / "c", ref_model_sync_steps=1)
    assert any(not torch.equal(p.detach(), synced[n]) for n, p in fresh.models.reference.named_parameters())


def test_without_a_reference_of_its_own_it_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="sync_ref_model") as err:
        RLConfig(algorithm="grpo", kl_coef=0.0, sync_ref_model=True)
    assert "\n" not in str(err.value)
    from peft import LoraConfig

    tok = char_tokenizer()
    config = RLConfig(algorithm="grpo", kl_coef=0.1, sync_ref_model=True, max_new_tokens=4, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="sync_ref_model=True with a LoRA"):
        RLTrainer(
            tiny_causal_lm(tok), [varied], config, train_dataset=PROMPTS, processing_class=tok,
            peft_config=LoraConfig(r=2, target_modules=["q_proj"]),
        )  # fmt: skip
