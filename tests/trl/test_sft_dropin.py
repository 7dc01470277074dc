"""The SFT drop-in's TRL forms beyond test_supervised_dropin.py: TRL's loss types, the dataset forms
TRL's SFTTrainer takes (tokenised rows, ``conversations`` of from/value messages, conversational
completions of several messages), packing strategies, TRL's refusals, and a float16 model."""

import pytest

from rlhfkit.trl import SFTConfig

from .test_supervised_dropin import CPU

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_trls_loss_types_are_rlhfkits(loss_type, tmp_path):
    assert SFTConfig(output_dir=str(tmp_path), loss_type=loss_type, **CPU).to_rlhfkit(8).loss_type == loss_type


def _sft(models, tmp_path, rows, **fields):
    from rlhfkit.trl import SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "out"), **{"max_steps": 1, "learning_rate": 1e-3, **CPU, **fields})
    return SFTTrainer(models["plain"], args=args, train_dataset=rows)


def _trained(trainer) -> list[list[int]]:
    from rlhfkit.data.sft import IGNORE_INDEX, example_labels

    return [[int(label != IGNORE_INDEX) for label in example_labels(u[0])] for u in trainer.units]


@pytest.mark.parametrize("completion_only_loss, expected", [(None, [0, 1, 1, 1]), (True, [0, 0, 1, 1])])
def test_tokenised_rows_train_as_trls(completion_only_loss, expected, models, tmp_path):
    # TRL's completion_only_loss=None is True for prompt-completion rows only: a tokenised row's mask is then unused
    row = {"input_ids": [5, 6, 7, 8], "completion_mask": [0, 0, 1, 1]}
    trainer = _sft(models, tmp_path, [row, row], completion_only_loss=completion_only_loss)
    assert _trained(trainer) == [expected, expected]
    trainer.train()


def test_tokenised_rows_left_untrained_by_max_length_are_dropped_as_trl_does(models, tmp_path):
    rows = [
        {"input_ids": [1, 2, 3, 4, 5], "assistant_masks": [0, 0, 0, 1, 1]},
        {"input_ids": [6, 7, 8], "assistant_masks": [1, 1, 1]},
    ]
    with pytest.warns(UserWarning, match="dropped 1 of 2 rows"):
        trainer = _sft(models, tmp_path, rows, max_length=3)
    assert [u[0].input_ids for u in trainer.units] == [[6, 7, 8]]


def test_token_ids_outside_the_models_vocabulary_are_one_line(models, tmp_path):
    with pytest.raises(ValueError, match=r"^train_dataset: example 0 \(0-based\) holds token id 999999, outside"):
        _sft(models, tmp_path, [{"input_ids": [1, 999999]}])


def test_a_float16_model_trains_as_trls_test_trains_it(models, tmp_path):
    # TRL's test_train_model_dtype: float16 weights, learning_rate=0.1; TRL 1.16 itself ends with every weight NaN
    import torch

    trainer = _sft(
        models,
        tmp_path,
        [{"text": "once upon a time"}] * 8,
        max_steps=3,
        learning_rate=0.1,
        model_init_kwargs={"dtype": torch.float16},
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    for name, param in trainer.model.named_parameters():
        assert param.dtype == torch.float16 and torch.isfinite(param).all() and not torch.equal(param, before[name])
