"""The objectives of issue 21 in the RL loop, through the trainer's public phases on the toy task:
GSPO's sequence-level ratio reaches the loss, DAPO's overlong punishment shapes the scores, truncated
completions leave the loss, and dynamic sampling trains only on groups with reward variance.
The formulas themselves are tested in tests/algorithms/test_objectives.py."""

from __future__ import annotations

import json

import pytest
import torch

from rlhfkit.algorithms import group_has_variance, ppo_policy_loss
from rlhfkit.config import RLConfig, part
from rlhfkit.rl.update import UpdateLoss
from rlhfkit.rl.update import loss as update_loss
from rlhfkit.rollout import build_rollout, concat_rollouts
from rlhfkit.run.training import epoch_order
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS
from rlhfkit.trainers import RLTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def varied_reward(prompts, completions, **kwargs):
    """Deterministic scores that differ between completions."""
    return [(sum(map(ord, c)) % 7) / 7 for c in completions]


CONSTANT = {"abc", "qq", "go", "hi there"}  # prompts whose every completion scores the same


def half_constant_reward(prompts, completions, **kwargs):
    """1 for every completion of a CONSTANT prompt (a group without variance), varied otherwise."""
    return [1.0 if p in CONSTANT else (sum(map(ord, c)) % 7) / 7 for p, c in zip(prompts, completions)]


def constant_reward(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def make_trainer(algorithm="grpo", reward=varied_reward, **overrides):
    tok = char_tokenizer()
    args = dict(
        algorithm=algorithm, learning_rate=3e-3, max_new_tokens=8, max_steps=2, log_every=0, seed=0, prompts_per_step=2
    )
    args.update(overrides)
    return RLTrainer(
        tiny_causal_lm(tok, seed=0), [reward], RLConfig(**args), train_dataset=PROMPTS, processing_class=tok
    )


def handmade_rollout(trainer, rows, lengths, eos=True):
    """Completions of ``lengths`` tokens of 'b' (the last one EOS where ``eos`` says so)."""
    tok = trainer.tokenizer
    b = tok.convert_tokens_to_ids("b")
    eos = [eos] * len(lengths) if isinstance(eos, bool) else eos
    responses = [[b] * (n - 1) + [tok.eos_token_id if e else b] for n, e in zip(lengths, eos)]
    return build_rollout(
        [trainer.sampler.prompt_ids[i] for i in rows],
        responses,
        trainer.args.group_size,
        tok.pad_token_id,
        tok.eos_token_id,
    )


# ---------------------------------------------------------------- GSPO: the ratio's level reaches the loss


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_importance_sampling_level_reaches_the_policy_loss(level):
    """Off-policy (old log-probs moved per token), the loss the update computes is the clipped
    surrogate with the configured level's ratio — not the token-level one."""
    trainer = make_trainer(importance_sampling_level=level, clip_low=0.1, clip_high=0.1, kl_coef=0.0)
    rows = trainer.sampler.sample_prompts()
    rollout, _ = trainer.sampler.generate(rows)
    exp = trainer.make_experience(rollout, *trainer.sampler.score(rows, rollout))
    all_rows = torch.arange(exp.mask.shape[0])
    with torch.no_grad():
        logprobs = trainer.models.train_outputs(rollout, with_values=False, entropy_grad=False)[0]
    exp.old_logprobs = logprobs + 0.3 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(0))
    exp.advantages = (
        torch.randn(exp.mask.shape[0], generator=torch.Generator().manual_seed(1))[:, None].expand_as(exp.mask).clone()
    )
    with torch.no_grad():
        got = update_loss(trainer.models, part(UpdateLoss, trainer.args), exp, all_rows, 0.0)[0]
    args = dict(agg=trainer.args.loss_agg, horizon=trainer.args.max_new_tokens, clip_low=0.1, clip_high=0.1)
    want = {
        lvl: ppo_policy_loss(
            logprobs, exp.old_logprobs, exp.advantages, exp.mask, **args, importance_sampling_level=lvl
        )[0]
        for lvl in ("token", level)
    }
    assert not torch.allclose(want["token"], want[level], atol=1e-4)
    torch.testing.assert_close(got, want[level], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- DAPO's soft overlong punishment


def test_overlong_penalty_shapes_the_scores_by_length():
    """max_new_tokens 8, buffer 4, factor 0.5: a completion of L tokens (EOS counted) loses
    0 up to 4 tokens, (L - 4) / 4 * 0.5 from 5 to 8, the whole 0.5 at the limit, truncated or not."""
    trainer = make_trainer(reward=constant_reward, overlong_buffer_len=4, overlong_penalty=0.5)
    plain = make_trainer(reward=constant_reward)
    rows = trainer.sampler.sample_prompts()
    lengths = [1, 3, 4, 5, 6, 7, 8, 8]
    rollout = handmade_rollout(trainer, rows, lengths, eos=[True] * 7 + [False])
    assert rollout.response_mask.sum(-1).tolist() == lengths
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    want = torch.tensor([0.5 - max(0, n - 4) / 4 * 0.5 for n in lengths])
    torch.testing.assert_close(scores, want)
    assert metrics["reward/overlong_penalty_mean"].item() == pytest.approx((want - 0.5).mean().item())
    assert metrics["reward/mean"].item() == pytest.approx(want.mean().item())
    plain_scores, _, plain_metrics = plain.sampler.score(rows, rollout)  # off: the sources' scores unchanged
    assert plain_scores.tolist() == [0.5] * 8 and "reward/overlong_penalty_mean" not in plain_metrics


# ---------------------------------------------------------------- truncated completions out of the loss


def test_mask_truncated_completions_removes_truncated_rows_from_the_loss_only():
    """Truncated completions get no loss tokens; their scores still count in their group's
    statistics, so every advantage equals that of the run without the option."""
    on, off = (make_trainer(mask_truncated_completions=flag, kl_coef=0.0) for flag in (True, False))
    rows = on.sampler.sample_prompts()
    off.sampler.sample_prompts()
    has_eos = [True, False, True, True, False, True, True, False]
    rollout = handmade_rollout(on, rows, [2, 8, 3, 5, 8, 1, 6, 8], eos=has_eos)
    exps = [t.make_experience(rollout, *t.sampler.score(rows, rollout)) for t in (on, off)]
    truncated = ~torch.tensor(has_eos)
    assert exps[1].mask[truncated].any()
    assert not exps[0].mask[truncated].any()
    assert torch.equal(exps[0].mask[~truncated], exps[1].mask[~truncated])
    torch.testing.assert_close(exps[0].advantages, exps[1].advantages)


# ---------------------------------------------------------------- dynamic sampling


def sampled(trainer) -> int:
    """Prompts of the data order the trainer's sampler has consumed."""
    epoch, pos = trainer.sampler.position()
    return epoch * len(PROMPTS) + pos


def recorded_batches(trainer) -> list:
    """The ``(rows, rollout, scores, valid)`` of every batch the sampler hands the loop."""
    seen, batch = [], trainer.sampler.batch

    def recording(*args, **kwargs):
        out = batch(*args, **kwargs)
        seen.append(out[:4])
        return out

    trainer.sampler.batch = recording
    return seen


def test_dynamic_sampling_trains_only_on_groups_with_reward_variance():
    """Half the prompts give a group of equal scores: they are dropped, and further prompts are
    drawn (the data order moves on by a whole step per round) until prompts_per_step groups with
    variance are kept."""
    trainer = make_trainer("dapo", reward=half_constant_reward, max_steps=4, max_sampling_rounds=10)
    batches = recorded_batches(trainer)
    history = trainer.train()
    for rows, rollout, scores, valid in batches:
        assert len(rows) == 2 and rollout.input_ids.shape[0] == 8 and valid.all()
        assert not any(PROMPTS[i]["prompt"] in CONSTANT for i in rows)
        assert group_has_variance(scores, valid, 4).all()
    rounds = [r["rollout/sampling_rounds"] for r in history]
    # Each step draws rounds of 2 prompts in the data order until 2 varying ones came up, no more.
    order = [i for epoch in range(4) for i in epoch_order(0, epoch, len(PROMPTS))]
    expected, kept_rows, pos = [], [], 0
    for _ in history:
        n, varying = 0, []
        while len(varying) < 2:
            varying += [i for i in order[pos : pos + 2] if PROMPTS[i]["prompt"] not in CONSTANT]
            n, pos = n + 1, pos + 2
        expected.append(float(n))
        kept_rows.append(varying[:2])  # the first ones kept, in the order drawn
    assert rounds == expected and max(rounds) > 1
    assert [rows for rows, *_ in batches] == kept_rows
    used = 2 * int(sum(rounds))  # every round consumed prompts_per_step prompts of the data order
    assert sampled(trainer) == used
    kept = [r["rollout/kept_groups_frac"] for r in history]
    assert all(0 < k <= 1 for k in kept) and min(kept) < 1


def test_dynamic_sampling_logs_one_rounds_samples_per_step(tmp_path):
    trainer = make_trainer(
        "dapo",
        reward=half_constant_reward,
        max_steps=4,
        max_sampling_rounds=10,
        output_dir=str(tmp_path / "run"),
        num_logged_samples=4,
    )
    history = trainer.train()
    assert max(r["rollout/sampling_rounds"] for r in history) > 1
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert steps == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4


def test_dynamic_sampling_stops_at_max_sampling_rounds_and_warns(capsys):
    """No group ever has variance: every step spends its max_sampling_rounds rounds, says so in
    one line, and takes no optimizer step (nothing to learn from)."""
    trainer = make_trainer("dapo", reward=constant_reward, max_steps=2, max_sampling_rounds=3)
    batches = recorded_batches(trainer)
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    history = trainer.train()
    assert [r["rollout/sampling_rounds"] for r in history] == [3.0, 3.0]
    assert [r["rollout/kept_groups_frac"] for r in history] == [0.0, 0.0]
    assert sampled(trainer) == 2 * 3 * 2
    assert all(not valid.any() for _, _, _, valid in batches)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.models.policy.parameters()))
    warnings = [line for line in capsys.readouterr().err.splitlines() if "dynamic sampling" in line]
    assert len(warnings) == 2 and "0 of prompts_per_step=2" in warnings[0] and "max_sampling_rounds=3" in warnings[0]


def test_dynamic_sampling_trains_on_what_it_kept_when_the_rounds_run_out(capsys):
    """Only the prompt 'xyz 12' has variance, one round: the step trains on the groups kept (none
    of a constant prompt), and the warning gives the count."""

    def one_prompt_varies(prompts, completions, **kwargs):
        return [(sum(map(ord, c)) % 7) / 7 if p == "xyz 12" else 0.0 for p, c in zip(prompts, completions)]

    trainer = make_trainer("dapo", reward=one_prompt_varies, max_steps=4, max_sampling_rounds=1, prompts_per_step=4)
    batches = recorded_batches(trainer)
    trainer.train()
    for rows, _, scores, valid in batches:
        trained = [PROMPTS[i]["prompt"] for g, i in enumerate(rows) if valid[4 * g : 4 * g + 4].any()]
        assert set(trained) <= {"xyz 12"}
        assert not valid.any() or group_has_variance(scores, valid, 4).all()
    assert any(valid.any() for _, _, _, valid in batches)  # 'xyz 12' came up in a step and was trained on
    warnings = [line for line in capsys.readouterr().err.splitlines() if "dynamic sampling" in line]
    assert len(warnings) == 4 and any("1 of prompts_per_step=4" in w for w in warnings)


def test_dynamic_sampling_normalises_scores_over_the_kept_batch():
    """normalize_rewards whitens the kept groups' scores among themselves (mean 0, std 1 over the
    batch trained on), not over the round they came from."""
    trainer = make_trainer("dapo", reward=half_constant_reward, normalize_rewards=True, max_steps=1)
    batches = recorded_batches(trainer)
    trainer.train()
    _, _, scores, valid = batches[0]
    assert valid.all() and scores.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert scores.std().item() == pytest.approx(1.0, abs=1e-5)


def test_dynamic_sampling_resumes_to_the_same_weights(tmp_path):
    """The rounds consume the data order like steps do: a run resumed from a checkpoint draws the
    same prompts and ends with the weights of the uninterrupted run."""
    extra = dict(reward=half_constant_reward, max_steps=4, max_sampling_rounds=3)
    full = make_trainer("dapo", output_dir=str(tmp_path / "full"), **extra)
    full.train()
    half = make_trainer("dapo", output_dir=str(tmp_path / "half"), **{**extra, "max_steps": 2})
    half.train()
    half.save_checkpoint(tmp_path / "half" / "ckpt")
    resumed = make_trainer(
        "dapo", output_dir=str(tmp_path / "resumed"), resume_from=str(tmp_path / "half" / "ckpt"), **extra
    )
    resumed.train()
    assert resumed.sampler.position() == full.sampler.position()
    for (name, a), (_, b) in zip(full.models.policy.named_parameters(), resumed.models.policy.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


# ---------------------------------------------------------------- concat_rollouts


def test_concat_rollouts_repads_prompts_and_responses():
    """Rows of rollouts with different prompt and response widths keep their tokens and masks,
    and prompt_index stays one per prompt; None when a rollout has none (agent episodes)."""
    a = build_rollout([[5, 6, 7]], [[8, 2], [9, 9, 9, 2]], 2, pad_id=0, eos_id=2)
    b = build_rollout([[5], [6, 7]], [[3], [4, 2], [8, 8], [2]], 2, pad_id=0, eos_id=2)
    c = concat_rollouts([a, b], pad_id=0)
    assert c.prompt_len == 3 and c.response_mask.shape == (6, 4)
    assert c.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert c.has_eos.tolist() == a.has_eos.tolist() + b.has_eos.tolist()
    for one, rows in ((a, range(0, 2)), (b, range(2, 6))):
        for i, row in enumerate(rows):
            ids, mask = c.input_ids[row], c.attention_mask[row]
            assert ids[mask.bool()].tolist() == one.input_ids[i][one.attention_mask[i].bool()].tolist()
            n = int(one.response_mask[i].sum())
            assert c.response_ids[row, :n].tolist() == one.response_ids[i, :n].tolist()
            assert c.response_mask[row].sum() == n
    b.prompt_index = None
    assert concat_rollouts([a, b]).prompt_index is None
