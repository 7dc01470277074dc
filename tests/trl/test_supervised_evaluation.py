"""TRL's evaluation API and dataset forms on the supervised drop-ins (rlhfkit/trl/evaluation.py,
log_rows.py, data_forms.py): ``evaluate(eval_dataset=...)`` in every form TRL takes, evaluation
sets by name, ``compute_metrics``, ``state.log_history`` laid out as transformers.Trainer's, a
streaming training set, and TRL's prepared datasets and attributes."""

import math

import datasets
import numpy as np
import pytest
import torch

from rlhfkit.trainers.reward_model import Pair
from rlhfkit.trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer, SFTConfig, SFTTrainer

from .test_supervised_dropin import CPU

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT_PREFS = [
    {"prompt": "ab", "chosen": "cd", "rejected": "zz"},
    {"prompt": "x", "chosen": "yz", "rejected": "q"},
    {"prompt": "hi", "chosen": "yo", "rejected": "no"},
]
SFT_ROWS = [
    {"prompt": "ab", "completion": "cd"},
    {"prompt": "x", "completion": "yz"},
    {"prompt": "q", "completion": "r"},
]
KINDS = {
    "SFT": (SFTConfig, SFTTrainer, SFT_ROWS),
    "DPO": (DPOConfig, DPOTrainer, TEXT_PREFS),
    "Reward": (RewardConfig, RewardTrainer, TEXT_PREFS),
}


def build(kind, model, tmp_path, train=None, eval_dataset=None, compute_metrics=None, **fields):
    config_class, trainer_class, rows = KINDS[kind]
    fields = {"per_device_train_batch_size": 2, "max_steps": 1, "logging_steps": 1, **CPU, **fields}
    args = config_class(output_dir=str(tmp_path / kind), **fields)
    train = rows if train is None else train
    return trainer_class(
        model, args=args, train_dataset=train, eval_dataset=eval_dataset, compute_metrics=compute_metrics
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_evaluate_takes_every_form_trls_evaluate_takes(kind, models, tmp_path):
    rows = KINDS[kind][2]
    trainer = build(kind, models["plain"], tmp_path, eval_dataset={"a": rows, "b": rows[:2]})
    at_init = trainer.evaluate()  # the sets given at construction, each under its name
    assert {"eval_a_loss", "eval_b_loss"} <= set(at_init) and at_init["eval_a_runtime"] > 0
    if kind != "DPO":  # DPO's policy is its reference before training: ln 2 on any set
        assert at_init["eval_a_loss"] != at_init["eval_b_loss"]
    assert trainer.evaluate("a")["eval_loss"] == at_init["eval_a_loss"]
    forms = [
        rows,
        datasets.Dataset.from_list(rows),
        datasets.Dataset.from_list(rows).to_iterable_dataset(),
    ]
    for form in forms:
        assert trainer.evaluate(eval_dataset=form)["eval_loss"] == pytest.approx(at_init["eval_a_loss"])
    named = trainer.evaluate(eval_dataset=datasets.DatasetDict({"x": datasets.Dataset.from_list(rows)}))
    assert named["eval_x_loss"] == pytest.approx(at_init["eval_a_loss"])
    assert trainer.evaluate(eval_dataset=rows, metric_key_prefix="test")["test_loss"] == pytest.approx(
        at_init["eval_a_loss"]
    )
    # each set evaluated is one row of log_history, as transformers.Trainer logs it
    assert [sorted(k for k in r if k.endswith("_loss")) for r in trainer.state.log_history] == [
        ["eval_a_loss"],
        ["eval_b_loss"],
        ["eval_loss"],
        ["eval_loss"],
        ["eval_loss"],
        ["eval_loss"],
        ["eval_x_loss"],
        ["test_loss"],
    ]


def test_evaluate_needs_a_set_and_eval_strategy_needs_one(models, tmp_path):
    trainer = build("Reward", models["plain"], tmp_path)
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        trainer.evaluate()
    with pytest.raises(ValueError, match="no evaluation set of that name"):
        trainer.evaluate("nope")
    with pytest.raises(ValueError, match="didn't pass an `eval_dataset`"):
        build("Reward", models["plain"], tmp_path / "x", eval_strategy="steps")
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        RewardTrainer(models["plain"], args=RewardConfig(output_dir=str(tmp_path / "y"), **CPU))


def test_training_logs_as_trls_trainer(models, tmp_path):
    """Training rows at logging steps (the loss averaged over the window, the grad norm the step's),
    one evaluation row per named set at each evaluation step, the summary last."""
    rows = TEXT_PREFS
    trainer = build(
        "Reward",
        models["plain"],
        tmp_path,
        train=rows * 2,
        eval_dataset={"a": rows, "b": rows[:1]},
        max_steps=4,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=2,
    )
    trainer.train()
    log, steps = trainer.state.log_history, trainer.history
    assert [
        (r["step"], next(k for k in ("loss", "eval_a_loss", "eval_b_loss", "train_loss") if k in r)) for r in log
    ] == [
        (2, "loss"),
        (2, "eval_a_loss"),
        (2, "eval_b_loss"),
        (4, "loss"),
        (4, "eval_a_loss"),
        (4, "eval_b_loss"),
        (4, "train_loss"),
    ]
    assert log[3]["loss"] == pytest.approx((steps[2]["rm/loss"] + steps[3]["rm/loss"]) / 2)
    assert log[3]["accuracy"] == pytest.approx((steps[2]["rm/accuracy"] + steps[3]["rm/accuracy"]) / 2)
    assert log[3]["grad_norm"] == steps[3]["perf/grad_norm"] and log[3]["epoch"] == steps[3]["rm/epoch"]
    assert log[4]["eval_a_loss"] == steps[3]["eval/a/loss"] and log[4]["epoch"] == log[3]["epoch"]
    assert trainer.evaluate("b")["eval_loss"] == pytest.approx(log[5]["eval_b_loss"])  # the weights did not move


def test_eval_on_start_evaluates_before_the_first_step(models, tmp_path):
    trainer = build("SFT", models["plain"], tmp_path, eval_dataset=SFT_ROWS, eval_on_start=True, logging_steps=5)
    trainer.train()
    first, summary = trainer.state.log_history
    assert first["step"] == 0 and "epoch" not in first and math.isfinite(first["eval_loss"])
    assert "train_loss" in summary


def test_compute_metrics_gets_trls_eval_prediction(models, tmp_path):
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction)
        return {"n": len(prediction.predictions)}

    trainer = build(
        "Reward", models["plain"], tmp_path, TEXT_PREFS, TEXT_PREFS, compute_metrics, per_device_eval_batch_size=2
    )
    metrics = trainer.evaluate()
    # per batch of 2 pairs: their chosen scores then their rejected scores
    (prediction,) = seen
    assert metrics["eval_n"] == 6 and prediction.predictions.shape == (6, 1) and prediction.label_ids is None
    pairs = [Pair(row["chosen_ids"], row["rejected_ids"], None) for row in trainer.eval_dataset]
    with torch.no_grad():
        chosen, rejected, _ = trainer._score_pairs(pairs)
    expected = torch.cat([chosen[:2], rejected[:2], chosen[2:], rejected[2:]]).numpy()
    np.testing.assert_allclose(prediction.predictions[:, 0], expected, rtol=1e-5)


def test_sft_compute_metrics_gets_logits_and_labels_and_preprocessing(models, tmp_path):
    seen = []
    config = SFTConfig(output_dir=str(tmp_path / "o"), max_steps=1, per_device_eval_batch_size=2, **CPU)
    trainer = SFTTrainer(
        models["plain"],
        args=config,
        train_dataset=SFT_ROWS,
        eval_dataset=SFT_ROWS,
        compute_metrics=lambda p: seen.append(p) or {"ok": 1.0},
        preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1),
    )
    assert trainer.evaluate()["eval_ok"] == 1.0
    (prediction,) = seen
    ids = [row["input_ids"] for row in trainer.eval_dataset]
    width = max(map(len, ids))
    assert prediction.predictions.shape == prediction.label_ids.shape == (3, width)
    for row, expected, labels in zip(ids, trainer.eval_dataset["labels"], prediction.label_ids, strict=True):
        assert list(labels[: len(row)]) == expected
        assert all(labels[len(row) :] == -100)


def test_batch_eval_metrics_calls_per_batch_with_compute_result(models, tmp_path):
    calls = []
    trainer = build(
        "Reward",
        models["plain"],
        tmp_path,
        TEXT_PREFS,
        TEXT_PREFS,
        lambda p, compute_result: calls.append(compute_result) or {"last": compute_result},
        per_device_eval_batch_size=2,
        batch_eval_metrics=True,
    )
    assert trainer.evaluate()["eval_last"] is True and calls == [False, True]


def test_a_streaming_training_set_is_read_as_far_as_max_steps_takes(models, tmp_path):
    read = []

    def rows():
        for i in range(1000):
            read.append(i)
            yield TEXT_PREFS[i % 3]

    stream = datasets.IterableDataset.from_generator(rows)
    trainer = build("Reward", models["plain"], tmp_path, train=stream, max_steps=2, gradient_accumulation_steps=2)
    assert len(trainer.train_dataset) == 2 * 2 * 2 and len(read) < 20  # max_steps x per_device x accumulation
    trainer.train()
    with pytest.raises(ValueError, match="IterableDataset, whose length is unknown: set max_steps"):
        build("Reward", models["plain"], tmp_path / "x", train=stream, max_steps=-1)


@pytest.mark.parametrize(
    "kind, columns",
    [
        ("SFT", ["input_ids", "labels"]),  # TRL 1.16 builds labels from the masks and drops them
        ("DPO", ["prompt_ids", "chosen_ids", "rejected_ids"]),
        ("Reward", ["chosen_ids", "rejected_ids"]),
    ],
)
def test_trls_prepared_datasets_processing_class_and_tags(kind, columns, models, tmp_path):
    rows = KINDS[kind][2]
    trainer = build(
        kind, models["chat"], tmp_path, eval_dataset=datasets.DatasetDict({"d": datasets.Dataset.from_list(rows)})
    )
    assert trainer.train_dataset.column_names == columns and len(trainer.train_dataset) == len(rows)
    assert list(trainer.eval_dataset) == ["d"] and trainer.eval_dataset["d"].column_names == columns
    assert trainer.processing_class is trainer.tokenizer
    first = trainer.train_dataset[0]
    if kind == "Reward":
        text = rows[0]["prompt"] + rows[0]["chosen"] + trainer.processing_class.eos_token
        assert first["chosen_ids"] == trainer.processing_class(text)["input_ids"]
    tag = {"SFT": "sft", "DPO": "dpo", "Reward": "reward-trainer"}[kind]
    assert {"trl", tag} <= set(trainer.model.model_tags)
    assert math.isfinite(trainer.evaluate()["eval_d_loss"])
