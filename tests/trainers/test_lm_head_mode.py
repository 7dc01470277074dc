"""Each trainer's ``lm_head`` field reaches every pass that reads the output layer, as an argument
(``models.lm_head``): the RL loop's passes (``RLModels``: policy, reference, the update's), DPO's and KTO's
(policy and reference) and SFT's loss. ``'full'``: the model's own logits; ``'chunked'``: the streamed head."""

import pytest
import torch

from rlhfkit.config import RLConfig, part
from rlhfkit.models.rl_build import ModelLoading, build_models
from rlhfkit.rollout import Rollout
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

from ..models.test_lm_head import head_outputs
from .test_dpo import trainer as dpo_trainer
from .test_kto import trainer as kto_trainer
from .test_sft_loss_types import make as sft_trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def expected(mode: str, model) -> int:
    """The last dimension of the head's outputs under ``mode``: the vocabulary, or the streamed statistics' 3."""
    return model.get_output_embeddings().out_features if mode == "full" else 3


@pytest.mark.parametrize("mode", ["chunked", "full"])
def test_the_rl_loops_passes_read_the_head_as_the_config_says(mode):
    tok = char_tokenizer()
    config = RLConfig(algorithm="grpo", kl_coef=0.1, lm_head=mode, seed=0)
    models = build_models(tiny_causal_lm(tok, seed=0), tok, part(ModelLoading, config))
    assert models.reference is not None
    seen = [head_outputs(m) for m in (models.policy, models.reference)]
    ids = torch.randint(3, len(tok), (4, 9), generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(ids)
    rollout = Rollout(ids, ones, ones[:, 5:], torch.ones(4, dtype=torch.bool), 5, prompt_index=torch.arange(4))
    models.policy_outputs(rollout, with_values=False)
    models.train_outputs(rollout, with_values=False, entropy_grad=False)
    models.reference_logprobs(rollout)
    policy, reference = seen
    assert len(policy) == 2 and len(reference) == 1
    assert set(policy + reference) == {expected(mode, models.policy)}


@pytest.mark.parametrize("mode", ["chunked", "full"])
@pytest.mark.parametrize("make", [dpo_trainer, kto_trainer, sft_trainer], ids=["dpo", "kto", "sft"])
def test_the_supervised_trainers_passes_read_the_head_as_the_config_says(make, mode):
    t = make(lm_head=mode, max_steps=1)
    models = [m for m in (t.model, getattr(t, "reference", None)) if m is not None]  # DPO's and KTO's: a copy
    seen = [head_outputs(m) for m in models]
    t.train()
    assert len(seen) == (1 if make is sft_trainer else 2) and all(seen)
    assert {d for s in seen for d in s} == {expected(mode, t.model)}
