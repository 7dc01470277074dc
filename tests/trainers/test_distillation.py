"""On-policy distillation in the one RL loop (config/teacher.py): a teacher's judgement of the policy's own samples
as the advantage of each token ('token') or as a divergence term of the loss ('full'), checked against the same
quantities computed independently from both models' full logits; the teacher alone moves the student toward it; the
refusals name what is wrong. The divergence itself: tests/algorithms/test_linear_divergence.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.algorithms import aggregate, divergence_from_logits, teacher_token_advantages
from rlhfkit.config import RLConfig, part
from rlhfkit.rl.update import UpdateLoss, loss
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a, letter_teacher
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_token_advantage_is_minus_coef_times_the_sampled_log_ratio_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]])
    teacher = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -4.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = teacher_token_advantages(old, teacher, mask, 0.5)
    want = torch.tensor([[-0.25, 0.5, 0.0], [0.05, -0.5, 0.0]])  # -0.5 (old - teacher); 0 off the mask
    torch.testing.assert_close(got, want)


def trainer_with_teacher(mode: str, reward_funcs=None, **overrides):
    tok = char_tokenizer()
    settings = dict(algorithm="distill", max_new_tokens=6, max_steps=1, log_every=0, seed=0, prompts_per_step=4)
    config = RLConfig(**{**settings, "distillation_mode": mode, **overrides})
    return RLTrainer(
        tiny_causal_lm(tok, seed=0),
        reward_funcs,
        config,
        train_dataset=PROMPTS,
        processing_class=tok,
        teacher_model=letter_teacher(tok),
    )


def step_experience(trainer):
    rows = trainer.sampler.sample_prompts()
    rollout, _ = trainer.sampler.generate(rows)
    return trainer.make_experience(rollout, *trainer.sampler.score(rows, rollout))


def full_logprobs(model, rollout, temperature: float = 1.0) -> torch.Tensor:
    """(B, T, V) log-softmax at the positions predicting each response token, from the model's own logits."""
    T = rollout.response_mask.shape[1]
    mask = rollout.attention_mask
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=rollout.input_ids, attention_mask=mask, position_ids=positions).logits
    return F.log_softmax(logits[:, -T - 1 : -1].float() / temperature, -1)


def test_token_mode_adds_the_teachers_sampled_log_ratio_to_the_advantages():
    """Distillation alone (no reward function): every advantage is -λ (log π(y_t) - log π_T(y_t)), the two
    log-probs read from each model's full logits at the sampled token."""
    trainer = trainer_with_teacher("token", distillation_coef=0.7)
    exp = step_experience(trainer)
    rollout = exp.rollout
    targets = rollout.input_ids[:, -rollout.response_mask.shape[1] :, None]
    with torch.no_grad():
        student = full_logprobs(trainer.models.policy, rollout).gather(-1, targets).squeeze(-1)
        teacher = full_logprobs(trainer.models.teacher, rollout).gather(-1, targets).squeeze(-1)
    mask = exp.mask.bool()
    assert mask.sum() > 10
    want = torch.where(mask, -0.7 * (student - teacher), torch.zeros(()))
    torch.testing.assert_close(exp.advantages * mask, want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_full_mode_loss_is_the_divergence_of_the_two_models_full_distributions(beta):
    """The micro-batch loss with a zero-advantage policy term is λ x the token mean of the divergence computed from
    both models' full softmaxes (``divergence_from_logits``, itself checked against F.kl_div), and its gradient is
    that of the independent computation."""
    trainer = trainer_with_teacher("full", distillation_coef=0.5, distillation_beta=beta, temperature=0.8)
    exp = step_experience(trainer)
    rows = torch.arange(exp.mask.shape[0])
    policy = trainer.models.policy
    got, metrics = loss(trainer.models, part(UpdateLoss, trainer.args), exp, rows, 0.0)
    got_grad = torch.autograd.grad(got, policy.lm_head.weight)[0]
    s = full_logprobs(policy, exp.rollout, 0.8)
    with torch.no_grad():
        t = full_logprobs(trainer.models.teacher, exp.rollout, 0.8)
    per_token = divergence_from_logits(s, t, beta)
    want = 0.5 * aggregate(per_token, exp.mask, "token-mean")
    want_grad = torch.autograd.grad(want, policy.lm_head.weight)[0]
    assert want.item() > 1e-3
    assert got.item() == pytest.approx(want.item(), rel=1e-4, abs=1e-6)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-3)
    assert metrics["distill/divergence"].item() == pytest.approx(want.item() / 0.5, rel=1e-4)


@pytest.mark.parametrize("mode", ["token", "full"])
def test_the_teacher_alone_moves_the_student_toward_it(mode):
    """No reward function: 12 steps of distillation from a teacher that writes mostly 'a' raise the share of 'a' in
    the student's samples, and the student's divergence to the teacher falls."""
    trainer = trainer_with_teacher(mode, max_steps=12, learning_rate=1e-2, prompts_per_step=8)
    history = trainer.train()
    key = "distill/reverse_kl" if mode == "token" else "distill/divergence"
    curve = [r[key] for r in history]
    assert sum(curve[-4:]) / 4 < 0.5 * curve[0], [round(x, 3) for x in curve]
    assert trainer.config.distillation_coef == 1.0 and "reward/no_reward_mean" in history[0]
    tok = trainer.tokenizer
    ids = tok(["abc", "hello", "xyz 12", "go"], return_tensors="pt", padding=True)
    before = tiny_causal_lm(tok, seed=0)
    share = []
    for model in (before, trainer.models.policy):
        torch.manual_seed(0)
        out = model.generate(**ids, max_new_tokens=8, do_sample=True, pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out[:, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        share.append(sum(fraction_of_a(None, texts)) / len(texts))
    assert share[1] > share[0] + 0.2, share


def test_distillation_mixes_with_a_reward():
    """GRPO with a teacher: the reward's group advantages plus the teacher's per-token term."""
    trainer = trainer_with_teacher("token", reward_funcs=[fraction_of_a], distillation_coef=0.3)
    row = trainer.train()[0]
    assert "reward/fraction_of_a_mean" in row and "distill/reverse_kl" in row


def test_refusals_name_what_is_wrong(tmp_path):
    tok = char_tokenizer()
    base = dict(train_dataset=PROMPTS, processing_class=tok)
    with pytest.raises(ValueError, match="distillation_coef is 1.0 but there is no teacher"):
        RLTrainer(tiny_causal_lm(tok), None, RLConfig(algorithm="distill", max_steps=1, log_every=0), **base)
    other = char_tokenizer()
    other.add_tokens(["<extra>"])
    small = tiny_causal_lm(char_tokenizer())
    small.resize_token_embeddings(len(tok) - 1)
    with pytest.raises(ValueError, match=f"teacher_model scores {len(tok) - 1} token ids but the policy's"):
        RLTrainer(
            tiny_causal_lm(tok),
            None,
            RLConfig(algorithm="distill", max_steps=1, log_every=0),
            teacher_model=small,
            **base,
        )
    path = tmp_path / "teacher"
    tiny_causal_lm(other).save_pretrained(path)
    other.save_pretrained(path)
    with pytest.raises(ValueError, match=r"teacher_model .*teacher: its tokenizer differs .* '<extra>'"):
        RLTrainer(
            tiny_causal_lm(tok),
            None,
            RLConfig(algorithm="distill", teacher_model=str(path), max_steps=1, log_every=0),
            **base,
        )
    with pytest.raises(ValueError, match="policy's output layer has .* rows and the teacher's"):
        RLTrainer(
            tiny_causal_lm(tok),
            None,
            RLConfig(algorithm="distill", distillation_mode="full", max_steps=1, log_every=0),
            teacher_model=tiny_causal_lm(other),
            **base,
        )
