"""Tokenised SFT rows (``data/sft_tokens.py``): which tokens are trained under TRL's column names
(``labels``, ``assistant_masks``, ``completion_mask``), truncation, and a bad column named in one line."""

import pytest

from rlhfkit.data.sft import IGNORE_INDEX, collate, encode_sft_rows, example_labels, load_sft_dataset
from rlhfkit.data.sft_tokens import check_token_ids
from rlhfkit.tasks.tiny import char_tokenizer

TOK = char_tokenizer()


def trained(row, max_length=None, completion_only=True) -> list[int]:
    (e,) = encode_sft_rows(load_sft_dataset([row]), TOK, max_length, completion_only=completion_only)
    return [int(label != IGNORE_INDEX) for label in example_labels(e)]


@pytest.mark.parametrize(
    "columns, completion_only, expected",
    [
        ({}, True, [0, 1, 1, 1, 1]),  # every token but the first (nothing predicts it)
        ({"labels": [5, -100, 7, 8, -100]}, True, [0, 0, 1, 1, 0]),
        ({"assistant_masks": [0, 0, 1, 1, 0]}, False, [0, 0, 1, 1, 0]),  # applies whatever the flags
        ({"completion_mask": [0, 0, 0, 1, 1]}, True, [0, 0, 0, 1, 1]),
        ({"completion_mask": [0, 0, 0, 1, 1]}, False, [0, 1, 1, 1, 1]),  # only with completion_only
        ({"completion_mask": [0, 0, 1, 1, 1], "assistant_masks": [0, 1, 1, 1, 0]}, True, [0, 0, 1, 1, 0]),
        ({"labels": [5, 6, -100, 8, 9], "assistant_masks": [0, 0, 0, 0, 0]}, True, [0, 1, 0, 1, 1]),  # labels win
        ({"attention_mask": [1, 1, 1, 1, 1]}, True, [0, 1, 1, 1, 1]),
    ],
)
def test_which_tokens_are_trained(columns, completion_only, expected):
    assert trained({"input_ids": [5, 6, 7, 8, 9], **columns}, completion_only=completion_only) == expected


def test_a_row_with_input_ids_is_tokens_whatever_else_it_holds_and_keeps_its_start():
    (e,) = encode_sft_rows(load_sft_dataset([{"input_ids": [5, 6, 7, 8, 9], "text": "ignored"}]), TOK, 3)
    assert e.input_ids == [5, 6, 7] and e.cut and e.truncated
    batch = collate([e], TOK.pad_token_id)
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7]]


@pytest.mark.parametrize(
    "row, says",
    [
        ({"input_ids": []}, "field 'input_ids': expected a non-empty list of token ids"),
        ({"input_ids": [1, -2]}, "field 'input_ids': position 1: expected a token id (an integer >= 0), got -2"),
        ({"input_ids": [1, "a"]}, "field 'input_ids': position 1: expected a token id"),
        ({"input_ids": [1, 2], "labels": [1]}, "field 'labels': expected a list as long as input_ids (2)"),
        ({"input_ids": [1, 2], "labels": [1, 3]}, "field 'labels': position 1: expected the token (2) or -100, got 3"),
        ({"input_ids": [1, 2], "assistant_masks": [0, 2]}, "field 'assistant_masks': position 1: expected 0 or 1"),
        ({"input_ids": [1, 2], "attention_mask": [1, 0]}, "position 1: expected 1 (strip a row's padding), got 0"),
    ],
)
def test_a_bad_tokenised_row_is_one_line_naming_row_and_field(row, says):
    with pytest.raises(ValueError) as err:
        load_sft_dataset([{"input_ids": [1, 2]}, row])
    message = str(err.value)
    assert message.startswith("train_dataset: row index 1") and says in message and "\n" not in message


def test_ids_outside_the_models_vocabulary_are_one_line():
    examples = encode_sft_rows(load_sft_dataset([{"input_ids": [1, 2]}, {"input_ids": [3, 99]}]), TOK, None)
    check_token_ids(examples, 100, "train_dataset")
    with pytest.raises(ValueError, match=r"^train_dataset: example 1 \(0-based\) holds token id 99, outside the "):
        check_token_ids(examples, 99, "train_dataset")
