"""Prompt datasets: reading JSONL / JSON / Parquet / datasets / lists, prompt checks with errors
that name the source, the row and the field, and chat-template rendering with a tiny local
tokenizer (nothing is downloaded)."""

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlhfkit.data import DataFileNotFoundError, load_prompt_dataset, prompt_problem, read_jsonl, render_prompt

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def tokenizer():
    """A character-level WordLevel tokenizer wrapped as a PreTrainedTokenizerFast, no chat template."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(set("abcdefghijklmnopqrstuvwxyzBE. <|>\n"))
    vocab = {"[UNK]": 0, "[PAD]": 1, "<eos>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="<eos>")


# ---------------------------------------------------------------- read_jsonl


def test_read_jsonl_skips_blank_lines_and_keeps_order(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"a": 1}\n\n   \n{"a": 2, "b": "é"}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2, "b": "é"}]
    assert read_jsonl(str(path)) == [{"a": 1}, {"a": 2, "b": "é"}]


def test_read_jsonl_accepts_crlf_and_a_byte_order_mark(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n{"a": 2}\r\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_read_jsonl_invalid_json_names_file_and_line(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"a": 1}\n\n{"a": 2,}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl: line 3: invalid JSON") as err:
        read_jsonl(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_read_jsonl_line_not_an_object(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"line 2: expected a JSON object, got list"):
        read_jsonl(path)


def test_read_jsonl_null_line_reports_null(tmp_path):
    path = write(tmp_path / "d.jsonl", "null\n")
    with pytest.raises(ValueError, match=r"line 1: expected a JSON object, got null"):
        read_jsonl(path)


def test_read_jsonl_non_utf8_names_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl: line 2: not valid UTF-8 \(byte 7"):
        read_jsonl(path)


def test_read_jsonl_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match="data file not found") as err:
        read_jsonl(path)
    assert str(path) in str(err.value)
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, DataFileNotFoundError)


def test_read_jsonl_directory(tmp_path):
    with pytest.raises(ValueError, match="got a directory"):
        read_jsonl(tmp_path)


# ---------------------------------------------------------------- load_prompt_dataset: sources


def test_load_jsonl_keeps_every_column(tmp_path):
    rows = [{"prompt": "2+2=", "answer": "4"}, {"prompt": CHAT, "answer": "hello", "id": 7}]
    path = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in rows))
    assert load_prompt_dataset(path) == rows


def test_load_json_list(tmp_path):
    rows = [{"prompt": "a"}, {"prompt": CHAT}]
    assert load_prompt_dataset(write(tmp_path / "d.json", json.dumps(rows))) == rows


def test_load_json_not_a_list(tmp_path):
    with pytest.raises(ValueError, match=r"d\.json: expected a JSON list of objects, got dict"):
        load_prompt_dataset(write(tmp_path / "d.json", '{"prompt": "a"}'))


def test_load_json_invalid(tmp_path):
    with pytest.raises(ValueError, match=r"d\.json: line 2: invalid JSON"):
        load_prompt_dataset(write(tmp_path / "d.json", '[{"prompt": "a"},\n oops]'))


def test_load_json_non_utf8(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(b'[{"prompt": "\xff"}]')
    with pytest.raises(ValueError, match=r"d\.json: not valid UTF-8"):
        load_prompt_dataset(path)


def test_load_json_row_errors_are_one_based(tmp_path):
    path = write(tmp_path / "d.json", json.dumps([{"prompt": "a"}, {"prompt": ""}]))
    with pytest.raises(ValueError, match=r"d\.json: row 2 \(1-based\): field 'prompt'"):
        load_prompt_dataset(path)
    path = write(tmp_path / "e.json", json.dumps([{"prompt": "a"}, 3]))
    with pytest.raises(ValueError, match=r"e\.json: row 2 \(1-based\): expected an object \(dict\), got int"):
        load_prompt_dataset(path)


def test_load_parquet(tmp_path):

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert load_prompt_dataset(path) == rows


def test_load_parquet_chat_prompts_and_bad_row(tmp_path):

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": CHAT}, {"prompt": []}]), path)
    with pytest.raises(ValueError, match=r"d\.parquet: row 2 \(1-based\): field 'prompt': the prompt is an empty list"):
        load_prompt_dataset(path)


def test_load_parquet_corrupt(tmp_path):
    path = write(tmp_path / "d.parquet", "not parquet")
    with pytest.raises(ValueError, match=r"d\.parquet: cannot read Parquet"):
        load_prompt_dataset(path)


def test_load_hf_dataset():
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    assert load_prompt_dataset(datasets.Dataset.from_list(rows)) == rows


def test_load_hf_dataset_bad_row_uses_the_name():
    ds = datasets.Dataset.from_list([{"prompt": "a"}, {"prompt": "  "}])
    with pytest.raises(ValueError, match=r"eval_dataset: row index 1 \(0-based\): field 'prompt': .*whitespace"):
        load_prompt_dataset(ds, name="eval_dataset")


def test_load_dataset_dict_asks_for_a_split():
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a"}])})
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train'\]; pass one split"):
        load_prompt_dataset(dd)


def test_load_list_copies_rows_and_custom_column():
    rows = [{"question": "a", "answer": 1}]
    out = load_prompt_dataset(rows, prompt_column="question")
    assert out == rows and out[0] is not rows[0]
    assert load_prompt_dataset(tuple(rows), prompt_column="question") == rows


# ---------------------------------------------------------------- load_prompt_dataset: errors


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(ValueError, match=r"data file not found: .*missing\.jsonl"):
        load_prompt_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError):
        load_prompt_dataset(str(tmp_path / "missing.parquet"))


def test_unsupported_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"train_dataset: unsupported file type '\.csv'.*\.jsonl, \.json or \.parquet"):
        load_prompt_dataset(tmp_path / "d.csv")
    with pytest.raises(ValueError, match=r"unsupported file type '\(none\)'"):
        load_prompt_dataset(tmp_path / "d")


def test_unsupported_source_type():
    with pytest.raises(ValueError, match=r"train_dataset: expected a datasets\.Dataset, a list of dicts .*got int"):
        load_prompt_dataset(3)


def test_empty_sources(tmp_path):
    with pytest.raises(ValueError, match=r"train_dataset: the dataset is empty"):
        load_prompt_dataset([])
    with pytest.raises(ValueError, match=r"d\.jsonl: the dataset is empty"):
        load_prompt_dataset(write(tmp_path / "d.jsonl", "\n\n"))
    with pytest.raises(ValueError, match=r"d\.json: the dataset is empty"):
        load_prompt_dataset(write(tmp_path / "d.json", "[]"))


def test_jsonl_row_errors_use_the_line_number(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"prompt": "a"}\n\n{"question": "b", "answer": 1}\n')
    with pytest.raises(ValueError) as err:
        load_prompt_dataset(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: line 3: missing field 'prompt'") and "'question', 'answer'" in msg


def test_in_memory_row_not_a_dict():
    with pytest.raises(
        ValueError, match=r"train_dataset: row index 1 \(0-based\): expected an object \(dict\), got str"
    ):
        load_prompt_dataset([{"prompt": "a"}, "b"])


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("", "empty (or whitespace-only) string"),
        (None, "expected a string or a list of chat messages, got null"),
        (5, "got int 5"),
        ({"role": "user", "content": "x"}, "got dict"),
        ([], "empty list of chat messages"),
        (["hi"], "message 0 (0-based): expected a dict with 'role' and 'content', got str"),
        (
            [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}],
            "message 1 (0-based): 'role' must be one of system, user, assistant, tool, got 'bot'",
        ),
        ([{"content": "b"}], "'role' must be one of system, user, assistant, tool, got None"),
        ([{"role": "user"}], "'content' must be a string, got null"),
        ([{"role": "user", "content": ["x"]}], "'content' must be a string, got list"),
    ],
)
def test_bad_prompts_name_source_row_and_field(prompt, expected):
    with pytest.raises(ValueError) as err:
        load_prompt_dataset([{"prompt": "fine"}, {"prompt": prompt}], name="my_data")
    msg = str(err.value)
    assert msg.startswith("my_data: row index 1 (0-based): field 'prompt': ")
    assert expected in msg


def test_prompt_problem_accepts_valid_prompts():
    assert prompt_problem("x") is None
    assert prompt_problem(CHAT) is None
    assert prompt_problem([{"role": "tool", "content": "", "name": "calc"}]) is None


def test_prompt_problem_cuts_long_values():
    problem = prompt_problem(set(range(1000)))
    assert problem.startswith("expected a string or a list of chat messages, got set {0, 1, 2")
    assert problem.endswith("...") and len(problem) < 130


# ---------------------------------------------------------------- render_prompt


def test_render_string_unchanged(tokenizer):
    assert render_prompt("Q: 2+2=", tokenizer) == "Q: 2+2="
    assert render_prompt("Q", None) == "Q"


def test_render_chat_with_template(tokenizer):
    tokenizer.chat_template = TEMPLATE
    assert render_prompt(CHAT, tokenizer) == "<|system|>Be brief.\n<|user|>hi\n<|assistant|>"


def test_render_chat_without_template(tokenizer):
    assert getattr(tokenizer, "chat_template", None) is None
    with pytest.raises(ValueError, match="list of chat messages but the tokenizer .*has no chat template"):
        render_prompt(CHAT, tokenizer)


def test_render_rejects_malformed_prompts(tokenizer):
    tokenizer.chat_template = TEMPLATE
    with pytest.raises(ValueError, match=r"render_prompt: message 0 \(0-based\): 'role'"):
        render_prompt([{"role": "robot", "content": "x"}], tokenizer)
    with pytest.raises(ValueError, match=r"render_prompt: expected a string or a list of chat messages, got int"):
        render_prompt(3, tokenizer)
