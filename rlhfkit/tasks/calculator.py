"""Tool use on arithmetic a small model cannot do in its head: products of multi-digit numbers
with a calculator tool.

A row is ``{"prompt": [user message], "answer": "1776"}`` asking "What is 37 * 48? Answer with just
the number." (``arithmetic.question``). The tool is ``multiply`` (for ``tools=``) or the
``Calculator`` environment (for ``environment_factory=``, one per episode, counting its calls);
the reward is ``strict_math_answer`` on the episode's last assistant message. ``tool_conversations``
writes the SFT warm start: the call, the tool's result and the final answer — optionally a share
with a wrong final answer (the first factor echoed), the noisy demonstrations RL must improve on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .arithmetic import question


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


class Calculator:
    """An environment per episode: its public method ``multiply`` is the tool; ``calls`` counts
    how often the episode used it."""

    def reset(self, **row) -> None:
        self.calls = 0

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.calls += 1
        return a * b


def make_rows(n: int, seed: int, digits: tuple[int, int] = (2, 2), exclude: set | None = None) -> list[dict]:
    """``n`` distinct products ``a * b`` (``digits``: digits of ``a`` and of ``b``), none of
    ``exclude`` (a set of (a, b)), as prompt rows with their answers."""
    lo_hi = [(10 ** (d - 1) if d > 1 else 0, 10**d - 1) for d in digits]
    capacity = (lo_hi[0][1] - lo_hi[0][0] + 1) * (lo_hi[1][1] - lo_hi[1][0] + 1) - len(exclude or ())
    if n > capacity:
        raise ValueError(f"only {capacity} distinct products exist for digits={digits}")
    rng, seen = random.Random(seed), set(exclude or ())
    rows: list[dict] = []
    while len(rows) < n:
        key = (rng.randint(*lo_hi[0]), rng.randint(*lo_hi[1]))
        if key not in seen:
            seen.add(key)
            rows.append(
                {
                    "prompt": [{"role": "user", "content": question(key[0], "*", key[1])}],
                    "answer": str(key[0] * key[1]),
                    "a": key[0],
                    "b": key[1],
                }
            )
    return rows


def make_splits(n_train: int, n_eval: int, seed: int = 0, digits: tuple[int, int] = (2, 2)):
    """Disjoint (train, eval) splits; the eval split is drawn first, from its own seed."""
    eval_rows = make_rows(n_eval, seed + 1, digits)
    return make_rows(n_train, seed, digits, exclude={(r["a"], r["b"]) for r in eval_rows}), eval_rows


def tool_conversations(rows: list[dict], wrong_share: float = 0.0, seed: int = 0) -> list[dict]:
    """Multi-turn SFT rows for ``rows``: the user's question, the assistant's ``multiply`` call,
    the tool's result and the final answer, with the tool's schema in a ``tools`` column. A
    ``wrong_share`` of them (seeded) end with the first factor instead of the product."""
    from transformers.utils import get_json_schema

    schema, rng = get_json_schema(multiply), random.Random(seed)
    out = []
    for row in rows:
        a, b = row["a"], row["b"]
        call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
        final = str(a) if rng.random() < wrong_share else str(a * b)
        out.append(
            {
                "messages": [
                    *row["prompt"],
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "multiply", "content": str(a * b)},
                    {"role": "assistant", "content": final},
                ],
                "tools": [schema],
            }
        )
    return out


def write_task_files(
    out_dir, seed: int = 0, n_train: int = 2000, n_eval: int = 64, digits=(2, 2), wrong_share: float = 0.0
) -> dict[str, str]:
    """train.jsonl, eval.jsonl (prompt rows) and sft.jsonl (tool conversations of the training
    questions) for the recipes. Returns name -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, eval_rows = make_splits(n_train, n_eval, seed, tuple(digits))
    files = {"train.jsonl": train, "eval.jsonl": eval_rows, "sft.jsonl": tool_conversations(train, wrong_share, seed)}
    paths = {}
    for name, rows in files.items():
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[name] = str(out / name)
    return paths
