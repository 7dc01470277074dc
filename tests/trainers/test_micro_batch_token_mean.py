"""loss_agg="micro-batch-token-mean" (TRL's loss_type="bnpo") in the update: each micro-batch's token
mean, the micro-batches of an optimizer step weighed alike — unlike token-mean (DAPO), where a
micro-batch weighs by its tokens. The formula's one-micro-batch part is tested with the other
aggregations (tests/algorithms/test_losses.py)."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.algorithms import ppo_policy_loss
from rlhfkit.config import RLConfig, part
from rlhfkit.rl.update import MinibatchUpdate, group_by_prompt, micro_batch_split, minibatch_generator, update
from rlhfkit.rollout import build_rollout
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def varied(prompts, completions, **kwargs):
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


@pytest.mark.parametrize("agg", ["micro-batch-token-mean", "token-mean"])
def test_each_micro_batch_weighs_alike(agg):
    tok = char_tokenizer()
    config = RLConfig(
        algorithm="grpo", loss_agg=agg, max_new_tokens=8, max_steps=1, log_every=0, seed=0, prompts_per_step=2,
        group_size=4, micro_batch_size=3, learning_rate=1e-3,
    )  # fmt: skip
    trainer = RLTrainer(tiny_causal_lm(tok, seed=0), [varied], config, train_dataset=PROMPTS, processing_class=tok)
    rows = trainer.sampler.sample_prompts()
    b = tok.convert_tokens_to_ids("b")
    lengths = [1, 2, 3, 4, 5, 6, 7, 8]  # micro-batches of unequal token counts
    responses = [[b] * (n - 1) + [tok.eos_token_id] for n in lengths]
    rollout = build_rollout(
        [trainer.sampler.prompt_ids[i] for i in rows], responses, 4, tok.pad_token_id, tok.eos_token_id
    )
    exp = trainer.make_experience(rollout, *trainer.sampler.score(rows, rollout))
    exp.advantages = torch.randn(exp.mask.shape, generator=torch.Generator().manual_seed(3)) * exp.mask
    args = part(MinibatchUpdate, trainer.args)
    # the update's micro-batches: one minibatch (the whole batch), drawn in the update's order
    order = torch.randperm(8, generator=minibatch_generator(args.seed, 0))
    order = group_by_prompt(exp, order, share_prompt=args.share_prompt)
    chunks = micro_batch_split(args, exp, trainer.models.token_budget(exp.rollout))(order)
    assert len(chunks) == 3 and len({int(exp.mask[c].sum()) for c in chunks}) > 1
    with torch.no_grad():
        logprobs = trainer.models.train_outputs(exp.rollout, with_values=False, entropy_grad=False)[0]
    per_chunk = [
        ppo_policy_loss(logprobs[c], logprobs[c], exp.advantages[c], exp.mask[c], agg="token-mean")[0] for c in chunks
    ]
    tokens = torch.tensor([float(exp.mask[c].sum()) for c in chunks])
    expected = {
        "micro-batch-token-mean": sum(per_chunk) / len(chunks),
        "token-mean": sum(loss * n for loss, n in zip(per_chunk, tokens)) / tokens.sum(),
    }[agg]
    metrics = update(trainer.models, args, exp, 0.0, 0, lambda: {"perf/grad_norm": torch.zeros(())})
    assert metrics["policy/loss"].item() == pytest.approx(expected.item(), abs=1e-6)
    assert metrics["policy/total_loss"].item() == pytest.approx(expected.item(), abs=1e-6)
