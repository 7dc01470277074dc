"""SFT data: loading and checking rows (errors name the source, the row and the field), encoding
through encode_pair, and the padded / packed batch layout (labels by position, pad == EOS safe)."""

import json

import pytest
import torch

from rlhfkit.data.encode import Encoded, encode_pair
from rlhfkit.data.sft import IGNORE_INDEX, collate, encode_sft_rows, load_sft_dataset, pack
from rlhfkit.tasks.tiny import char_tokenizer

PAIRS = [{"prompt": "ab=", "completion": "ba", "id": 1}, {"prompt": "xyz=", "completion": "zyx", "id": 7}]
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------- loading


def test_every_source_kind_gives_the_same_rows(tmp_path):
    import datasets

    datasets.disable_progress_bars()
    (tmp_path / "d.json").write_text(json.dumps(PAIRS), encoding="utf-8")
    datasets.Dataset.from_list(PAIRS).to_parquet(str(tmp_path / "d.parquet"))
    sources = [
        PAIRS,
        datasets.Dataset.from_list(PAIRS),
        write_jsonl(tmp_path / "d.jsonl", PAIRS),
        str(tmp_path / "d.json"),
        tmp_path / "d.parquet",
    ]
    for source in sources:
        assert load_sft_dataset(source) == PAIRS, source


def test_messages_and_chat_pairs_are_accepted():
    rows = [{"messages": MESSAGES}, {"prompt": MESSAGES[:1], "completion": [{"role": "assistant", "content": "yo"}]}]
    assert load_sft_dataset(rows) == rows


@pytest.mark.parametrize(
    "row,field,expected",
    [
        ({"prompt": "a"}, None, r"missing field 'completion'"),
        ({"completion": "a"}, None, r"missing field 'prompt'"),
        (
            {"question": "a"},
            None,
            r"missing field 'prompt'.*'messages', 'text' or 'input_ids'.*fields present: 'question'",
        ),
        ({"text": " "}, "text", r"expected a non-empty string, got str"),
        ({"text": 5}, "text", r"expected a non-empty string, got int"),
        ({"prompt": "a", "completion": ""}, "completion", r"empty"),
        ({"prompt": "a", "completion": "   "}, "completion", r"empty"),
        ({"prompt": "", "completion": "b"}, "prompt", r"empty"),
        ({"prompt": "a", "completion": 3}, "completion", r"got int"),
        ({"prompt": "a", "completion": [{"role": "user", "content": "b"}]}, "completion", r"one assistant message"),
        ({"messages": MESSAGES[:1]}, "messages", r"last message must be the assistant's.*'user'"),
        ({"messages": MESSAGES[1:]}, "messages", r"at least one message .* before"),
        ({"messages": []}, "messages", r"empty list"),
        ({"messages": "hi"}, "messages", r"expected a list of chat messages, got str"),
        ({"messages": [MESSAGES[0], {"role": "assistant", "content": ""}]}, "messages", r"content is empty"),
        ({"messages": [{"role": "bot", "content": "x"}, MESSAGES[1]]}, "messages", r"message 0 .*'role'"),
        ({"messages": MESSAGES, "prompt": "a"}, None, r"both 'messages' and 'prompt'"),
    ],
)
def test_bad_rows_name_the_source_row_and_field(row, field, expected):
    with pytest.raises(ValueError, match=expected) as err:
        load_sft_dataset([PAIRS[0], row], name="my_data")
    msg = str(err.value)
    assert msg.startswith("my_data: row index 1 (0-based): ") and "\n" not in msg
    if field:
        assert f"field {field!r}" in msg


def test_file_errors_name_the_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [PAIRS[0], {"prompt": "a", "completion": ""}])
    with pytest.raises(ValueError, match=rf"{path}: line 2: field 'completion': .*empty"):
        load_sft_dataset(path)
    path = write_jsonl(tmp_path / "m.jsonl", [PAIRS[0], PAIRS[1], {"prompt": "a"}])
    with pytest.raises(ValueError, match=rf"{path}: line 3: missing field 'completion'"):
        load_sft_dataset(path)


def test_unreadable_files(tmp_path):
    bad_utf8 = tmp_path / "u.jsonl"
    bad_utf8.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "\xff", "completion": "b"}\n')
    with pytest.raises(ValueError, match=r"u\.jsonl: line 2: not valid UTF-8"):
        load_sft_dataset(bad_utf8)
    bad_json = tmp_path / "j.jsonl"
    bad_json.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a",}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"j\.jsonl: line 2: invalid JSON"):
        load_sft_dataset(bad_json)
    with pytest.raises(ValueError, match=r"data file not found: .*missing\.jsonl"):
        load_sft_dataset(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match=r"d\.jsonl: the dataset is empty"):
        load_sft_dataset(write_jsonl(tmp_path / "d.jsonl", []))
    with pytest.raises(ValueError, match=r"unsupported file type '\.txt'"):
        load_sft_dataset(tmp_path / "d.txt")


# ---------------------------------------------------------------- encoding


def test_encoding_is_encode_pair_and_messages_use_split_messages():
    tok = char_tokenizer()
    rows = [PAIRS[0], {"messages": [{"role": "system", "content": "s"}, *MESSAGES]}]
    encoded = encode_sft_rows(rows, tok, max_length=None)
    assert encoded[0] == encode_pair("ab=", "ba", tok)
    assert encoded[1] == encode_pair(rows[1]["messages"][:2], "yo", tok)
    text = tok.decode(encoded[1].input_ids)
    assert text == "s:s\nu:hi\na:yo<eos>"
    assert tok.decode(encoded[1].input_ids[encoded[1].prompt_len :]) == "yo<eos>"


@pytest.mark.parametrize("max_length", [2, 3, 5, 6, 7, 100])
def test_truncation_follows_encode_pair(max_length):
    tok = char_tokenizer()
    row = {"prompt": "abcd", "completion": "xy"}
    [got] = encode_sft_rows([row], tok, max_length)
    assert got == encode_pair("abcd", "xy", tok, max_length)
    assert len(got.input_ids) == min(max_length, 7) and got.prompt_len >= 1


def test_chat_rows_without_a_chat_template_name_the_row():
    tok = char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"eval: row index 1 \(0-based\): render_prompt: .*no chat template"):
        encode_sft_rows([PAIRS[0], {"messages": MESSAGES}], tok, 16, name="eval")


# ---------------------------------------------------------------- batches


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_labels_are_ignored_exactly_on_prompt_and_padding(pad_is_eos):
    tok = char_tokenizer(pad_is_eos=pad_is_eos)
    encoded = encode_sft_rows(PAIRS, tok, 64)  # lengths 3+2+1 = 6 and 4+3+1 = 8
    batch = collate(encoded, tok.pad_token_id)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    assert batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][0].tolist()[6:] == [pad, pad]
    assert batch["attention_mask"].tolist() == [[1] * 6 + [0, 0], [1] * 8]
    ids = batch["input_ids"].tolist()
    assert batch["labels"].tolist() == [[-100] * 3 + ids[0][3:6] + [-100] * 2, [-100] * 4 + ids[1][4:8]]
    assert batch["labels"][0, 5] == eos and batch["labels"][1, 7] == eos  # the EOS is learned, pad == EOS or not
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 0, 1], list(range(8))]


def test_packing_layout():
    a = Encoded([1, 2, 3, 4], 2, False)
    b = Encoded([5, 6, 7], 1, False)
    c = Encoded([8, 9, 10, 11, 12], 3, False)
    assert pack([a, b, c], 8) == [[a, b], [c]]
    batch = collate([a, b, c], pad_id=0, packing=True, max_length=8)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 0], [8, 9, 10, 11, 12, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, -100, 6, 7, -100], [-100] * 3 + [11, 12] + [-100] * 3]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 0, 1, 2]]
    assert batch["attention_mask"].tolist() == [[1] * 7 + [0], [1] * 5 + [0] * 3]


def test_an_example_never_trains_on_its_first_token():
    """With prompt_len 0, the first token has nothing before it in its example: no label, so in a
    packed row the previous example's last token is never trained to predict it."""
    batch = collate([Encoded([1, 2], 1, False), Encoded([3, 4], 0, False)], pad_id=0, packing=True, max_length=4)
    assert batch["labels"].tolist() == [[-100, 2, -100, 4]]


def test_packing_needs_a_length_and_examples_that_fit():
    with pytest.raises(ValueError, match="packing needs max_length"):
        collate([Encoded([1, 2], 1, False)], 0, packing=True)
    with pytest.raises(ValueError, match="3 tokens > max_length 2"):
        pack([Encoded([1, 2, 3], 1, False)], 2)


def test_collate_tensors_are_long():
    batch = collate([Encoded([1, 2], 1, False)], 0)
    assert all(v.dtype == torch.long for v in batch.values())
    assert batch["labels"][0, 0] == IGNORE_INDEX
