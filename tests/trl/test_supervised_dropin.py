"""TRL's SFT, DPO and reward scripts with only the import changed (``from trl import`` -> ``from
rlhfkit.trl import``): TRL 1.16's config fields and defaults, the batch arithmetic (rows per
optimizer step, optimizer steps), which tokens are trained, TRL's trainer interface, and a
one-line refusal for every TRL field rlhfkit does not support. The rlhfkit features the
translation needs (gradient accumulation in DPO and the reward model, ``center_rewards_coefficient``,
activation checkpointing and autocast in the supervised trainers): test_supervised_features.py."""

import dataclasses
import math

import pytest

from rlhfkit.data.sft import IGNORE_INDEX, example_labels
from rlhfkit.trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer
from rlhfkit.trl.arguments import NO_EFFECT, TRANSLATED, field_default, trl_fields

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = dict(use_cpu=True, bf16=False, report_to="none")  # TRL itself refuses bf16 on a CPU-only machine
STORIES = [{"text": f"once upon a time there was a {w} cat."} for w in ("red", "big", "small", "shy", "old", "odd")]
USER = lambda q: {"role": "user", "content": q}  # noqa: E731
BOT = lambda a: {"role": "assistant", "content": a}  # noqa: E731
# TRL's implicit-prompt conversational preference rows (trl-lib/ultrafeedback_binarized's shape)
PREFS = [
    {"chosen": [USER(f"{q}?"), BOT(good)], "rejected": [USER(f"{q}?"), BOT(bad)]}
    for q, good, bad in [("2+2", "4", "5"), ("sky", "blue", "green"), ("3+1", "4", "9"), ("sun", "hot", "cold")]
]


def run_script(script: str, **names) -> dict:
    """Run a TRL script with ``from trl import`` changed to ``from rlhfkit.trl import``, nothing else."""
    scope = dict(names)
    exec(script.replace("from trl import", "from rlhfkit.trl import"), scope)  # noqa: S102
    return scope


# TRL's docstring examples (SFTTrainer, DPOTrainer, RewardTrainer) with the calls of trl/scripts/{sft,dpo,reward}.py;
# only the model and dataset are local and tiny, and the config says CPU (TRL requires it on a CPU machine).
SCRIPT = """
from trl import {Config}, {Trainer}

training_args = {Config}(output_dir=output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                         num_train_epochs=1, learning_rate=1e-3, eval_strategy="steps", eval_steps=1, **cpu)
training_args.model_init_kwargs = dict(revision="main", trust_remote_code=training_args.trust_remote_code,
                                       attn_implementation=None, dtype="float32")
trainer = {Trainer}(
    model=model_name_or_path,
    args=training_args,
    train_dataset=dataset["train"],
    eval_dataset=dataset["test"] if training_args.eval_strategy != "no" else None,
    quantization_config=None,
    peft_config=None,
)
result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
trainer.save_model(training_args.output_dir)
"""


@pytest.mark.parametrize(
    "kind, rows, model, auto",
    [
        ("SFT", STORIES, "plain", "AutoModelForCausalLM"),
        ("DPO", PREFS, "chat", "AutoModelForCausalLM"),
        ("Reward", PREFS, "chat", "AutoModelForSequenceClassification"),
    ],
)
def test_trls_scripts_run_with_only_the_import_changed(kind, rows, model, auto, models, tmp_path):
    import transformers
    from datasets import Dataset, DatasetDict

    dataset = DatasetDict(train=Dataset.from_list(rows), test=Dataset.from_list(rows[:2]))
    scope = run_script(
        SCRIPT.format(Config=f"{kind}Config", Trainer=f"{kind}Trainer"),
        cpu=CPU,
        dataset=dataset,
        output_dir=str(tmp_path / "out"),
        model_name_or_path=models[model],
    )
    trainer, result = scope["trainer"], scope["result"]
    steps = math.ceil(math.ceil(len(rows) / 2) / 2)  # TRL: ceil(batches of 2 per epoch / accumulation 2)
    assert result.global_step == trainer.state.global_step == trainer.state.max_steps == steps
    assert isinstance(result.training_loss, float) and math.isfinite(result.training_loss)
    assert any(k.startswith("eval/") for k in result.metrics)  # eval_strategy="steps" evaluated
    getattr(transformers, auto).from_pretrained(tmp_path / "out")  # save_model(dir): a from_pretrained directory


def test_the_sft_quickstart_on_conversations_trains_every_token_as_trl_does(models, tmp_path):
    """TRL's SFT quickstart data are conversations (trl-lib/Capybara): TRL trains every token of a
    ``messages`` row unless assistant_only_loss=True (rlhfkit's own SFTConfig: the assistant's only)."""
    rows = [{"messages": [USER("hi"), BOT("hello there")]}, {"messages": [USER("2+2?"), BOT("4")]}]
    trained, lengths = {}, {}
    for only in (False, True):
        args = SFTConfig(output_dir=str(tmp_path / str(only)), max_steps=1, assistant_only_loss=only, **CPU)
        trainer = SFTTrainer(model=models["chat"], args=args, train_dataset=rows)
        trained[only] = [sum(t != IGNORE_INDEX for t in example_labels(u[0])) for u in trainer.units]
        lengths[only] = [len(u[0].input_ids) for u in trainer.units]
    assert trained[False] == [n - 1 for n in lengths[False]]  # all but the first token (nothing predicts it)
    assert trained[True] == [len("hello there") + 1, len("4") + 1]  # the reply and its EOS


def test_which_tokens_are_trained_follows_trls_rules(models, tmp_path):
    pair, story = {"prompt": "abc ", "completion": "xyz"}, {"content": "plain words"}
    cases = [
        (None, "text", None, 4),
        (True, "text", None, 4),
        (False, "text", None, 7),  # completion_only_loss
        (None, "content", None, len("plain words")),  # dataset_text_field: every token + EOS
        (None, "text", lambda row: "fn " + row["content"], len("fn plain words")),
    ]  # formatting_func
    for i, (only, text_field, formatting, trained) in enumerate(cases):
        args = SFTConfig(
            output_dir=str(tmp_path / str(i)),
            max_steps=1,
            completion_only_loss=only,
            dataset_text_field=text_field,
            **CPU,
        )
        data = [story] if text_field != "text" or formatting else [pair]
        trainer = SFTTrainer(models["plain"], args, train_dataset=data, formatting_func=formatting)
        assert sum(t != IGNORE_INDEX for t in example_labels(trainer.units[0][0])) == trained, (only, text_field)


def test_eos_pad_and_chat_template_go_on_the_tokenizer(models, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }};{% endfor %}")
    with pytest.warns(FutureWarning, match="pad_token"):  # TRL's own deprecation warning
        args = SFTConfig(
            output_dir=str(tmp_path / "o"),
            max_steps=1,
            eos_token="z",
            pad_token="y",
            chat_template_path=str(template),
            **CPU,
        )
    trainer = SFTTrainer(models["plain"], args, train_dataset=STORIES[:2])
    tok = trainer.tokenizer
    assert (tok.eos_token, tok.pad_token, tok.chat_template) == ("z", "y", template.read_text())
    assert trainer.units[0][0].input_ids[-1] == tok.convert_tokens_to_ids("z")  # the EOS every row ends with
    with pytest.raises(ValueError, match="`eos_token` \\('§'\\) is not found in the vocabulary"):
        SFTTrainer(
            models["plain"], SFTConfig(output_dir=str(tmp_path / "p"), eos_token="§", **CPU), train_dataset=STORIES
        )


CONFIGS = {"SFT": SFTConfig, "DPO": DPOConfig, "Reward": RewardConfig}


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize(
    "per_device, accumulation, world, rows, epochs",
    [(8, 1, 1, 100, 3.0), (2, 4, 1, 10, 3.0), (4, 2, 2, 37, 1.5), (1, 3, 4, 5, 2.0)],
)
def test_the_batch_arithmetic_is_trls(kind, per_device, accumulation, world, rows, epochs):
    """A TRL config and its translation: the same rows per optimizer step, the same rows per process
    per forward pass, and (here for SFT; for DPO and reward in a run below) the same optimizer steps."""
    config = CONFIGS[kind](
        output_dir="out",
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        num_train_epochs=epochs,
        **CPU,
    )
    ours = config.to_rlhfkit(n_rows=rows, world=world)
    assert ours.batch_size * ours.grad_accumulation == per_device * world * accumulation  # rows per optimizer step
    assert ours.batch_size // world == per_device  # rows per process per forward/backward
    trl_steps = math.ceil(epochs * math.ceil(math.ceil(rows / (per_device * world)) / accumulation))  # Trainer's
    if kind == "SFT":
        assert ours.max_steps == trl_steps
    else:  # counted by the trainer from the pairs that fit max_length (as TRL's reward trainer filters them)
        assert (ours.max_steps, ours.num_epochs) == (None, epochs)
    fixed = CONFIGS[kind](output_dir="out", per_device_train_batch_size=per_device, max_steps=7, **CPU)
    assert fixed.to_rlhfkit(n_rows=rows, world=world).max_steps == 7  # max_steps counts optimizer steps in both


@pytest.mark.parametrize("kind, rows", [("DPO", PREFS * 2), ("Reward", PREFS * 2), ("SFT", STORIES[:5])])
def test_optimizer_steps_and_micro_batches_in_a_run_are_trls(kind, rows, models, tmp_path, monkeypatch):
    """5 or 8 rows, 2 per micro-step, accumulation 2, 2 epochs: TRL's Trainer takes
    2 x ceil(ceil(rows / 2) / 2) optimizer steps; each forward pass holds at most 2 rows."""
    trainer_class = {"SFT": SFTTrainer, "DPO": DPOTrainer, "Reward": RewardTrainer}[kind]
    config = CONFIGS[kind](
        output_dir=str(tmp_path / "o"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        logging_steps=1,
        **CPU,
    )
    trainer = trainer_class(model=models["chat" if kind != "SFT" else "plain"], args=config, train_dataset=rows)
    sizes = []
    spied = {"SFT": "loss_sum", "DPO": "_token_logps", "Reward": "_score_pairs"}[kind]
    original = getattr(trainer, spied)
    monkeypatch.setattr(
        trainer,
        spied,
        lambda *a, **k: sizes.append(len(a[-1] if kind != "SFT" else a[0]["input_ids"])) or original(*a, **k),
    )
    assert trainer.train().global_step == trainer.state.max_steps == 2 * math.ceil(math.ceil(len(rows) / 2) / 2)
    passes = {"SFT": 2, "Reward": 2, "DPO": 4}[kind]  # 2 micro-batches a step (DPO: policy and reference)
    assert max(sizes) == 2 and len(sizes) == passes * trainer.state.max_steps


def test_trls_defaults_are_kept():
    sft, dpo, rm = (c(output_dir="out", **CPU).to_rlhfkit(n_rows=80) for c in (SFTConfig, DPOConfig, RewardConfig))
    for ours, lr in ((sft, 2e-5), (dpo, 1e-6), (rm, 1e-4)):
        assert (ours.learning_rate, ours.lr_scheduler, ours.seed, ours.log_every, ours.save_steps) == (
            lr,
            "hf_linear",
            42,
            10,
            500,
        )
        assert (ours.batch_size, ours.grad_accumulation, ours.max_length, ours.warmup_steps) == (8, 1, 1024, 0)
        assert ours.gradient_checkpointing and ours.dtype == "float32" and ours.report_to == ()
    assert sft.max_steps == 30 and dpo.num_epochs == rm.num_epochs == 3.0  # 3 epochs of 80 rows, 8 at a time
    assert (sft.completion_only_loss, sft.assistant_only_loss, sft.packing) == (True, False, False)
    assert (dpo.beta, dpo.loss_type, dpo.label_smoothing, dpo.precompute_ref_logprobs) == (0.1, "sigmoid", 0.0, False)
    assert (rm.center, rm.center_rewards_coefficient) == (False, None)  # TRL does not centre after training
    default = DPOConfig(output_dir="out", use_cpu=True, report_to="none")  # TRL's base config: bf16 unless fp16
    assert default.bf16 and default.to_rlhfkit(n_rows=8).autocast == "bfloat16"


# TRL 1.16's own fields and defaults (trl/trainer/{sft,dpo,reward}_config.py and base_config.py), copied here so
# that a default changed by mistake in rlhfkit.trl fails.
TRL_DEFAULTS = {
    SFTConfig: dict(
        learning_rate=2e-5,
        logging_steps=10,
        gradient_checkpointing=True,
        bf16=None,
        pad_to_multiple_of="auto",
        model_init_kwargs=None,
        trust_remote_code=False,
        router_aux_loss_coef=None,
        chat_template_path=None,
        dataset_text_field="text",
        dataset_kwargs=None,
        dataset_num_proc=None,
        eos_token=None,
        max_length=1024,
        truncation_mode="keep_start",
        shuffle_dataset=False,
        packing=False,
        packing_strategy="bfd",
        padding_free=False,
        eval_packing=None,
        completion_only_loss=None,
        assistant_only_loss=False,
        loss_type="nll",
        activation_offloading=False,
        pad_token=None,
    ),
    DPOConfig: dict(
        learning_rate=1e-6,
        logging_steps=10,
        gradient_checkpointing=True,
        bf16=None,
        pad_to_multiple_of="auto",
        model_init_kwargs=None,
        trust_remote_code=False,
        router_aux_loss_coef=None,
        disable_dropout=True,
        dataset_num_proc=None,
        max_length=1024,
        truncation_mode="keep_start",
        padding_free=False,
        precompute_ref_log_probs=False,
        precompute_ref_batch_size=None,
        loss_type=["sigmoid"],
        loss_weights=None,
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        f_alpha_divergence_coef=0.5,
        label_smoothing=0.0,
        beta=0.1,
        use_weighting=False,
        discopop_tau=0.05,
        activation_offloading=False,
        sync_ref_model=False,
        ref_model_mixup_alpha=0.6,
        ref_model_sync_steps=512,
        pad_token=None,
    ),
    RewardConfig: dict(
        learning_rate=1e-4,
        logging_steps=10,
        gradient_checkpointing=True,
        bf16=None,
        pad_to_multiple_of="auto",
        model_init_kwargs=None,
        trust_remote_code=False,
        chat_template_path=None,
        disable_dropout=True,
        dataset_num_proc=None,
        eos_token=None,
        max_length=1024,
        center_rewards_coefficient=None,
        activation_offloading=False,
        pad_token=None,
    ),
}


@pytest.mark.parametrize("cls", TRL_DEFAULTS, ids=lambda c: c.__name__)
def test_the_configs_have_trls_fields_and_defaults_and_none_is_ignored(cls):

    fields = {f.name: f for f in dataclasses.fields(cls)}
    assert {name: field_default(fields[name]) for name in trl_fields(cls)} == TRL_DEFAULTS[cls]
    # every field is translated, without effect, or refused off its default (the refusals are sampled below)
    rl_only = {
        "log_completions",
        "num_completions_to_print",
        "log_unique_prompts",
        "log_multimodal",
        "ds3_gather_for_generation",
        "disable_dropout",
    }  # NO_EFFECT names GRPO's fields too
    assert (cls.HANDLED | TRANSLATED) <= set(fields) and NO_EFFECT - set(fields) <= rl_only


@pytest.mark.parametrize(
    "cls, field, value, says",
    [
        (SFTConfig, "packing_strategy", "bfd_split", "'bfd', 'wrapped'"),
        (SFTConfig, "loss_type", "mse", "'nll', 'dft'"),
        (SFTConfig, "dataset_kwargs", {"add_special_tokens": False}, "skip_prepare_dataset"),
        (SFTConfig, "shuffle_dataset", True, "only its default"),
        (SFTConfig, "truncation_mode", "keep_end", "default"),
        (SFTConfig, "activation_offloading", True, "only its default"),
        (SFTConfig, "use_liger_kernel", True, "Liger"),
        (SFTConfig, "model_init_kwargs", {"dtype": "auto"}, "'dtype'"),
        (SFTConfig, "model_init_kwargs", {"quantization_config": {}}, "'dtype'"),
        (DPOConfig, "loss_type", "kto", "one or several of 'sigmoid', 'hinge', 'ipo'"),
        (DPOConfig, "loss_type", ["sigmoid", "kto"], "one or several of"),
        (DPOConfig, "disable_dropout", False, "always"),
        (RewardConfig, "disable_dropout", False, "always"),
        (RewardConfig, "deepspeed", "ds.json", "torchrun"),
        (RewardConfig, "adam_beta1", 0.8, "only its default"),
        (RewardConfig, "label_smoothing_factor", 0.1, "default"),
        (RewardConfig, "lr_scheduler_type", "cosine_with_restarts", "'linear'"),
        (RewardConfig, "save_strategy", "epoch", "'steps'"),
        (SFTConfig, "gradient_checkpointing_kwargs", {"use_reentrant": True, "preserve_rng_state": False}, "only"),
    ],
)
def test_an_unsupported_field_is_refused_in_one_line_naming_it(cls, field, value, says):
    with pytest.raises(ValueError) as err:
        cls(output_dir="out", **{**CPU, field: value}).to_rlhfkit(n_rows=8)
    message = str(err.value)
    assert "\n" not in message and repr(field) in message and says in message


@pytest.mark.parametrize("cls", [SFTConfig, DPOConfig, RewardConfig])
@pytest.mark.parametrize("reentrant", [True, False])
def test_use_reentrant_is_accepted_as_trls_tests_pass_it(cls, reentrant):
    """How the recompute is wired changes no gradient: TRL's tests pass {'use_reentrant': ...} either way."""
    config = cls(output_dir="out", **CPU, gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    assert config.to_rlhfkit(n_rows=8) is not None


@pytest.mark.parametrize(
    "trainer_class, argument, value",
    [
        (SFTTrainer, "data_collator", object()),
        (SFTTrainer, "compute_loss_func", len),
        (DPOTrainer, "quantization_config", {}),
        (RewardTrainer, "quantization_config", {}),
        (RewardTrainer, "optimizers", (object(), None)),
    ],
)
def test_an_unsupported_trainer_argument_is_refused_in_one_line_naming_it(trainer_class, argument, value, models):
    with pytest.raises(ValueError) as err:
        trainer_class(
            models["plain"],
            args=CONFIGS[trainer_class.suffix](output_dir="out", **CPU),
            train_dataset=PREFS,
            **{argument: value},
        )
    assert "\n" not in str(err.value) and argument in str(err.value)


def test_label_smoothing_with_sigmoid_is_as_trls_no_smoothing_and_said(capsys):
    ours = DPOConfig(output_dir="out", label_smoothing=0.1, **CPU).to_rlhfkit(n_rows=8)
    assert ours.label_smoothing == 0.0 and "label_smoothing=0.1 has no effect" in capsys.readouterr().err
    assert DPOConfig(output_dir="out", loss_type="ipo", beta=0.5, **CPU).to_rlhfkit(n_rows=8).loss_type == "ipo"
