"""End-to-end RL on a tiny random model: every preset learns a toy task with a programmatic reward."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhfkit.config import PRESETS, RLConfig
from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm
from rlhfkit.tasks.toy import PROMPTS, fraction_of_a, toy_trainer
from rlhfkit.trainers import RLTrainer


def make_trainer(algorithm, tmp_path=None, **overrides):
    if tmp_path is not None:
        overrides["output_dir"] = str(tmp_path)
    return toy_trainer(algorithm, **overrides)


@pytest.mark.parametrize("algorithm", list(PRESETS))
def test_every_preset_raises_mean_reward(algorithm):
    history = make_trainer(algorithm).train()
    start = sum(r["reward/mean"] for r in history[:5]) / 5
    end = sum(r["reward/mean"] for r in history[-5:]) / 5
    assert end - start > 0.2, (algorithm, start, end)


def test_run_directory_has_metrics_and_a_loadable_final_model(tmp_path):
    make_trainer("grpo", tmp_path, max_steps=2).train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in [
        "reward/mean",
        "kl/k1",
        "kl/k3",
        "policy/entropy",
        "policy/clip_frac",
        "policy/approx_kl",
        "rollout/response_length_mean",
        "rollout/truncated_frac",
        "perf/lr",
        "perf/grad_norm",
        "perf/time_generate",
        "perf/tokens_per_s",
    ]:
        assert key in rows[0], key
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    assert model.config.vocab_size == len(char_tokenizer())


def test_ppo_logs_critic_metrics():
    row = make_trainer("ppo", max_steps=1).train()[0]
    for key in ["critic/loss", "critic/explained_variance", "critic/value_clip_frac"]:
        assert key in row


@pytest.mark.parametrize("algorithm,critic", [("ppo", "separate"), ("ppo", "shared"), ("grpo", None)])
def test_resume_gives_the_same_weights(tmp_path, algorithm, critic):
    extra = {"critic": critic} if critic else {}
    extra.update(max_steps=4, mini_batch_size=8, num_iterations=2)
    full = make_trainer(algorithm, tmp_path / "full", **extra)
    full.train()

    half = make_trainer(algorithm, tmp_path / "half", **{**extra, "max_steps": 2})
    half.train()
    half.save_checkpoint(tmp_path / "half" / "ckpt")
    resumed = make_trainer(algorithm, tmp_path / "resumed", resume_from=str(tmp_path / "half" / "ckpt"), **extra)
    assert resumed.step == 2
    resumed.train()
    for (name, a), (_, b) in zip(full.models.policy.named_parameters(), resumed.models.policy.named_parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    if full.models.critic_module is not None:
        for a, b in zip(full.models.critic_module.parameters(), resumed.models.critic_module.parameters()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_checkpoints_are_written_every_save_steps(tmp_path):
    make_trainer("rloo", tmp_path, max_steps=2, save_steps=1).train()
    for step in (1, 2):
        ckpt = tmp_path / f"checkpoint-{step}"
        assert sorted(p.name for p in ckpt.iterdir()) == [
            "dcp",
            "rng-0.json",
            "rng-0.safetensors",
            "trainer_state.json",
            "training_state.json",
        ]
        assert sorted(p.name for p in (ckpt / "dcp").iterdir()) == [".metadata", "__0_0.distcp"]
        assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == step


def test_resume_from_a_directory_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        make_trainer("grpo", resume_from=str(tmp_path))


def test_lora_policy_uses_the_adapter_disabled_base_as_reference(tmp_path):
    from peft import LoraConfig

    tok = char_tokenizer()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    args = RLConfig(
        algorithm="grpo",
        kl_coef=0.1,
        learning_rate=1e-2,
        max_new_tokens=8,
        max_steps=3,
        prompts_per_step=4,
        log_every=0,
        output_dir=str(tmp_path),
    )
    trainer = RLTrainer(
        tiny_causal_lm(tok), [fraction_of_a], args, train_dataset=PROMPTS, processing_class=tok, peft_config=lora
    )
    assert trainer.models.reference is None  # no second copy of the model
    history = trainer.train()
    assert abs(history[0]["kl/k1"]) < 1e-5  # LoRA starts as the identity: policy == reference
    assert history[-1]["kl/k3"] > 0  # the adapter moved the policy away from the base
    trainable = [n for n, p in trainer.models.policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    AutoModelForCausalLM.from_pretrained(tmp_path / "final")  # merged, loads without peft


def test_single_on_policy_pass_does_not_recompute_old_logprobs():
    trainer = make_trainer("grpo", kl_coef=0.0)
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], 4, trainer.sampler.sampling
    )
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    assert trainer.make_experience(rollout, scores, valid, metrics).old_logprobs is None
    multi = make_trainer("grpo", kl_coef=0.0, num_iterations=2)
    assert multi.make_experience(rollout, scores, valid, metrics).old_logprobs is not None


def test_dataset_formats_and_chat_prompts(tmp_path, tiny_model_dir):
    from datasets import Dataset

    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": p["prompt"]}]}) for p in PROMPTS))
    for dataset in (Dataset.from_list(PROMPTS), PROMPTS, str(path)):
        args = RLConfig(algorithm="rloo", max_new_tokens=4, max_steps=1, prompts_per_step=2, log_every=0)
        trainer = RLTrainer(tiny_model_dir, [fraction_of_a], args, train_dataset=dataset)
        assert len(trainer.train()) == 1
    chat = RLTrainer(tiny_model_dir, [fraction_of_a], args, train_dataset=str(path))
    assert chat.tokenizer.decode(chat.sampler.prompt_ids[0]).startswith("u:")  # rendered with the chat template


def test_reward_columns_reach_the_reward_function():
    seen = {}

    def uses_column(prompts, completions, target, **kwargs):
        seen["target"] = target
        return [1.0] * len(completions)

    data = [{"prompt": "ab", "target": "x"}, {"prompt": "cd", "target": "y"}]
    tok = char_tokenizer()
    args = RLConfig(algorithm="grpo", max_new_tokens=4, max_steps=1, prompts_per_step=2, group_size=2, log_every=0)
    RLTrainer(tiny_causal_lm(tok), [uses_column], args, train_dataset=data, processing_class=tok).train()
    assert sorted(seen["target"]) == ["x", "x", "y", "y"]


def test_samples_no_function_scores_are_masked_out():
    def only_some(prompts, completions, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    tok = char_tokenizer()
    args = RLConfig(algorithm="grpo", max_new_tokens=4, max_steps=1, prompts_per_step=2, log_every=0)
    trainer = RLTrainer(tiny_causal_lm(tok), [only_some], args, train_dataset=PROMPTS, processing_class=tok)
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], 4, trainer.sampler.sampling
    )
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    exp = trainer.make_experience(rollout, scores, valid, metrics)
    assert not exp.mask[1::2].any() and exp.mask[0::2].any()


def test_a_step_no_reward_function_scores_says_so_in_one_line(capsys):
    def never(prompts, completions, **kwargs):
        return [None] * len(completions)

    tok = char_tokenizer()
    args = RLConfig(algorithm="grpo", max_new_tokens=4, max_steps=1, prompts_per_step=2, log_every=0)
    RLTrainer(tiny_causal_lm(tok), [never], args, train_dataset=PROMPTS, processing_class=tok).train()
    lines = [x for x in capsys.readouterr().err.splitlines() if "no reward source scored" in x]
    assert lines == ["warning: no reward source scored any of the 8 completions of this step (every reward function "
                     "returned None): they train nothing"]  # fmt: skip


def test_unscored_samples_stay_in_the_loss_with_advantage_zero_under_unscored_in_loss():
    """TRL's rule (the drop-in's): an unscored row keeps its tokens in the loss, its advantage is 0."""

    def only_some(prompts, completions, **kwargs):
        return [None if i % 2 else float(len(c)) for i, c in enumerate(completions)]

    tok = char_tokenizer()
    args = RLConfig(
        algorithm="grpo", max_new_tokens=4, max_steps=1, prompts_per_step=2, log_every=0, unscored_in_loss=True
    )
    trainer = RLTrainer(tiny_causal_lm(tok), [only_some], args, train_dataset=PROMPTS, processing_class=tok)
    rows = trainer.sampler.sample_prompts()
    rollout = trainer.sampler.engine.generate(
        [trainer.sampler.prompt_ids[i] for i in rows], 4, trainer.sampler.sampling
    )
    scores, valid, metrics = trainer.sampler.score(rows, rollout)
    exp = trainer.make_experience(rollout, scores, valid, metrics)
    assert torch.equal(exp.mask, rollout.response_mask.bool().to(exp.mask.device))
    assert (exp.advantages[1::2] == 0).all()


@pytest.mark.parametrize("drop_last, position", [(False, (1, 2)), (True, (1, 3))])
def test_drop_last_keeps_a_step_inside_one_epoch(drop_last, position):
    """7 prompts, 3 a step: the third step takes the epoch's last prompt and two of the next epoch
    (the order then stands at epoch 1, position 2), or, with drop_last, the next epoch's first three."""
    tok = char_tokenizer()
    args = RLConfig(algorithm="grpo", max_new_tokens=4, prompts_per_step=3, drop_last=drop_last)
    trainer = RLTrainer(tiny_causal_lm(tok), [fraction_of_a], args, train_dataset=PROMPTS[:7], processing_class=tok)
    for _ in range(3):
        rows = trainer.sampler.sample_prompts()
    assert trainer.sampler.position() == position and len(rows) == 3


def test_a_failing_reward_function_is_named():
    def broken(prompts, completions, **kwargs):
        raise RuntimeError("boom")

    tok = char_tokenizer()
    args = RLConfig(algorithm="grpo", max_new_tokens=4, max_steps=1, prompts_per_step=2, log_every=0)
    trainer = RLTrainer(tiny_causal_lm(tok), [broken], args, train_dataset=PROMPTS, processing_class=tok)
    with pytest.raises(ValueError, match="broken"):
        trainer.train()


def test_bad_arguments_are_clear(tiny_model_dir):
    with pytest.raises(ValueError, match="train_dataset is required"):
        RLTrainer(tiny_model_dir, [fraction_of_a], RLConfig())
    with pytest.raises(ValueError, match="processing_class"):
        RLTrainer(tiny_causal_lm(char_tokenizer()), [fraction_of_a], RLConfig(), train_dataset=PROMPTS)
    with pytest.raises(ValueError, match="does not exist"):
        RLTrainer("/no/such/model", [fraction_of_a], RLConfig(), train_dataset=PROMPTS)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        RLConfig(algorithm="ppo2")
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        RLConfig(advantage_estimator="gea")


def test_bfloat16_autocast_and_gradient_checkpointing_keep_float32_weights():
    trainer = make_trainer("ppo", max_steps=2, autocast="bfloat16", gradient_checkpointing=True, critic="shared")
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    history = trainer.train()
    assert all(p.dtype == torch.float32 for p in trainer.models.policy.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.models.policy.parameters()))
    assert all(torch.isfinite(torch.tensor(r["policy/loss"])) for r in history)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_sharing_the_prompt_pass_trains_the_same_weights(algorithm):
    """share_prompt changes how the work is done (prompt once per group in generate, old/reference
    log-probs and the update), not what is computed: the same weights after a few steps with
    minibatches, micro-batches, two epochs and a KL reference."""
    extra = dict(max_steps=3, mini_batch_size=8, micro_batch_size=4, num_iterations=2, kl_coef=0.05)
    if algorithm == "ppo":  # one epoch: with several, a token whose ratio sits on the clip boundary in
        # one run and not the other (float rounding) changes that AdamW step visibly
        extra.update(group_size=2, prompts_per_step=8, critic="shared", mini_batch_size=16, num_iterations=1)
    runs, histories = [], []
    for share in (False, True):  # each trainer seeds the global RNG when it is built: build, then train
        runs.append(make_trainer(algorithm, share_prompt=share, **extra))
        histories.append(runs[-1].train())
    assert [r["reward/mean"] for r in histories[0]] == pytest.approx([r["reward/mean"] for r in histories[1]])
    assert [r["policy/clip_frac"] for r in histories[0]] == pytest.approx([r["policy/clip_frac"] for r in histories[1]])
    # AdamW divides by sqrt(v) + 1e-8: float-rounding differences of near-zero gradients reach ~1.5e-5
    # in a weight after 6 AdamW steps (measured), while rewards and clip fractions agree exactly
    for (name, a), (_, b) in zip(runs[0].models.policy.named_parameters(), runs[1].models.policy.named_parameters()):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4, msg=name)


def test_eval_dataset_is_evaluated_before_every_eval_every_steps_and_after_the_last(tmp_path):
    """Greedy evaluation on held-out prompts logs eval/* at steps 0, 2, 4 and 5 (the last), and
    does not change training (greedy decoding draws no random numbers)."""
    plain = make_trainer("grpo", max_steps=5)
    plain_history = plain.train()
    args = plain.args.replace(eval_every=2, eval_max_new_tokens=4, output_dir=str(tmp_path))
    trainer = RLTrainer(
        tiny_causal_lm(char_tokenizer(), seed=0),
        [fraction_of_a],
        args,
        train_dataset=PROMPTS,
        eval_dataset=PROMPTS[:3],
        processing_class=char_tokenizer(),
    )
    history = trainer.train()
    evals = [r for r in history if "eval/score_mean" in r]
    assert [r["step"] for r in evals] == [0, 2, 4, 5]
    assert all(0 <= r["eval/fraction_of_a_mean"] <= 1 and r["eval/response_length_mean"] <= 4 for r in evals)
    train_rows = [r for r in history if r["step"] > 0]
    assert [r["reward/mean"] for r in train_rows] == pytest.approx([r["reward/mean"] for r in plain_history])
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["step"] == 0 and "eval/score_mean" in logged[0]


def test_eval_dataset_errors_name_it():
    with pytest.raises(ValueError, match="eval dataset"):
        RLTrainer(
            tiny_causal_lm(char_tokenizer(), seed=0),
            [fraction_of_a],
            RLConfig(max_steps=1),
            train_dataset=PROMPTS,
            eval_dataset=[{"no_prompt": 1}],
            processing_class=char_tokenizer(),
        )


def test_save_total_limit_keeps_the_newest_checkpoints_only(tmp_path):
    make_trainer("grpo", tmp_path, max_steps=1).train()  # a run directory (its marker), rerun with overwrite
    (tmp_path / "checkpoint-0").mkdir(parents=True)  # not written by a trainer (no state file): kept
    (tmp_path / "checkpoint-0" / "notes.txt").write_text("mine")
    make_trainer("grpo", tmp_path, max_steps=4, save_steps=1, save_total_limit=2, overwrite=True).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-0", "checkpoint-3", "checkpoint-4"]
    assert (tmp_path / "checkpoint-0" / "notes.txt").read_text() == "mine"


def test_save_total_limit_must_be_positive():
    with pytest.raises(ValueError, match="save_total_limit"):
        RLConfig(save_total_limit=0)
