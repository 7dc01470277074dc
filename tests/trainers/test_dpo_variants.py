"""The DPO trainer's loss variants wired end to end on tiny local models: each loss type and a
weighted list of them reach the loss (the first step's value at π = π_ref, by hand), f-DPO's
divergences (one pair, a reference that differs), LD-DPO's log-probs, TR-DPO's synced reference
(the mix by hand, resume ≡ uninterrupted, its refusals) and the precomputed reference without a
copy of the policy."""

import math

import pytest
import torch

from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.trainers.dpo import DPOConfig, DPOTrainer

from .test_dpo import trainer, weights
from .test_reward_model import oracle_pairs

LN2 = math.log(2)


def _first(**overrides):
    return trainer(max_steps=1, **overrides).train()[0]


@pytest.mark.parametrize(
    "loss_type,extra,expected",
    [
        ("bco_pair", {}, 2 * LN2),  # -log σ(0) - log σ(0)
        ("sigmoid_norm", {}, LN2),
        ("aot", {}, LN2),
        ("aot_unpaired", {}, LN2),
        ("discopop", {}, 0.5 * LN2 + 0.5),  # m = σ(0) = ½: ½ log 2 + ½ e^0
        # EXO at q = (½, ½), ε = 0.1: ½ (log ½ - log 0.9) + ½ (log ½ - log 0.1)
        ("exo_pair", dict(label_smoothing=0.1), 0.5 * (-LN2 - math.log(0.9)) + 0.5 * (-LN2 - math.log(0.1))),
    ],
)
def test_each_loss_type_reaches_the_loss(loss_type, extra, expected):
    """At the first step the policy is the reference (every log-ratio 0): each loss at 0, by hand."""
    first = _first(loss_type=loss_type, **extra)
    assert first["dpo/loss"] == pytest.approx(expected, abs=1e-5)


def test_sft_and_a_weighted_list_of_losses():
    """sft alone is the chosen completions' NLL per token (every chosen completion has 9 tokens
    here: 8 letters and EOS); MPO's list adds 0.8 log 2 + 0.2 (2 log 2) to it."""
    sft = _first(loss_type="sft")
    assert sft["dpo/loss"] == pytest.approx(-sft["logps/chosen"] / 9, rel=1e-5)
    mpo = _first(loss_type=("sigmoid", "bco_pair", "sft"), loss_weights=(0.8, 0.2, 1.0))
    assert mpo["dpo/loss"] == pytest.approx(0.8 * LN2 + 0.2 * 2 * LN2 + sft["dpo/loss"], rel=1e-5)
    assert DPOConfig(loss_type=["sigmoid", "sft"]).loss_type == ("sigmoid", "sft")  # a list reads as a tuple


@pytest.mark.parametrize(
    "divergence,coef,score",
    [
        ("forward_kl", 0.5, lambda u: 1 - math.exp(-u)),
        ("js_divergence", 0.5, lambda u: math.log(2) - math.log1p(math.exp(-u))),
        ("alpha_divergence", 0.3, lambda u: (math.exp(-0.7 * u) - 1) / -0.7),
    ],
)
def test_f_divergences_reach_the_loss(divergence, coef, score):
    """One pair, a reference of other weights: the logged rewards are β c̃ and β r̃, so the loss is
    -log σ(β (s(c̃) - s(r̃))) with the divergence's score s."""
    tok = char_tokenizer()
    first = trainer(
        train=oracle_pairs(1, 0),
        batch_size=1,
        max_steps=1,
        tok=tok,
        beta=0.5,
        ref_model=tiny_causal_lm(tok, hidden_size=32, seed=1),
        f_divergence_type=divergence,
        f_alpha_divergence_coef=coef,
    ).train()[0]
    c, r = first["rewards/chosen"] / 0.5, first["rewards/rejected"] / 0.5
    assert abs(c - r) > 0.1  # the reference differs: the scores matter
    assert first["dpo/loss"] == pytest.approx(math.log1p(math.exp(-0.5 * (score(c) - score(r)))), rel=1e-4)


def test_ld_alpha_weighs_the_longer_completions_excess():
    rows = [{"prompt": "abc", "chosen": "aaaaaa", "rejected": "bb"}, {"prompt": "xy", "chosen": "ab", "rejected": "ba"}]
    plain, ld, one = (trainer(train=rows, max_steps=0, ld_alpha=a) for a in (None, 0.0, 1.0))
    pairs = plain.train_pairs
    full, _ = plain._logps(plain.model, pairs)
    desensitised, _ = ld._logps(ld.model, pairs)
    assert torch.equal(one._logps(one.model, pairs)[0], full)  # α = 1: the plain sums
    # pair 0: the chosen (7 tokens with EOS) keeps its first 3 (the rejected's length); pair 1: equal lengths
    assert desensitised[0] > full[0] and desensitised[1] == full[1]
    assert torch.equal(desensitised[2:], full[2:])


def test_sync_ref_model_mixes_the_policy_into_the_reference():
    """TR-DPO: after step 2 (ref_model_sync_steps=2) the reference is 0.6 θ_2 + 0.4 θ_0."""
    t = trainer(max_steps=2, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.6)
    start = weights(t.model)
    t.train()
    ref, now = dict(t.reference.named_parameters()), dict(t.model.named_parameters())
    for name, p in now.items():
        expected = 0.6 * p.detach() + 0.4 * start[name]
        assert torch.allclose(ref[name].detach(), expected, atol=1e-6), name
    assert not any(p.grad is not None for p in t.reference.parameters())
    fixed = trainer(max_steps=2)
    fixed.train()
    assert all(torch.equal(p, start[n]) for n, p in fixed.reference.state_dict().items())  # without: fixed


def test_a_synced_reference_resumes_as_it_was(tmp_path):
    """The synced reference is checkpointed: a run resumed from step 3 ends with the uninterrupted
    run's policy and reference (syncs at steps 2, 4 and 6)."""
    common = dict(max_steps=7, sync_ref_model=True, ref_model_sync_steps=2, ref_model_mixup_alpha=0.5)
    full = trainer(output_dir=str(tmp_path / "a"), save_steps=3, **common)
    full.train()
    resumed = trainer(output_dir=str(tmp_path / "b"), resume_from=str(tmp_path / "a" / "checkpoint-3"), **common)
    resumed.train()
    for a, b in ((full.model, resumed.model), (full.reference, resumed.reference)):
        wa, wb = weights(a), weights(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sync_ref_model_refusals():
    from peft import LoraConfig

    with pytest.raises(ValueError, match="sync_ref_model=True with a LoRA"):
        trainer(sync_ref_model=True, peft_config=LoraConfig(r=4, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="'sync_ref_model' must be False with precompute_ref_logprobs"):
        DPOConfig(sync_ref_model=True, precompute_ref_logprobs=True)
    tok = char_tokenizer()
    with pytest.raises(ValueError, match="needs a ref_model of the policy's architecture"):
        trainer(tok=tok, sync_ref_model=True, ref_model=tiny_causal_lm(tok, hidden_size=16, seed=1))
    with pytest.raises(ValueError, match="reference-free"):
        trainer(loss_type="sft", sync_ref_model=True)


def test_precomputed_evaluation_pairs_given_later():
    """With precompute_ref_logprobs and no ref_model the policy before its first update is the
    reference: evaluation pairs the trainer gets later are scored then, and refused after training."""
    t = trainer(precompute_ref_logprobs=True, max_steps=1, eval_dataset=oracle_pairs(4, 1))
    later = DPOTrainer._encode(t, oracle_pairs(4, 2), "eval_dataset")
    t.eval_pairs = later
    assert t.evaluate()["eval/loss"] == pytest.approx(LN2, abs=1e-5)  # π = π_ref on them
    t.train()
    t.eval_pairs = DPOTrainer._encode(t, oracle_pairs(4, 3), "eval_dataset")
    with pytest.raises(ValueError, match="were not scored by the reference before training"):
        t.evaluate()
    t.eval_pairs = later  # scored before training: still in the table
    assert t.evaluate()["eval/loss"] < LN2


def test_a_float16_policy_trains_on_float32_masters_and_leaves_in_float16(tmp_path):
    """As SFT (models/master_weights.py): at learning rate 0.1 float16 AdamW ends in non-finite
    weights (TRL's test_train_model_dtype ends with every weight NaN); the masters train every
    weight, the reference stays float16, the policy and final/ are float16 again."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.tasks.tiny import save_tiny_model

    path = save_tiny_model(tmp_path / "tiny", tokenizer=char_tokenizer(), seed=0)
    args = DPOConfig(
        dtype="float16",
        autocast="bfloat16",
        learning_rate=0.1,
        batch_size=8,
        max_steps=6,
        log_every=0,
        output_dir=str(tmp_path / "out"),
        device="cpu",
    )
    t = DPOTrainer(path, args, oracle_pairs(24, 0))
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    assert {p.dtype for p in t.run.optimizer.param_groups[0]["params"]} == {torch.float32}
    assert {p.dtype for p in t.reference.parameters()} == {torch.float16}
    history = t.train()
    assert all(r["perf/skipped_steps"] == 0 for r in history)
    for name, param in t.model.named_parameters():
        assert param.dtype == torch.float16 and torch.isfinite(param).all(), name
        assert not torch.equal(param, before[name]), f"{name} did not move"
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final", dtype="auto")
    assert all(torch.equal(p, t.model.get_parameter(n)) for n, p in final.named_parameters())


def test_wpo_weighs_each_pair_by_its_completions_self_probability():
    """use_weighting: each pair's loss times w(y_w) w(y_l), w(y) = exp(mean_t log p(y_t) - log Σ_v p(v)²),
    computed here from the model's full logits (the trainer takes Σ p² from a temperature-½ pass)."""
    plain = trainer(max_steps=0)
    weighted = trainer(max_steps=0, use_weighting=True)
    pairs = plain.train_pairs[:4]
    base, ours = plain._loss(plain.model, pairs)[0], weighted._loss(weighted.model, pairs)[0]
    for i, p in enumerate(pairs):
        w = 1.0
        for completion in (p.chosen, p.rejected):
            ids = torch.tensor([p.prompt + completion])
            with torch.no_grad():
                logits = plain.model(input_ids=ids).logits[0, len(p.prompt) - 1 : -1].double()
            logp = torch.log_softmax(logits, -1)
            token = logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
            w *= math.exp((token - torch.logsumexp(2 * logp, -1)).mean().item())
        assert ours[i].item() == pytest.approx(base[i].item() * w, rel=1e-4), i
    with pytest.raises(ValueError, match="'use_weighting' must be False with loss_type 'aot'"):
        DPOConfig(use_weighting=True, loss_type="aot")
