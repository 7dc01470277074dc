import json

import pytest

from rlhfkit.rewards import math_answer
from rlhfkit.tasks.arithmetic import make_rows, make_splits, write_task_files


def test_rows_are_seeded_and_correct():
    rows = make_rows(50, seed=3)
    assert rows == make_rows(50, seed=3) and rows != make_rows(50, seed=4)
    for row in rows:
        text = row["prompt"][0]["content"]
        a, op, b = text.removeprefix("What is ").split("?")[0].split()
        assert str(eval(f"{a}{op}{b}")) == row["answer"] and text.endswith("Answer with just the number.")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99


def test_splits_are_disjoint_and_eval_does_not_depend_on_train_size():
    train, held = make_splits(500, 64, seed=0)
    key = lambda r: r["prompt"][0]["content"]  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in held}
    assert make_splits(10, 64, seed=0)[1] == held


def test_difficulty_and_bad_settings():
    rows = make_rows(20, 0, digits=3, operators="*-")
    assert all(op in r["prompt"][0]["content"] for r in rows for op in ["*"] if "*" in r["prompt"][0]["content"])
    with pytest.raises(ValueError, match="operators"):
        make_rows(5, 0, operators="/")
    with pytest.raises(ValueError, match="distinct questions"):
        make_rows(200, 0, digits=1)


def test_files_work_with_the_answer_checker(tmp_path):
    paths = write_task_files(tmp_path, n_train=20, n_eval=8)
    rows = [json.loads(line) for line in open(paths["eval.jsonl"])]
    assert len(rows) == 8
    assert math_answer(None, [r["answer"] for r in rows], [r["answer"] for r in rows]) == [1.0] * 8


def test_training_split_can_mix_in_easier_questions():
    train, held = make_splits(200, 32, seed=0, digits=2, train_digits=(1, 2))
    sizes = {len(r["prompt"][0]["content"].split()[2]) for r in train}
    assert sizes == {1, 2}
    assert all(len(r["prompt"][0]["content"].split()[2]) == 2 for r in held)
