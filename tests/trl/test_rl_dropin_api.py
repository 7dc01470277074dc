"""The GRPO / RLOO drop-ins take what TRL's trainers take and show what they show: the evaluation API
(``evaluate(eval_dataset=...)``, dicts of evaluation sets, the run's evaluations), ``train_dataset`` /
``eval_dataset``, a streamed train set, a ``TrainingArguments`` as ``args``, a model object without
its tokenizer, reward models as objects with ``reward_processing_classes``, TRL's log layout and
TRL's warnings (rlhfkit/trl/rl_trainers.py, rl_inputs.py, rl_eval.py, rl_rows.py)."""

import logging

import pytest
import torch

from rlhfkit.tasks.tiny import save_tiny_model
from rlhfkit.trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none")
PROMPTS = ["abc", "hello", "xyz", "qq", "go", "hi"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def reward_len(completions, **kwargs):
    return [-abs(8 - len(completion)) for completion in completions]


def config(tmp_path, cls=GRPOConfig, **changes):
    base = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=3, num_generations=3, max_completion_length=6
    )
    return cls(**{**base, **CPU, **changes})


def rows(prompts=PROMPTS):
    return [{"prompt": p} for p in prompts]


@pytest.mark.parametrize("trainer_class, config_class", [(GRPOTrainer, GRPOConfig), (RLOOTrainer, RLOOConfig)])
def test_evaluate_samples_scores_and_takes_trls_eval_dataset_forms(trainer_class, config_class, model_dir, tmp_path):
    from datasets import Dataset

    held_out = Dataset.from_list(rows(["ab", "cd", "ef"]))
    trainer = trainer_class(
        model_dir, reward_len, config(tmp_path, config_class, max_steps=1), rows(), eval_dataset=held_out
    )
    assert trainer.eval_dataset is held_out and trainer.train_dataset == rows()
    metrics = trainer.evaluate()
    # three prompts, num_generations completions each, at most 6 tokens: reward_len is -|8 - length| <= -2
    assert metrics["eval_reward"] <= -2 and metrics["eval_rewards/reward_len/mean"] == metrics["eval_reward"]
    assert metrics["eval_completions/max_length"] <= 6 and math_finite(metrics["eval_loss"])
    assert metrics["eval_samples_per_second"] > 0 and metrics["eval_runtime"] > 0
    named = trainer.evaluate(eval_dataset={"one": rows(["ab"]), "two": held_out}, metric_key_prefix="test")
    assert {"test_one_loss", "test_two_loss", "test_one_reward"} <= set(named)
    logged = trainer.state.log_history
    assert "eval_loss" in logged[0] and "test_one_loss" in logged[1] and "test_two_loss" in logged[2]
    with pytest.raises(ValueError, match="no evaluation set of that name"):
        trainer.evaluate(eval_dataset="missing")


def math_finite(x):
    return x == x and abs(x) != float("inf")


def test_the_eval_loss_is_the_training_loss_at_the_sampling_policy(model_dir, tmp_path):
    """At the policy that sampled them the ratio is 1: TRL's eval loss is the token mean of -A (dapo),
    minus the entropy bonus; with advantages of one prompt's group summing to 0 and equal lengths
    (every completion cut at max_completion_length), -A averages to 0, leaving -coef x entropy."""
    trainer = GRPOTrainer(
        model_dir, reward_len, config(tmp_path, max_steps=1, entropy_coef=0.5, max_completion_length=3), rows()
    )
    metrics = trainer.evaluate(eval_dataset=rows(["ab"]))
    assert metrics["eval_completions/clipped_ratio"] == 1.0  # the tiny model never stops within 3 tokens
    assert metrics["eval_loss"] == pytest.approx(-0.5 * metrics["eval_entropy"], abs=1e-5)


def test_a_run_evaluates_every_eval_steps_and_logs_trls_rows(model_dir, tmp_path):
    args = config(
        tmp_path, max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=2, eval_on_start=True,
        per_device_eval_batch_size=3,  # TRL's rule: whole groups of num_generations
    )  # fmt: skip
    trainer = GRPOTrainer(model_dir, reward_len, args, rows(), eval_dataset={"a": rows(["ab"]), "b": rows(["cd"])})
    trainer.train()
    history = trainer.state.log_history
    steps = [
        (r["step"], "train" if "loss" in r else "summary" if "train_loss" in r else next(iter(r))) for r in history
    ]
    assert steps == [
        (0, "eval_a_loss"), (0, "eval_b_loss"),
        (2, "train"), (2, "eval_a_loss"), (2, "eval_b_loss"),
        (4, "train"), (4, "eval_a_loss"), (4, "eval_b_loss"),
        (4, "summary"),
    ]  # fmt: skip
    # the training row averages TRL's names over its window (steps 3 and 4), rlhfkit's are the step's own
    window = trainer.history[2:4]
    assert history[5]["reward"] == pytest.approx(sum(r["reward/mean"] for r in window) / 2)
    assert history[5]["reward/mean"] == window[-1]["reward/mean"]
    assert "eval/a/loss" in trainer.history[1] and "eval/b/score_mean" in trainer.history[3]


def test_the_summary_row_holds_the_window_the_last_row_did_not_log(model_dir, tmp_path):
    """TRL's last log merges the metrics its window still holds (51 steps, logging_steps=10: step 51)."""
    trainer = GRPOTrainer(model_dir, reward_len, config(tmp_path, max_steps=3, logging_steps=2), rows())
    trainer.train()
    summary = trainer.state.log_history[-1]
    assert summary["reward"] == trainer.history[-1]["reward/mean"] and "train_loss" in summary
    assert "rewards/reward_len/std" in summary and "loss" not in summary and summary["epoch"] == 3 / 6


def test_a_stream_trains_the_rows_max_steps_takes(model_dir, tmp_path):
    from datasets import Dataset

    stream = Dataset.from_list(rows()).to_iterable_dataset()
    trainer = GRPOTrainer(model_dir, reward_len, config(tmp_path, max_steps=2, dataloader_num_workers=2), stream)
    assert trainer.train_dataset is stream and len(trainer.sampler.rows) == 2  # one prompt per step
    # TRL's settings for a stream, on trainer.args (the GRPOConfig; rlhfkit's RLConfig is trainer.config)
    assert trainer.args.accelerator_config.dispatch_batches is False and trainer.args.dataloader_num_workers == 0
    assert trainer.config.max_steps == 2 and trainer.args is trainer.trl_args
    assert trainer.train().global_step == 2
    with pytest.raises(ValueError, match="max_steps"):
        GRPOTrainer(model_dir, reward_len, config(tmp_path / "b"), stream)
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        GRPOTrainer(
            model_dir, reward_len, config(tmp_path / "c", accelerator_config={"dispatch_batches": True}), stream
        )


def test_training_arguments_become_the_trainers_config(tmp_path):
    """TRL's rule: a plain ``TrainingArguments`` becomes the config, its values kept (TrainingArguments'
    defaults included: learning_rate 5e-5), TRL's own fields at their defaults."""
    from transformers import TrainingArguments

    from rlhfkit.trl.rl_inputs import trl_config

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=8, **CPU)
    converted = trl_config(args, GRPOConfig)
    assert isinstance(converted, GRPOConfig) and converted.max_steps == 1 and converted.learning_rate == 5e-5
    assert converted.num_generations == 8 and converted.to_rlhfkit(n_rows=8).max_steps == 1
    assert trl_config(converted, GRPOConfig) is converted


def test_a_model_object_brings_its_checkpoints_tokenizer(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer = GRPOTrainer(model, reward_len, config(tmp_path, max_steps=1), rows())
    assert trainer.tokenizer.get_vocab() == trainer.tokenizer.from_pretrained(model_dir).get_vocab()
    model.config._name_or_path = ""
    with pytest.raises(ValueError, match="processing_class"):
        GRPOTrainer(model, reward_len, config(tmp_path / "b", max_steps=1), rows())


def test_reward_models_as_objects_and_with_their_processing_classes(model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    classifier = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer = GRPOTrainer(
        model_dir,
        [classifier, reward_len],
        config(tmp_path, max_steps=1),
        rows(),
        reward_processing_classes=[tokenizer, None],
    )
    assert trainer.reward_processing_classes == [tokenizer, None]
    assert trainer.reward_func_names == ["model", "reward_len"]  # TRL's: the checkpoint's last path part
    trainer.train()
    # the classifier's own head and body score: the same number as transformers' pooling at the last token
    ids = tokenizer("abc", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    with torch.no_grad():
        expected = classifier(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert trainer.reward_funcs[0](["ab"], ["c"])[0] == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="must match"):
        GRPOTrainer(
            model_dir, [classifier, reward_len], config(tmp_path / "b"), rows(), reward_processing_classes=tokenizer
        )
    with pytest.raises(ValueError, match="No reward source provided"):
        GRPOTrainer(model_dir, None, config(tmp_path / "c"), rows())
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        GRPOTrainer(model_dir, reward_len, config(tmp_path / "d"))


def test_trls_warnings_under_trls_logger_names(model_dir, tmp_path, caplog):
    def nothing(completions, **kwargs):
        return [None] * len(completions)

    with caplog.at_level("WARNING", logger="trl.trainer.grpo_trainer"):
        trainer = GRPOTrainer(
            model_dir, nothing, config(tmp_path, max_steps=1, importance_sampling_level="sequence"), rows()
        )
        trainer.train()
    assert "weights each sequence by its completion length" in caplog.text  # dapo with a sequence ratio
    assert "All reward functions returned None for the following kwargs:" in caplog.text
    assert "'prompt': " in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl.trainer.rloo_trainer"):
        RLOOTrainer(model_dir, nothing, config(tmp_path / "b", RLOOConfig, max_steps=1), rows()).train()
    assert "All reward functions returned None" in caplog.text


def test_per_function_reward_std_and_the_policy_tags(model_dir, tmp_path):
    def constant(completions, **kwargs):
        return [2.0] * len(completions)

    trainer = GRPOTrainer(
        model_dir, [reward_len, constant], config(tmp_path, max_steps=1, reward_weights=[0.7, 0.3]), rows()
    )
    trainer.train()
    last = trainer.state.log_history[-1]
    assert last["rewards/constant/std"] == 0.0 and last["rewards/constant/mean"] == 2.0
    assert last["reward"] == pytest.approx(0.7 * last["rewards/reward_len/mean"] + 0.3 * 2.0)
    assert trainer.model.model_tags == ["trl", "grpo"]


@pytest.mark.parametrize("trainer_class, config_class", [(GRPOTrainer, GRPOConfig), (RLOOTrainer, RLOOConfig)])
def test_one_completion_per_prompt_evaluates_with_no_baseline(
    trainer_class, config_class, model_dir, tmp_path, monkeypatch
):
    """num_generations_eval=1: no group to compare with, so the advantage is 0 and the loss holds only
    its other terms (here none: 0)."""
    from rlhfkit.rl import update

    seen, loss = [], update.loss
    monkeypatch.setattr(update, "loss", lambda models, args, exp, *a, **k: seen.append(exp.advantages) or loss(
        models, args, exp, *a, **k
    ))  # fmt: skip
    args = config(tmp_path, config_class, max_steps=1, num_generations_eval=1, beta=0.0)

    def distinct(completions, **kwargs):  # differs between completions: a baseline would give advantages
        return [float(len(set(c))) for c in completions]

    trainer = trainer_class(model_dir, distinct, args, rows(), eval_dataset=rows(["ab", "cd", "ef", "gh"]))
    metrics = trainer.evaluate()
    assert metrics["eval_reward_std"] > 0 and seen and all((a == 0).all() for a in seen)
    assert metrics["eval_loss"] == 0.0 and metrics["eval_samples_per_second"] > 0


def test_chat_template_kwargs_reach_every_rendering(tmp_path):
    """TRL's chat_template_kwargs (Qwen3's enable_thinking=False): the prompts are rendered with them;
    the tokenizer the caller passed is left as it was."""
    from rlhfkit.tasks.tiny import chatml_tokenizer

    tok = chatml_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>{% if enable_thinking is defined and not enable_thinking %}"
        "q{% endif %}{% endif %}"
    )
    model = save_tiny_model(tmp_path / "chat", tokenizer=tok, seed=0)
    prompt = [{"role": "user", "content": "ab"}]
    args = config(tmp_path, max_steps=1, chat_template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer(model, reward_len, args, [{"prompt": prompt}] * 3, processing_class=tok)
    rendered = trainer.tokenizer.decode(trainer.sampler.prompt_ids[0])
    assert rendered.endswith("<|im_start|>q") and tok.apply_chat_template(prompt, tokenize=False).endswith("<|im_end|>")
    plain = GRPOTrainer(model, reward_len, config(tmp_path / "b", max_steps=1), [{"prompt": prompt}] * 3)
    assert plain.tokenizer.decode(plain.sampler.prompt_ids[0]).endswith("<|im_start|>")


def test_trls_table_of_the_latest_completions(model_dir, tmp_path):
    """TRL's trainer._logs: the last generation's prompts, completions, rewards and log_extra columns."""

    def reward(completions, log_extra, **kwargs):
        log_extra("first", [c[:1] for c in completions])
        return [float(len(c)) for c in completions]

    trainer = GRPOTrainer(model_dir, reward, config(tmp_path, max_steps=2), rows())
    trainer.train()
    logs = trainer._logs
    assert len(logs["prompt"]) == len(logs["completion"]) == 3  # generation_batch_size: the last generation
    assert list(logs["extra"]["first"]) == [c[:1] for c in logs["completion"]]
    assert list(logs["rewards"]["reward"]) == [float(len(c)) for c in logs["completion"]]


@pytest.mark.parametrize("trainer_class, config_class", [(GRPOTrainer, GRPOConfig), (RLOOTrainer, RLOOConfig)])
def test_sync_ref_model_moves_trainer_ref_model(trainer_class, config_class, model_dir, tmp_path):
    args = config(tmp_path, config_class, max_steps=2, beta=0.1, sync_ref_model=True, ref_model_sync_steps=2)
    trainer = trainer_class(
        model_dir, lambda completions, **kw: [float(len(set(c))) for c in completions], args, rows()
    )
    assert trainer.config.sync_ref_model and trainer.config.ref_model_sync_steps == 2
    before = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    assert all(not torch.equal(p, before[n]) for n, p in trainer.ref_model.named_parameters())
