"""KTO end to end on tiny local models: the first step's loss is the weighted ½ of policy =
reference, the KL estimate is the mean log-ratio of TRL's rotated (prompt, completion) pairs, the toy
preference is learned, the precomputed reference and resuming change nothing, and bad inputs are
one line."""

import pytest
import torch

from rlhfkit.data.encode import encode_pair
from rlhfkit.data.unpaired import load_unpaired_dataset
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.kto import KTOConfig, KTOTrainer

from .test_reward_model import oracle_pairs


def trainer(train=None, model=None, tok=None, **overrides):
    tok = tok or char_tokenizer()
    args = dict(learning_rate=1e-3, batch_size=8, max_steps=4, log_every=0, seed=0)
    args.update(overrides)
    extra = {k: args.pop(k) for k in ("eval_dataset", "ref_model", "peft_config") if k in args}
    model = model if model is not None else tiny_causal_lm(tok, hidden_size=32, seed=0)
    return KTOTrainer(
        model, KTOConfig(**args), oracle_pairs(24, 0) if train is None else train, processing_class=tok, **extra
    )


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def unbalanced(n=10):
    """``n`` unpaired rows, 3 of them desirable."""
    rows = load_unpaired_dataset(oracle_pairs(n, 2))  # n chosen rows, then n rejected
    return rows[:3] + rows[n : 2 * n - 3]


def test_the_first_step_is_the_weighted_half_with_zero_rewards_and_kl():
    # policy = reference: every log-ratio 0, z0 = 0, each loss λ (1 - σ(0)) = λ / 2; 3 desirable rows (λ_D = 2)
    # and 7 undesirable (λ_U = 0.5) in one batch: (3 x 2 + 7 x 0.5) / 2 / 10 = 0.475
    with pytest.warns(UserWarning, match="desirable_weight in"):  # 3 vs 7 rows: TRL's advice on the weights
        t = trainer(unbalanced(), batch_size=10, max_steps=1, desirable_weight=2.0, undesirable_weight=0.5)
    first = t.train()[0]
    assert first["kto/loss"] == pytest.approx(0.475, abs=1e-6)
    assert first["kl"] == 0.0
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert first[key] == pytest.approx(0.0, abs=1e-6)
    assert first["logps/chosen"] < 0 and first["logps/rejected"] < 0


def sequence_logp(model, tok, prompt, completion):
    enc = encode_pair(prompt, completion, tok)
    ids = torch.tensor([enc.input_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, enc.prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, enc.prompt_len :, None]).sum().item()


@pytest.mark.parametrize("loss_type", ["kto", "apo_zero_unpaired"])
def test_the_kl_estimate_is_the_mean_log_ratio_of_each_prompt_with_the_previous_rows_completion(loss_type):
    """A reference unlike the policy (another seed), one batch of 6 rows in the dataset's order: z0 is
    the mean over i of log π/π_ref of (prompt i, completion i-1) — row 0 with the last row's — clamped at
    0; the loss then reads it: the first step's loss is computed here from it by hand."""
    tok = char_tokenizer()
    rows = unbalanced(6)[:6]
    policy, ref = tiny_causal_lm(tok, hidden_size=32, seed=0), tiny_causal_lm(tok, hidden_size=32, seed=1)
    ratios = [
        sequence_logp(policy, tok, rows[i]["prompt"], rows[i - 1]["completion"])
        - sequence_logp(ref, tok, rows[i]["prompt"], rows[i - 1]["completion"])
        for i in range(6)
    ]
    own = [
        sequence_logp(policy, tok, r["prompt"], r["completion"]) - sequence_logp(ref, tok, r["prompt"], r["completion"])
        for r in rows
    ]
    t = trainer(
        rows,
        model=policy,
        tok=tok,
        ref_model=ref,
        batch_size=6,
        max_steps=1,
        shuffle=False,
        beta=0.5,
        loss_type=loss_type,
    )
    first = t.train()[0]
    z0 = max(0.0, sum(ratios) / 6)
    assert z0 > 0.05  # the check below would not tell a missing z0 apart otherwise
    if loss_type == "kto":
        assert first["kl"] == pytest.approx(z0, rel=1e-4)
    else:
        assert first["kl"] == 0.0  # logged, as TRL logs it, but never estimated
        z0 = 0.0
    sig = lambda x: 1 / (1 + torch.exp(-torch.tensor(x)).item())  # noqa: E731
    losses = [1 - sig(0.5 * (r - z0)) if row["label"] else 1 - sig(0.5 * (z0 - r)) for r, row in zip(own, rows)]
    if loss_type == "apo_zero_unpaired":
        losses = [1 - sig(0.5 * r) if row["label"] else sig(0.5 * r) for r, row in zip(own, rows)]
    assert first["kto/loss"] == pytest.approx(sum(losses) / 6, rel=1e-4)


def test_kto_learns_the_toy_preference():
    t = trainer(max_steps=30, learning_rate=3e-3, beta=0.5, eval_dataset=oracle_pairs(16, 1))
    history = t.train()
    assert history[-1]["eval/rewards/margins"] > 0.5, history[-1]
    assert history[-1]["eval/loss"] < history[0]["kto/loss"]


def test_precomputed_reference_log_probs_train_the_same_weights():
    live, pre = trainer(shuffle=False), trainer(shuffle=False, precompute_ref_logprobs=True)
    assert pre.reference is None  # no copy: the policy scored every item before its first update
    a, b = live.train(), pre.train()
    for x, y in zip(a, b):
        assert x["kto/loss"] == pytest.approx(y["kto/loss"], abs=1e-5)
        assert x["kl"] == pytest.approx(y["kl"], abs=1e-5)
    wa, wb = weights(live.model), weights(pre.model)
    assert all(torch.allclose(wa[k], wb[k], atol=1e-5) for k in wa)


def test_resumed_training_ends_with_the_uninterrupted_weights(tmp_path):
    full = trainer(output_dir=str(tmp_path / "a"), save_steps=2, max_steps=5)
    full.train()
    resumed = trainer(output_dir=str(tmp_path / "b"), resume_from=str(tmp_path / "a" / "checkpoint-2"), max_steps=5)
    assert resumed.step == 2
    resumed.train()
    wa, wb = weights(full.model), weights(resumed.model)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_bad_inputs_are_one_line(tmp_path):
    rows = [{"prompt": "ab", "completion": "a", "label": True}, {"prompt": "ab", "completion": "b", "label": 1}]
    with pytest.raises(
        ValueError,
        match=r"^train_dataset: row index 1 \(0-based\): field 'label': expected true \(desirable\) or false",
    ):
        trainer(train=rows)
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "ab", "completion": "a", "label": true}\n{"prompt": "ab", "label": false}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl: line 2: missing field 'completion'"):
        trainer(train=str(path))
    with pytest.raises(ValueError, match="fewer than 2 rows per micro-batch"):
        trainer(batch_size=1)
    trainer(batch_size=1, loss_type="apo_zero_unpaired", max_steps=0)  # no KL term: one row is enough
    with pytest.raises(ValueError, match="KTOConfig: config field 'loss_type' must be one of kto, apo_zero_unpaired"):
        KTOConfig(loss_type="sigmoid")
    with pytest.raises(ValueError, match="'undesirable_weight' must be >= 0"):
        KTOConfig(undesirable_weight=-1.0)
