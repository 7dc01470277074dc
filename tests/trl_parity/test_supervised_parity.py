"""SFT, DPO and reward models: one optimizer step of TRL 1.16's trainer and of rlhfkit's drop-in twin
(``rlhfkit.trl``), from the same tiny model directory, data and config keyword arguments, gives the
same weights (``harness.update_difference`` below ``TOLERANCE``; ``pytest -s`` prints each).

Each step takes every row its trainer keeps (``per_device_train_batch_size x
gradient_accumulation_steps`` is at least the dataset): both trainers train on the same rows. Which
rows share a micro-batch is each trainer's own shuffle; each case's docstring says why that cannot
change its step.
"""

from __future__ import annotations

import pytest
from harness import TOLERANCE, start_weights, update_difference, weights

COMMON = dict(
    use_cpu=True,
    bf16=False,
    report_to="none",
    seed=0,
    save_strategy="no",
    learning_rate=1e-3,
    logging_steps=1,
    max_steps=1,
    disable_tqdm=True,
)

WORDS = ["abc", "hello", "xyz 12", "qq", "the cat", "go", "12+3=", "hi there"]
# Every third text, completion or chosen completion already ends with the EOS token (the tiny
# tokenizer's "<eos>"): TRL appends it only to the others, and so must the drop-ins.
EOS = ["", "", "<eos>"]
PROMPT_COMPLETION = [{"prompt": w + "=", "completion": w[::-1] * (1 + i % 3) + EOS[i % 3]} for i, w in enumerate(WORDS)]
TEXT = [{"text": w + " is " + w[::-1] * (1 + i % 2) + EOS[i % 3]} for i, w in enumerate(WORDS)]
PAIRS = [{"prompt": w, "chosen": w[::-1] + "a" + EOS[i % 3], "rejected": w + "zz"} for i, w in enumerate(WORDS)]


def _check(start, theirs, ours) -> None:
    difference = update_difference(start, theirs, ours)
    print(f"update difference {difference:.1e}")
    assert difference < TOLERANCE, difference


def _steps(kind: str, model: str, rows: list[dict], kwargs: dict, tmp_path):
    """TRL's ``<kind>Trainer`` and rlhfkit's, each from ``model`` (a directory), ``rows`` (a
    ``datasets.Dataset``) and its ``<kind>Config(**COMMON | kwargs)``, after their ``max_steps``
    steps (1 unless ``kwargs`` says otherwise)."""
    import trl
    from datasets import Dataset

    import rlhfkit.trl as dropin

    trainers = []
    for name, module in (("trl", trl), ("ours", dropin)):
        config = getattr(module, f"{kind}Config")(output_dir=str(tmp_path / name), **COMMON | kwargs)
        trainer = getattr(module, f"{kind}Trainer")(model=model, args=config, train_dataset=Dataset.from_list(rows))
        trainer.train()
        assert trainer.state.global_step == config.max_steps
        trainers.append(trainer)
    return trainers


# ---------------------------------------------------------------- SFT


def _sft_step(model_dir, rows, kwargs, tmp_path):
    """(TRL's weights, rlhfkit's) after one SFT step."""
    theirs, ours = _steps("SFT", model_dir, rows, kwargs, tmp_path)
    return weights(theirs.model), weights(ours.model)


@pytest.mark.parametrize("completion_only_loss", [None, False])
def test_sft_prompt_completion(model_dir, tmp_path, completion_only_loss):
    """Prompt-completion rows, one micro-step of 8 rows: the loss is the mean over the completion
    tokens (``completion_only_loss`` None, TRL's default for such rows) or over every token but the
    first (False), each completion ended by EOS."""
    kwargs = dict(per_device_train_batch_size=8, completion_only_loss=completion_only_loss)
    theirs, ours = _sft_step(model_dir, PROMPT_COMPLETION, kwargs, tmp_path)
    _check(start_weights(model_dir), theirs, ours)


def test_sft_text_rows(model_dir, tmp_path):
    """Language-modeling rows (``{"text"}``), one micro-step of 8 rows: every token and the EOS after it."""
    theirs, ours = _sft_step(model_dir, TEXT, dict(per_device_train_batch_size=8), tmp_path)
    _check(start_weights(model_dir), theirs, ours)


def test_sft_accumulated_micro_steps(model_dir, tmp_path):
    """2 accumulated micro-steps of 4 prompt-completion rows with different completion lengths: the
    loss is the mean over every completion token of the step (TRL's ``num_items_in_batch``), not the
    mean of the micro-batches' means. With that normalisation which rows share a micro-batch does
    not change the step (right padding is invisible to a causal model), so rlhfkit's shuffle may
    differ from TRL's."""
    kwargs = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2)
    theirs, ours = _sft_step(model_dir, PROMPT_COMPLETION, kwargs, tmp_path)
    _check(start_weights(model_dir), theirs, ours)


def test_sft_truncation(model_dir, tmp_path):
    """``max_length=8`` over prompts of 4 to 9 tokens: TRL's ``keep_start`` keeps each row's first 8
    tokens (a completion loses its end and its EOS) and drops the 2 rows whose prompt fills them. The
    step takes the 6 rows left (``per_device_train_batch_size=6``), so no row of the next epoch joins it."""
    kwargs = dict(per_device_train_batch_size=6, max_length=8)
    theirs, ours = _sft_step(model_dir, PROMPT_COMPLETION, kwargs, tmp_path)
    _check(start_weights(model_dir), theirs, ours)


@pytest.mark.parametrize("scheduler,steps", [("linear", 2), ("cosine", 4), ("constant", 2)])
def test_sft_warmup_schedule(model_dir, tmp_path, scheduler, steps):
    """``warmup_steps=1`` then ``steps`` optimizer steps of all 8 rows (an epoch each, so the
    shuffle cannot change a step): transformers' schedule, whose first update runs at learning rate
    0 (AdamW's moments still take its gradient), then linear [1] or cosine [1, 0.75, 0.25] decay;
    plain ``constant`` ignores the warmup (learning rate 1e-3 from the first step)."""
    kwargs = dict(per_device_train_batch_size=8, warmup_steps=1, lr_scheduler_type=scheduler, max_steps=steps)
    theirs, ours = _sft_step(model_dir, PROMPT_COMPLETION, kwargs, tmp_path)
    _check(start_weights(model_dir), theirs, ours)


# ---------------------------------------------------------------- DPO


def _dpo_step(model_dir, kwargs, tmp_path):
    """(TRL's weights, rlhfkit's) after one DPO step on ``PAIRS`` (each trainer's reference: a
    frozen copy of the initial model)."""
    theirs, ours = _steps("DPO", model_dir, PAIRS, kwargs, tmp_path)
    return weights(theirs.model), weights(ours.model)


def test_dpo_sigmoid_accumulated(model_dir, tmp_path):
    """DPO's sigmoid loss over 2 accumulated micro-steps of 4 pairs: the mean over the step's 8
    pairs. Both micro-batches hold 4 pairs, so the mean of their means is that mean whichever
    pairs share one (rlhfkit's shuffle may differ from TRL's)."""
    kwargs = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, beta=0.1)
    theirs, ours = _dpo_step(model_dir, kwargs, tmp_path)
    _check(start_weights(model_dir), theirs, ours)


def test_dpo_ipo(model_dir, tmp_path):
    """IPO (``loss_type="ipo"``), one micro-step of 8 pairs: TRL's length-averaged log-ratios and its
    target margin 1 / (2 beta)."""
    theirs, ours = _dpo_step(model_dir, dict(per_device_train_batch_size=8, beta=0.1, loss_type="ipo"), tmp_path)
    _check(start_weights(model_dir), theirs, ours)


@pytest.mark.parametrize(
    "loss_type,extra",
    [("robust", dict(label_smoothing=0.1)), ("nca_pair", {}), ("sppo_hard", {}), ("apo_zero", {}), ("apo_down", {})],
)
def test_dpo_paired_losses(model_dir, tmp_path, loss_type, extra):
    """TRL's robust DPO (with its label smoothing), NCA, hard SPPO and APO, one micro-step of 8 pairs:
    rlhfkit's formulas (algorithms/dpo.py) give TRL's loss and step to TRL's weights."""
    kwargs = dict(per_device_train_batch_size=8, beta=0.1, loss_type=loss_type, **extra)
    trl_trainer, our_trainer = _steps("DPO", model_dir, PAIRS, kwargs, tmp_path)
    _check(start_weights(model_dir), weights(trl_trainer.model), weights(our_trainer.model))
    # one AdamW step from the same weights moves by about lr x sign(gradient): the loss itself tells formulas apart
    theirs, ours = trl_trainer.state.log_history[0]["loss"], our_trainer.state.log_history[0]["loss"]
    assert ours == pytest.approx(theirs, rel=1e-3, abs=1e-4), (theirs, ours)


def test_dpo_truncation(model_dir, tmp_path):
    """``max_length=6`` over prompts of 2 to 8 tokens: TRL keeps each sequence's first 6 tokens (a
    completion loses its end and its EOS) and drops the 3 pairs whose prompt fills them; the step
    takes the 5 pairs left."""
    theirs, ours = _dpo_step(model_dir, dict(per_device_train_batch_size=8, max_length=6), tmp_path)
    _check(start_weights(model_dir), theirs, ours)


# ---------------------------------------------------------------- reward model


def _classifier(model_dir: str):
    """The tiny Llama with the score head TRL's RewardTrainer draws for it (``set_seed(0)``, then one label)."""
    from transformers import AutoModelForSequenceClassification, set_seed

    set_seed(0)
    return AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1)


@pytest.fixture(scope="module")
def classifier_dir(model_dir, tmp_path_factory):
    """A saved ``LlamaForSequenceClassification`` with one label (the head of ``_classifier``): a
    reward model whose training continues."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("reward") / "model"
    _classifier(model_dir).save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return str(out)


def _reward_step(model, rows, kwargs, tmp_path):
    """(TRL's weights, rlhfkit's) after one reward-model step from ``model`` (a directory): rlhfkit's
    as its ``save_model`` directory loads into ``AutoModelForSequenceClassification``."""
    from transformers import AutoModelForSequenceClassification

    theirs, ours = _steps("Reward", model, rows, kwargs, tmp_path)
    saved = str(tmp_path / "ours-final")
    ours.save_model(saved)
    return weights(theirs.model), weights(AutoModelForSequenceClassification.from_pretrained(saved))


def test_reward_center_rewards_accumulated(model_dir, tmp_path):
    """From the causal LM's directory (both trainers draw the score head TRL's way: ``set_seed``,
    then ``num_labels=1``), Bradley-Terry plus ``center_rewards_coefficient x mean((r_chosen +
    r_rejected)^2)`` over 2 accumulated micro-steps of 4 pairs: the mean over the step's 8 pairs.
    Both micro-batches hold 4 pairs, so which pairs share one does not change the step (rlhfkit's
    shuffle may differ from TRL's)."""
    kwargs = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, center_rewards_coefficient=0.5)
    theirs, ours = _reward_step(model_dir, PAIRS, kwargs, tmp_path)
    _check(weights(_classifier(model_dir)), theirs, ours)


def test_reward_margin(classifier_dir, tmp_path):
    """From a saved sequence classifier, a ``margin`` column, one micro-step of 8 pairs:
    ``-log sigmoid(r_chosen - r_rejected - margin)``."""
    from transformers import AutoModelForSequenceClassification

    rows = [{**row, "margin": float(i % 4)} for i, row in enumerate(PAIRS)]
    theirs, ours = _reward_step(classifier_dir, rows, dict(per_device_train_batch_size=8), tmp_path)
    _check(weights(AutoModelForSequenceClassification.from_pretrained(classifier_dir)), theirs, ours)


def test_reward_truncation(model_dir, tmp_path):
    """``max_length=12``: TRL drops the 5 pairs with a sequence (prompt + completion + EOS) longer
    than 12 tokens and cuts nothing; the step takes the 3 pairs left."""
    theirs, ours = _reward_step(model_dir, PAIRS, dict(per_device_train_batch_size=8, max_length=12), tmp_path)
    _check(weights(_classifier(model_dir)), theirs, ours)


# ---------------------------------------------------------------- a tokenizer with special tokens


@pytest.fixture(scope="module")
def bos_model_dir(tmp_path_factory):
    """The tiny Llama with a tokenizer that starts every text with a BOS token of its own (as
    Llama's and Gemma's do): TRL tokenises text rows with it."""
    from tokenizers import processors

    from rlhfkit.tasks.tiny import char_tokenizer, tiny_causal_lm

    tok = char_tokenizer()
    tok.add_special_tokens({"bos_token": "<s>"})
    bos = tok.convert_tokens_to_ids("<s>")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    out = tmp_path_factory.mktemp("bos") / "model"
    tiny_causal_lm(tok).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("kind", ["SFT-text", "SFT-prompt-completion", "DPO", "Reward"])
def test_text_rows_with_special_tokens(bos_model_dir, tmp_path, kind):
    """A tokenizer that adds a BOS: TRL tokenises a text row (and a prompt, and prompt + completion +
    EOS as one text) with the tokenizer's special tokens, so every sequence starts with the BOS;
    the completion starts where the prompt's tokens and the whole row's diverge. One micro-step of
    8 rows."""
    kwargs = dict(per_device_train_batch_size=8)
    if kind.startswith("SFT"):
        theirs, ours = _sft_step(bos_model_dir, TEXT if kind == "SFT-text" else PROMPT_COMPLETION, kwargs, tmp_path)
        _check(start_weights(bos_model_dir), theirs, ours)
    elif kind == "DPO":
        theirs, ours = _dpo_step(bos_model_dir, kwargs, tmp_path)
        _check(start_weights(bos_model_dir), theirs, ours)
    else:
        theirs, ours = _reward_step(bos_model_dir, PAIRS, kwargs, tmp_path)
        _check(weights(_classifier(bos_model_dir)), theirs, ours)


# ---------------------------------------------------------------- SFT chat rows

USER, BOT = (lambda c: {"role": "user", "content": c}), (lambda c: {"role": "assistant", "content": c})
CHAT = [{"messages": [USER(w), BOT(w[::-1] * (1 + i % 3))]} for i, w in enumerate(WORDS)]
CHAT_PROMPT_COMPLETION = [
    {"prompt": [USER(w)], "completion": [BOT(w[::-1] * (1 + i % 3))]} for i, w in enumerate(WORDS)
]


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """The tiny Llama with a ChatML tokenizer (its chat template renders the conversations)."""
    from rlhfkit.tasks.tiny import chatml_tokenizer, save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("chat") / "model", tokenizer=chatml_tokenizer(), seed=0)


@pytest.mark.parametrize(
    "rows, completion_only_loss",
    [(CHAT, None), (CHAT_PROMPT_COMPLETION, None), (CHAT_PROMPT_COMPLETION, False)],
    ids=["messages", "prompt-completion", "prompt-completion-every-token"],
)
def test_sft_chat_rows(chat_model_dir, tmp_path, rows, completion_only_loss):
    """Chat rows, one micro-step of 8 rows: the whole conversation through the chat template, no EOS
    added (the template ends the turn); every token of a ``messages`` row, the completion's of a
    prompt-completion row (from where the prompt's rendering with the generation prompt ends)."""
    kwargs = dict(per_device_train_batch_size=8, completion_only_loss=completion_only_loss)
    theirs, ours = _sft_step(chat_model_dir, rows, kwargs, tmp_path)
    _check(start_weights(chat_model_dir), theirs, ours)
