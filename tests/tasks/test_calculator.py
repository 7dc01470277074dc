"""The calculator task (tool use on products): disjoint splits, the SFT conversations with their
share of wrong answers, and its CLI: `rlhfkit data --task calculator` and `rlhfkit eval --tool`."""

import json

import pytest

from rlhfkit.cli import main
from rlhfkit.data.sft import encode_sft_rows, load_sft_dataset
from rlhfkit.tasks import calculator
from rlhfkit.tasks.calculator_demo import TINY_TOOLS_TEMPLATE
from rlhfkit.tasks.tiny import chatml_tokenizer, tiny_causal_lm


def test_splits_are_disjoint_products_of_the_requested_sizes():
    train, held = calculator.make_splits(300, 40, seed=3, digits=(3, 2))
    assert len(train) == 300 and len(held) == 40
    assert not {(r["a"], r["b"]) for r in train} & {(r["a"], r["b"]) for r in held}
    assert all(100 <= r["a"] <= 999 and 10 <= r["b"] <= 99 and r["answer"] == str(r["a"] * r["b"]) for r in train)
    assert held[0]["prompt"][0]["content"] == f"What is {held[0]['a']} * {held[0]['b']}? Answer with just the number."
    assert calculator.make_splits(300, 40, seed=3, digits=(3, 2)) == (train, held)
    with pytest.raises(ValueError, match="only 100 distinct products"):
        calculator.make_rows(101, 0, digits=(1, 1))


def test_conversations_call_the_tool_and_a_share_ends_wrong():
    rows = calculator.make_rows(400, 0)
    convs = calculator.tool_conversations(rows, wrong_share=0.25, seed=1)
    wrong = [c for c, r in zip(convs, rows) if c["messages"][-1]["content"] != r["answer"]]
    assert 70 <= len(wrong) <= 130  # ~25 % of 400
    assert all(c["messages"][-1]["content"] == str(r["a"]) for c, r in zip(convs, rows) if c in wrong)
    first = convs[0]["messages"]
    assert first[1]["tool_calls"][0]["function"] == {
        "name": "multiply",
        "arguments": {"a": rows[0]["a"], "b": rows[0]["b"]},
    }
    assert first[2] == {"role": "tool", "name": "multiply", "content": rows[0]["answer"]}
    assert convs[0]["tools"][0]["function"]["name"] == "multiply"
    assert calculator.multiply(12, 34) == 408


def test_the_tiny_template_trains_the_call_and_the_answer(tmp_path):
    """Every assistant turn is trained: the tool call and the final answer, never the tool output."""
    rows = calculator.make_rows(2, 0)
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in calculator.tool_conversations(rows)))
    tok = chatml_tokenizer()
    tok.chat_template = TINY_TOOLS_TEMPLATE
    enc = encode_sft_rows(load_sft_dataset(str(path)), tok, max_length=256)[0]
    trained = tok.decode([t for t, m in zip(enc.input_ids, enc.mask) if m])
    call = json.dumps({"name": "multiply", "arguments": {"a": rows[0]["a"], "b": rows[0]["b"]}})
    assert trained == f"<tool_call>{call}</tool_call><|im_end|>{rows[0]['answer']}<|im_end|>"


def test_data_command_writes_the_calculator_files_and_refuses_bad_digits(tmp_path, capsys):
    out = tmp_path / "calc"
    assert (
        main(
            [
                "data",
                str(out),
                "--task",
                "calculator",
                "--factor-digits",
                "3,2",
                "--n-train",
                "50",
                "--wrong-share",
                "0.5",
            ]
        )
        == 0
    )
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    sft = [json.loads(x) for x in (out / "sft.jsonl").read_text().splitlines()]
    assert len(train) == len(sft) == 50 and 100 <= train[0]["a"] <= 999
    assert main(["data", str(tmp_path / "x"), "--task", "calculator", "--factor-digits", "3"]) == 2
    assert "--factor-digits must be two positive integers" in capsys.readouterr().err


def test_eval_command_runs_tool_episodes(tmp_path, capsys):
    tok = chatml_tokenizer()
    model = tiny_causal_lm(tok)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    paths = calculator.write_task_files(tmp_path / "d", n_train=10, n_eval=3)
    template = tmp_path / "t.jinja"
    template.write_text(TINY_TOOLS_TEMPLATE)
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(tmp_path / "m"),
                "--dataset",
                paths["eval.jsonl"],
                "--reward",
                "strict_math_answer",
                "--tool",
                "rlhfkit.tasks.calculator:multiply",
                "--chat-template",
                str(template),
                "--greedy",
                "--max-new-tokens",
                "40",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["metrics"]["eval/turns_mean"] >= 1 and "eval/tool_calls_mean" in result["metrics"]
    assert isinstance(result["samples"][0]["completion"], list)  # a conversation, not a string
    assert (
        main(
            [
                "eval",
                "--model",
                str(tmp_path / "m"),
                "--dataset",
                paths["eval.jsonl"],
                "--reward",
                "strict_math_answer",
                "--tool",
                "no_such_module:f",
            ]
        )
        == 2
    )
    assert "--tool: cannot import 'no_such_module:f'" in capsys.readouterr().err
