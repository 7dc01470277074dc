"""Arithmetic questions for RL with verifiable rewards: seeded, disjoint train / eval splits.

A row is ``{"prompt": [chat message], "answer": "74"}`` with the question "What is 27 + 47? Answer
with just the number." — the form SmolLM2-135M-Instruct answers in sentences ("27 + 47 = 78").
Difficulty: ``digits`` per operand and the operators used.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
INSTRUCTION = "Answer with just the number."


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? {INSTRUCTION}"


def make_rows(n: int, seed: int, digits=2, operators: str = "+", exclude: set | None = None) -> list[dict]:
    """``n`` distinct questions (none of ``exclude``, a set of (a, op, b)) with their answers.
    ``digits``: digits per operand, or a sequence of them to draw from per question (a curriculum
    mix such as (1, 2))."""
    options = (digits,) if isinstance(digits, int) else tuple(digits)
    if not options or min(options) < 1 or any(op not in OPERATORS for op in operators) or not operators:
        raise ValueError(
            f"digits must be >= 1 and operators a non-empty subset of {''.join(OPERATORS)}, got {digits}, {operators!r}"
        )
    ranges = {d: (10 ** (d - 1) if d > 1 else 0, 10**d - 1) for d in options}
    capacity = sum((hi - lo + 1) ** 2 for lo, hi in ranges.values()) * len(operators) - len(exclude or ())
    if n > capacity:
        raise ValueError(f"only {capacity} distinct questions exist for digits={digits}, operators={operators!r}")
    rng, seen = random.Random(seed), set(exclude or ())
    rows: list[dict] = []
    while len(rows) < n:
        lo, hi = ranges[rng.choice(options) if len(options) > 1 else options[0]]  # same draws as before mixes
        key = (rng.randint(lo, hi), rng.choice(operators), rng.randint(lo, hi))
        if key in seen:
            continue
        seen.add(key)
        a, op, b = key
        rows.append({"prompt": [{"role": "user", "content": question(a, op, b)}], "answer": str(OPERATORS[op](a, b))})
    return rows


def make_splits(n_train: int, n_eval: int, seed: int = 0, digits=2, operators: str = "+", train_digits=None):
    """Disjoint (train, eval) splits; the eval split is drawn first so it does not depend on n_train.
    ``train_digits`` (default ``digits``) lets training mix in easier questions."""
    eval_rows = make_rows(n_eval, seed + 1, digits, operators)
    held = {_key(r) for r in eval_rows}
    return make_rows(n_train, seed, train_digits or digits, operators, exclude=held), eval_rows


def _key(row: dict) -> tuple:
    a, op, b = row["prompt"][0]["content"].split("?")[0].removeprefix("What is ").split()
    return int(a), op, int(b)


def write_task_files(
    out_dir,
    seed: int = 0,
    n_train: int = 2000,
    n_eval: int = 64,
    digits: int = 2,
    operators: str = "+",
    train_digits=None,
) -> dict[str, str]:
    """train.jsonl and eval.jsonl for the recipes. Returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, eval_rows = make_splits(n_train, n_eval, seed, digits, operators, train_digits)
    paths = {}
    for name, rows in (("train.jsonl", train), ("eval.jsonl", eval_rows)):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[name] = str(out / name)
    return paths
