"""Preference datasets (prompt / chosen / rejected / margin) and centre sets: every source kind, and
one-line errors that name the source, the row and the field."""

import json
import math

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhfkit.data import DataFileNotFoundError
from rlhfkit.data.preferences import load_completions, load_preference_dataset

ROW = {"prompt": "2+2=", "chosen": "4", "rejected": "5"}
USER = [{"role": "user", "content": "hi"}]


TOOL_CALL = {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f"}}]}


def reply(text):
    return [{"role": "assistant", "content": text}]


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(path, rows):
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------- sources


def test_list_of_dicts_keeps_every_column_and_copies_rows():
    rows = [dict(ROW, source="x"), {"prompt": USER, "chosen": reply("hello"), "rejected": reply("go"), "margin": 2}]
    out = load_preference_dataset(rows)
    assert out == rows and out[0] is not rows[0]


def test_jsonl_json_parquet_and_datasets_give_the_same_rows(tmp_path):
    rows = [ROW, dict(ROW, chosen="four", margin=0.5)]
    rows = [dict(r, margin=r.get("margin")) for r in rows]  # columnar formats fill gaps with null
    assert load_preference_dataset(jsonl(tmp_path / "d.jsonl", rows)) == rows
    assert load_preference_dataset(write(tmp_path / "d.json", json.dumps(rows))) == rows
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert load_preference_dataset(str(tmp_path / "d.parquet")) == rows
    assert load_preference_dataset(datasets.Dataset.from_list(rows)) == rows


def test_null_margin_means_no_margin():
    assert load_preference_dataset([dict(ROW, margin=None)])[0]["margin"] is None


def test_tokenised_rows_and_tool_calls_before_the_reply_are_rows():
    """TRL's tokenised rows (``chosen_ids`` / ``rejected_ids``, DPO's ``prompt_ids``) and a completion
    whose assistant calls a tool (content null) before its reply."""
    tokenised = [
        {"chosen_ids": [1, 2], "rejected_ids": [3], "margin": 0.5},
        {"prompt_ids": [], "chosen_ids": [4], "rejected_ids": [5]},
    ]
    assert load_preference_dataset(tokenised) == tokenised
    turns = [TOOL_CALL, {"role": "tool", "content": "1"}]
    row = {"prompt": USER, "chosen": turns + reply("one"), "rejected": turns + reply("two")}
    assert load_preference_dataset([row]) == [row]


# ---------------------------------------------------------------- errors: row and field named


@pytest.mark.parametrize(
    "row,message",
    [
        ({"chosen": "a", "rejected": "b"}, r"missing field 'prompt' \(fields present: 'chosen', 'rejected'\)"),
        ({"prompt": "p", "rejected": "b"}, r"row index 1 \(0-based\): missing field 'chosen'"),
        ({"prompt": "p", "chosen": "a"}, r"row index 1 \(0-based\): missing field 'rejected'"),
        (dict(ROW, prompt="  "), r"field 'prompt': the prompt is an empty"),
        (
            dict(ROW, prompt=[{"role": "robot", "content": "x"}]),
            r"field 'prompt': message 0 \(0-based\): 'role' must be",
        ),
        (dict(ROW, chosen=""), r"field 'chosen': the completion is an empty"),
        (dict(ROW, rejected=" \n"), r"field 'rejected': the completion is an empty"),
        (dict(ROW, chosen=3), r"field 'chosen': expected a string or a list of chat messages, got int"),
        (dict(ROW, chosen=[]), r"field 'chosen': the completion is an empty list"),
        (dict(ROW, chosen=USER), r"field 'chosen': the last message must be the assistant's .* got role 'user'"),
        (dict(ROW, rejected=reply("  ")), r"field 'rejected': the assistant's message is empty"),
        (dict(ROW, rejected=[{"role": "assistant"}]), r"field 'rejected': message 0 \(0-based\): 'content' must be"),
        (dict(ROW, rejected="4"), r"fields 'chosen' and 'rejected' are the same completion '4'"),
        (dict(ROW, chosen=reply("5")), r"fields 'chosen' and 'rejected' are the same"),
        (dict(ROW, margin="big"), r"field 'margin': expected a finite number, got str 'big'"),
        (dict(ROW, margin=True), r"field 'margin': expected a finite number, got bool"),
        (dict(ROW, margin=math.nan), r"field 'margin': expected a finite number, got float nan"),
        ([1, 2], r"row index 1 \(0-based\): expected an object \(dict\), got list"),
        ({"chosen_ids": [1, "2"], "rejected_ids": [3]}, r"field 'chosen_ids': expected a list of token ids"),
        ({"chosen_ids": [1], "rejected_ids": []}, r"field 'rejected_ids': the completion is an empty list of token"),
        ({"chosen_ids": [1], "rejected_ids": [2], "prompt_ids": "x"}, r"field 'prompt_ids': expected a list"),
        ({"chosen_ids": [1], "rejected_ids": [2], "margin": "m"}, r"field 'margin': expected a finite number"),
        (dict(ROW, chosen=[TOOL_CALL]), r"field 'chosen': message 0 \(0-based\): 'content' must be a string"),
    ],
)
def test_bad_rows_name_row_and_field(row, message):
    with pytest.raises(ValueError, match=message) as err:
        load_preference_dataset([ROW, row], name="prefs")
    assert str(err.value).startswith("prefs: row index 1 (0-based): ") and "\n" not in str(err.value)


def test_jsonl_errors_name_the_file_and_line(tmp_path):
    path = write(tmp_path / "p.jsonl", json.dumps(ROW) + "\n\n" + json.dumps(dict(ROW, chosen="")) + "\n")
    with pytest.raises(ValueError, match=r"p\.jsonl: line 3: field 'chosen': the completion is an empty"):
        load_preference_dataset(path)
    write(path, json.dumps(ROW) + '\n{"prompt": "a",}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl: line 2: invalid JSON"):
        load_preference_dataset(path)
    path.write_bytes(json.dumps(ROW).encode() + b'\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=r"p\.jsonl: line 2: not valid UTF-8"):
        load_preference_dataset(path)


def test_json_and_parquet_rows_are_one_based(tmp_path):
    path = write(tmp_path / "p.json", json.dumps([ROW, dict(ROW, margin="x")]))
    with pytest.raises(ValueError, match=r"p\.json: row 2 \(1-based\): field 'margin'"):
        load_preference_dataset(path)

    pq.write_table(pa.Table.from_pylist([ROW, dict(ROW, rejected="4")]), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p\.parquet: row 2 \(1-based\): fields 'chosen' and 'rejected'"):
        load_preference_dataset(tmp_path / "p.parquet")


def test_datasets_rows_use_the_name():
    ds = datasets.Dataset.from_list([ROW, dict(ROW, chosen="  ")])
    with pytest.raises(ValueError, match=r"^eval_dataset: row index 1 \(0-based\): field 'chosen'"):
        load_preference_dataset(ds, name="eval_dataset")


def test_missing_file_empty_dataset_and_unknown_source(tmp_path):
    with pytest.raises(DataFileNotFoundError, match=r"data file not found: .*nope\.jsonl"):
        load_preference_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match=r"train_dataset: the dataset is empty"):
        load_preference_dataset([])
    with pytest.raises(ValueError, match=r"unsupported file type '\.csv'"):
        load_preference_dataset(str(tmp_path / "d.csv"))
    with pytest.raises(ValueError, match=r"expected a datasets.Dataset, a list of dicts"):
        load_preference_dataset(42)


# ---------------------------------------------------------------- centre sets


def test_load_completions_accepts_texts_pairs_messages_and_text_rows():
    rows = [
        "hello",
        {"prompt": "p", "completion": "c"},
        {"prompt": USER, "completion": reply("yo")},
        {"messages": USER + reply("sure")},
        {"messages": reply("solo")},
        {"text": "plain"},
    ]
    assert load_completions(rows) == [
        {"prompt": "", "completion": "hello"},
        {"prompt": "p", "completion": "c"},
        {"prompt": USER, "completion": "yo"},
        {"prompt": USER, "completion": "sure"},
        {"prompt": "", "completion": "solo"},
        {"prompt": "", "completion": "plain"},
    ]


@pytest.mark.parametrize(
    "row,message",
    [
        ("", r"the text is an empty string"),
        (3, r"expected a string or an object \(dict\), got int"),
        ({"prompt": "p"}, r"missing field 'completion' .*'messages' or 'text'"),
        ({"prompt": "", "completion": "c"}, r"field 'prompt': the prompt is an empty"),
        ({"prompt": "p", "completion": ""}, r"field 'completion': the completion is an empty"),
        ({"messages": USER}, r"field 'messages': the last message must be the assistant's"),
        ({"text": 5}, r"field 'text': expected a non-empty string, got int"),
    ],
)
def test_load_completions_errors_name_row_and_field(row, message):
    with pytest.raises(ValueError, match=r"^center_dataset: row index 1 \(0-based\): " + message):
        load_completions(["ok", row])


def test_load_completions_from_jsonl(tmp_path):
    path = jsonl(tmp_path / "sft.jsonl", [{"prompt": "p", "completion": "c"}, {"prompt": "p"}])
    with pytest.raises(ValueError, match=r"sft\.jsonl: line 2: missing field 'completion'"):
        load_completions(path)
