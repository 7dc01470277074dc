"""RL trainer options checked by their effect, through the trainer's own phases.

Micro-batching with gradient accumulation must give the update of one batch; the loss of a
hand-set experience must equal numbers worked out by hand; every option (adaptive KL, entropy
bonus, reward clipping and normalisation, REINFORCE++, dual clip, learning-rate schedules, the
EOS trick) must change what it promises to change, and nothing else.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.config import RLConfig, part
from rlhfkit.rl.experience import Experience
from rlhfkit.rl.update import UpdateLoss, minibatch_generator
from rlhfkit.rl.update import loss as update_loss
from rlhfkit.rollout.base import build_rollout
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def varied_reward(prompts, completions, **kwargs):
    """Deterministic scores that differ between completions (the toy reward is ~0 for a random
    model, which leaves GRPO with zero advantages and nothing to compare)."""
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


def make_trainer(algorithm="grpo", reward=varied_reward, **overrides):
    tok = char_tokenizer()
    args = dict(
        algorithm=algorithm, learning_rate=3e-3, max_new_tokens=6, max_steps=4, log_every=0, seed=0, prompts_per_step=2
    )
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, seed=0), [reward], RLConfig(**args), train_dataset=PROMPTS, processing_class=tok
    )


def generate(trainer):
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], trainer.args.group_size, trainer.sampler.sampling
    )
    return rows, rollout


def experience(trainer):
    rows, rollout = generate(trainer)
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    return trainer.make_experience(rollout, scores, valid, metrics)


def varied_experience(trainer):
    """An experience of hand-written responses of lengths 1 .. max_new_tokens (ending in EOS, or cut
    at the limit without it), so token and sequence weights of micro-batches differ."""
    rows = trainer.sampler.sample_prompts()
    tok, G, T = trainer.tokenizer, trainer.args.group_size, trainer.args.max_new_tokens
    gen = torch.Generator().manual_seed(7)
    responses = []
    for i in range(len(rows) * G):
        length = (T, 2, 4, 1, T, 3, 5, T - 1)[i % 8]
        ids = torch.randint(3, len(tok), (length,), generator=gen).tolist()  # no special token
        if i % 8 != 0:
            ids[-1] = tok.eos_token_id
        responses.append(ids)
    rollout = build_rollout(
        [trainer.sampler.prompt_ids[i] for i in rows], responses, G, tok.pad_token_id, tok.eos_token_id
    )
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    return trainer.make_experience(rollout, scores, valid, metrics)


def trained_params(trainer):
    modules = [trainer.models.policy] + (
        [trainer.models.critic_module] if trainer.models.critic_module is not None else []
    )
    return [(f"{i}.{n}", p) for i, m in enumerate(modules) for n, p in m.named_parameters() if p.requires_grad]


def record_grads(trainer) -> list[list[torch.Tensor]]:
    """The accumulated gradients seen by each optimizer step (before clipping)."""
    seen, step = [], trainer.optimizer_step

    def recording_step():
        seen.append(
            [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for _, p in trained_params(trainer)]
        )
        return step()

    trainer.optimizer_step = recording_step
    return seen


def comparable_adam(trainer):
    """AdamW's step g/(|g| + eps) turns the float rounding (~1e-10) of near-zero gradient components
    into ~lr·1e-10/1e-8 weight differences at the default eps=1e-8; eps=1e-5 keeps a comparison of
    weights about the gradients (every component with |g| >> 1e-5 still moves by ~lr)."""
    for group in trainer.run.optimizer.param_groups:
        group["eps"] = 1e-5


def handmade_rollout(trainer, responses, n):
    tok = trainer.tokenizer
    ids = [[tok.convert_tokens_to_ids(ch) if isinstance(ch, str) else ch for ch in r] for r in responses]
    prompts = [trainer.sampler.prompt_ids[i] for i in range(len(responses) // n)]
    return build_rollout(prompts, ids, n, tok.pad_token_id, tok.eos_token_id)


def micro_batch_loss(trainer, exp, rows):
    """``(loss, metrics)`` of ``rows`` of ``exp`` as the trainer's update computes them (``rl.update.loss``)."""
    return update_loss(trainer.models, part(UpdateLoss, trainer.args), exp, rows, trainer.kl_ctl.value)


def current_logprobs(trainer, rollout):
    with torch.no_grad():
        logprobs, _, entropy, *_ = trainer.models.train_outputs(rollout, with_values=False, entropy_grad=False)
    return logprobs, entropy


# ---------------------------------------------------------------- 1. micro-batches == one batch

ACCUMULATION_CASES = {
    "grpo-token-mean-kl-entropy": dict(algorithm="grpo", loss_agg="token-mean", kl_coef=0.05, entropy_coef=0.01),
    "grpo-seq-mean-token-mean-kl": dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.05),
    "grpo-seq-mean-token-sum-norm-kl": dict(algorithm="grpo", loss_agg="seq-mean-token-sum-norm", kl_coef=0.05),
    "ppo-shared-token-mean": dict(algorithm="ppo", critic="shared", prompts_per_step=8, loss_agg="token-mean"),
    "ppo-separate-seq-mean-token-mean": dict(
        algorithm="ppo", critic="separate", prompts_per_step=8, loss_agg="seq-mean-token-mean"
    ),
    # Minibatches (2 optimizer steps of 4 rows; the second one off-policy) with micro-batches inside.
    "grpo-minibatches": dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.05, mini_batch_size=4),
    "ppo-shared-minibatches": dict(
        algorithm="ppo", critic="shared", prompts_per_step=8, loss_agg="token-mean", mini_batch_size=4
    ),
    # The presets of issue 21, off-policy in their second minibatch: GSPO's sequence ratio (and
    # GSPO-token's), CISPO's capped detached ratio, DAPO with its overlong punishment and
    # truncated completions out of the loss.
    "gspo-minibatches": dict(algorithm="gspo", mini_batch_size=4),
    "gspo-token-minibatches": dict(algorithm="gspo", importance_sampling_level="sequence_token", mini_batch_size=4),
    "cispo-minibatches": dict(algorithm="cispo", mini_batch_size=4),
    "dapo-minibatches": dict(
        algorithm="dapo", mini_batch_size=4, overlong_buffer_len=2, mask_truncated_completions=True
    ),
}


@pytest.mark.parametrize("case", list(ACCUMULATION_CASES))
def test_micro_batches_with_gradient_accumulation_give_the_update_of_one_batch(case):
    """From one fixed experience, identical trainers that differ only in micro_batch_size (None,
    2, and 3, which splits the 8 rows / the minibatch of 4 unevenly) compute the same gradients and
    end with the same weights."""
    config = dict(ACCUMULATION_CASES[case], num_iterations=1)
    trainers = {micro: make_trainer(**config, micro_batch_size=micro) for micro in (None, 2, 3)}
    reference = trainers[None]
    exp = varied_experience(reference)
    B = exp.mask.shape[0]
    assert B == 8 and exp.advantages[exp.mask].abs().max() > 1e-3  # something to learn from
    assert len(set(exp.mask.sum(1).tolist())) >= 5 and not exp.rollout.has_eos.all()
    if exp.ref_logprobs is not None and not reference.args.kl_in_reward:
        # At step 0 the reference equals the policy and the k3 term has zero gradient: move it.
        noise = torch.randn(exp.ref_logprobs.shape, generator=torch.Generator().manual_seed(1))
        exp.ref_logprobs = exp.ref_logprobs + 0.5 * noise
    if config.get("mini_batch_size"):
        assert exp.old_logprobs is not None  # two optimizer steps: the second is off-policy

    initial = [p.detach().clone() for _, p in trained_params(reference)]
    # The gradient of the first minibatch's loss in one forward/backward, for the first step of each run.
    first_rows = torch.randperm(B, generator=minibatch_generator(reference.args.seed, reference.step)).split(
        config.get("mini_batch_size") or B
    )[0]
    micro_batch_loss(reference, exp, first_rows)[0].backward()
    direct = [p.grad.detach().clone() for _, p in trained_params(reference)]
    reference.run.optimizer.zero_grad(set_to_none=True)
    grads, params = {}, {}
    for micro, trainer in trainers.items():
        comparable_adam(trainer)
        grads[micro] = record_grads(trainer)
        torch.manual_seed(123)  # the same minibatch order for every run
        trainer.update(exp)
        params[micro] = [p.detach().clone() for _, p in trained_params(trainer)]

    steps = B // (config.get("mini_batch_size") or B)
    names = [n for n, _ in trained_params(reference)]
    moved = max((a - b).abs().max().item() for a, b in zip(params[None], initial))
    assert moved > 1e-4  # the update did something the comparison can see
    for name, g, g_ref in zip(names, grads[None][0], direct):
        torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5, msg=f"grad {name} of one minibatch")
    for micro in (2, 3):
        assert len(grads[micro]) == len(grads[None]) == steps
        for step in range(steps):
            for name, g, g_ref in zip(names, grads[micro][step], grads[None][step]):
                torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5, msg=f"grad {name} micro={micro}")
        # the gradients agree to 1e-6 (above); AdamW's division by sqrt(v) + eps amplifies their
        # rounding in near-zero entries, so the weights are compared at 1e-5
        for name, p, p_ref in zip(names, params[micro], params[None]):
            torch.testing.assert_close(p, p_ref, atol=1e-5, rtol=1e-5, msg=f"{name} micro={micro}")


def test_explicit_mini_batch_of_the_whole_batch_is_the_default():
    """mini_batch_size=B is the same single optimizer step as mini_batch_size=None."""
    trainers = [make_trainer(kl_coef=0.0, mini_batch_size=mini) for mini in (None, 8)]
    exp = varied_experience(trainers[0])
    for trainer in trainers:
        comparable_adam(trainer)
        torch.manual_seed(0)
        trainer.update(exp)
    for (name, a), (_, b) in zip(trained_params(trainers[0]), trained_params(trainers[1])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_micro_batches_with_unscored_rows_give_the_update_of_one_batch():
    """Rows without a score (mask all 0) must not change the accumulation weights: a micro-batch
    made only of them contributes nothing, and the result is still that of one batch."""
    config = dict(algorithm="grpo", loss_agg="seq-mean-token-mean", kl_coef=0.0, num_iterations=1)
    trainers = {micro: make_trainer(**config, micro_batch_size=micro) for micro in (None, 2)}
    exp = varied_experience(trainers[None])
    exp.mask = exp.mask.clone()
    # 3 of prompt 0's 4 rows (micro-batches hold whole groups in order, so one of its two
    # micro-batches has no token at all) and one row of prompt 1.
    exp.mask[[0, 1, 2, 6]] = False
    for trainer in trainers.values():
        comparable_adam(trainer)
        torch.manual_seed(0)
        trainer.update(exp)
    for (name, a), (_, b) in zip(trained_params(trainers[None]), trained_params(trainers[2])):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


# ---------------------------------------------------------------- 2. the loss, by hand


def test_grpo_loss_of_a_handmade_experience_equals_the_hand_computation():
    """Two rows (3 and 2 response tokens, one padded column); ratios and reference log-ratios set
    on top of the policy's own log-probs, so every number is known:

    row 0, A = +1, ratios (1.5, 1, 0.5): token losses -min(ρA, clip(ρ)A) = -1.2 (clipped), -1, -0.5
    row 1, A = -1, ratios (2, 0.7):      token losses  max(ρ, clip(ρ))   =  2 (unclipped), 0.8 (clipped)
    seq-mean-token-mean: ((-2.7/3) + (2.8/2)) / 2 = 0.25
    k3 with log r = log q - log p = (ln2, 0, -ln2) and (0, ln2): r - log r - 1
    """
    trainer = make_trainer(kl_coef=0.05, group_size=2, prompts_per_step=1, max_new_tokens=3)
    assert trainer.args.loss_agg == "seq-mean-token-mean" and trainer.args.kl_estimator == "k3"
    eos = trainer.tokenizer.eos_token_id
    rollout = handmade_rollout(trainer, [["a", "b", eos], ["c", eos]], 2)
    mask = rollout.response_mask.bool()
    assert mask.tolist() == [[True, True, True], [True, True, False]]
    logprobs, _ = current_logprobs(trainer, rollout)

    ln2 = math.log(2.0)
    ratio = torch.tensor([[1.5, 1.0, 0.5], [2.0, 0.7, 1.0]])
    log_r = torch.tensor([[ln2, 0.0, -ln2], [0.0, ln2, 0.0]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    exp = Experience(rollout, mask, logprobs - ratio.log(), logprobs + log_r, None, advantages, None)

    loss, metrics = micro_batch_loss(trainer, exp, torch.arange(2))

    surrogate = ((-1.2 - 1.0 - 0.5) / 3 + (2.0 + 0.8) / 2) / 2
    k3 = lambda lr: math.exp(lr) - lr - 1  # noqa: E731
    kl = ((k3(ln2) + k3(0.0) + k3(-ln2)) / 3 + (k3(0.0) + k3(ln2)) / 2) / 2
    assert surrogate == pytest.approx(0.25)
    assert kl == pytest.approx(((1.5 - 1.0) / 3 + (1.0 - ln2) / 2) / 2)
    assert loss.item() == pytest.approx(surrogate + 0.05 * kl, abs=1e-5)
    assert metrics["policy/loss"].item() == pytest.approx(surrogate, abs=1e-5)
    assert metrics["policy/clip_frac"].item() == pytest.approx(2 / 5)  # row 0 token 0 and row 1 token 1


def test_grpo_loss_of_a_real_two_row_experience_equals_plain_torch():
    """A generated 2-row group, after one update (so the ratio is no longer 1): the loss equals the
    clipped surrogate + β·k3, seq-mean-token-mean, written out with plain torch ops."""
    trainer = make_trainer(kl_coef=0.05, group_size=2, prompts_per_step=1, num_iterations=2, learning_rate=1e-2)
    exp = experience(trainer)
    assert exp.old_logprobs is not None and exp.ref_logprobs is not None
    trainer.args = trainer.args.replace(num_iterations=1)
    torch.manual_seed(0)
    trainer.update(exp)

    rows = torch.arange(2)
    logprobs, _ = current_logprobs(trainer, exp.rollout)
    m = exp.mask.float()
    assert exp.advantages[exp.mask].abs().min() > 0.1  # the two scores differ: A = ±1/√2
    ratio = torch.exp(logprobs - exp.old_logprobs)
    assert ((ratio - 1).abs() * m).max() > 1e-3
    a = exp.advantages
    token_loss = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    log_r = exp.ref_logprobs - logprobs
    k3 = torch.exp(log_r) - log_r - 1
    per_row = lambda x: (x * m).sum(1) / m.sum(1)  # noqa: E731
    expected = per_row(token_loss).mean() + 0.05 * per_row(k3).mean()
    loss, _ = micro_batch_loss(trainer, exp, rows)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-5, rel=1e-4)
