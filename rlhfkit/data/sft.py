"""SFT datasets: load and check (prompt, completion) or chat ``messages`` rows, tokenise them with
``encode_pair`` and collate them into padded or packed batches.

Row formats (TRL's "prompt-completion" and "conversational" formats):

* ``{"prompt": P, "completion": C}`` — each a non-empty string or a list of chat messages
  (``C`` as messages: one assistant message, or several starting and ending with the assistant's,
  a conversation's continuation: ``sft_turns.encode_completion_turns``);
* ``{"messages": [..., {"role": "assistant", "content": C}]}`` — the conversation before the last
  assistant turn is the prompt, that turn is the completion (``split_messages``);
* ``{"messages": [...], "tools": [...]}`` with several assistant turns, tool calls
  (``{"role": "assistant", "content": "", "tool_calls": [...]}``) or tool results
  (``{"role": "tool", "content": ...}``): every assistant turn is trained (``sft_turns``), ``tools``
  (optional, JSON schemas) reaching the chat template's ``tools=``;
* ``{"text": T}`` (TRL's "language modeling" format; read only when the row has no prompt,
  completion or messages): every token of ``T`` + EOS is trained; longer than ``max_length``, its
  end is cut (TRL's ``keep_start``);
* ``{"input_ids": [...]}`` with optional ``labels``, ``assistant_masks``, ``completion_mask``
  (a tokenised row, TRL's column names; read as tokens whatever else it holds): ``sft_tokens``.

``completion_only=False`` also trains the prompt's tokens of prompt/completion rows,
``assistant_only=False`` every token of a ``messages`` row (TRL's ``completion_only_loss`` and
``assistant_only_loss``).

Labels are built by *position*: ``-100`` on prompt tokens (multi-turn: outside assistant turns)
and padding, the token id elsewhere — never by comparing ids to the pad id, so the EOS appended to
every completion is learned even when pad == EOS. The model at position ``t`` is trained to
predict ``labels[t + 1]`` (the usual shift).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .encode import Encoded, encode_pair, note_cut, note_unknown, split_messages
from .padding import pad
from .prompts import load_checked_rows, prompt_problem, short_repr, type_name
from .sft_tokens import encode_tokens, tokens_problem
from .sft_turns import (
    TurnsEncoded,
    check_template,
    encode_completion_turns,
    encode_conversation_rows,
    is_multi_turn,
    messages_problem,
    tools_problem,
    turn_problem,
)

IGNORE_INDEX = -100  # label of positions without a loss (torch.nn.functional.cross_entropy's default)


# ---------------------------------------------------------------- loading and checking


def load_sft_dataset(source: Any, name: str = "train_dataset") -> list[dict]:
    """Load and check an SFT dataset; returns one dict per row with all of its columns.

    ``source``: a ``datasets.Dataset``, a list of dicts, or a ``.jsonl`` / ``.json`` / ``.parquet``
    path (as ``load_prompt_dataset``). Raises ``ValueError`` naming the source, the row (1-based
    line / row for files, 0-based index for in-memory data) and the field when a row is malformed.
    """

    def problem(row: dict) -> str | None:
        field, found = sft_row_problem(row)
        return ((f"field {field!r}: " if field else "") + found) if found else None

    return load_checked_rows(source, name, problem)


def sft_row_problem(row: dict) -> tuple[str | None, str | None]:
    """(field, what is wrong with it) for a malformed SFT row, or ``(None, None)``."""
    if "input_ids" in row:  # tokenised: read as tokens whatever else it holds (sft_tokens)
        return tokens_problem(row)
    has_pair, has_messages = "prompt" in row or "completion" in row, "messages" in row
    if "text" in row and not has_pair and not has_messages:
        text = row["text"]
        ok = isinstance(text, str) and text.strip()
        found = f"expected a non-empty string, got {type_name(text)} {short_repr(text)}"
        return (None, None) if ok else ("text", found)
    if has_pair and has_messages:
        return None, "has both 'messages' and 'prompt'/'completion'; use one format per row"
    if has_messages:
        problem = messages_problem(row["messages"])
        return ("messages", problem) if problem else ("tools", tools_problem(row.get("tools")))
    if row.get("tools") is not None:
        return "tools", "tools go with 'messages' rows (the chat template renders them), not prompt/completion rows"
    present = ", ".join(map(repr, row)) or "none"
    for field in ("prompt", "completion"):
        if field not in row:
            return None, (
                f"missing field {field!r} (an SFT row needs 'prompt' and 'completion', "
                f"'messages', 'text' or 'input_ids'; fields present: {present})"
            )
    problem = prompt_problem(row["prompt"])
    if problem:
        return "prompt", problem
    return "completion", _completion_problem(row["completion"])


def _completion_problem(completion: Any) -> str | None:
    if isinstance(completion, str):
        return None if completion.strip() else "the completion is an empty (or whitespace-only) string"
    if is_completion_turns(completion):  # several messages: a conversation's continuation
        for i, msg in enumerate(completion):
            problem = turn_problem(msg)
            if problem:
                return f"message {i} (0-based): {problem}"
        roles = [m["role"] for m in completion]
        ok = roles[0] == "assistant" and roles[-1] == "assistant"
        return (
            None
            if ok
            else f"a chat completion of several messages must start and end with the assistant's, got roles {roles}"
        )
    problem = prompt_problem(completion)
    if problem:
        return problem.replace("the prompt", "the completion")
    if len(completion) != 1 or completion[0]["role"] != "assistant":
        roles = [m["role"] for m in completion]
        return f"a chat completion must be exactly one assistant message, got roles {roles}"
    return None if completion[0]["content"].strip() else "the assistant message's content is empty"


def is_completion_turns(completion: Any) -> bool:
    """Whether a chat completion holds several messages or tool calls (``sft_turns.encode_completion_turns``)."""
    return isinstance(completion, (list, tuple)) and (
        len(completion) > 1 or any(isinstance(m, dict) and m.get("tool_calls") for m in completion)
    )


# ---------------------------------------------------------------- tokenising


def encode_sft_rows(
    rows: list[dict],
    tokenizer,
    max_length: int | None,
    name: str = "train_dataset",
    completion_only: bool = True,
    assistant_only: bool = True,
    end_ids=None,
) -> list[Encoded]:
    """Each checked row → ``encode_pair(prompt, completion, tokenizer, max_length)`` (its truncation
    policy: the prompt loses its start first, then the completion its end and its EOS), or, for a
    multi-turn row (``sft_turns.is_multi_turn``), ``encode_conversation_rows`` (every assistant turn
    trained: one example, or several when the chat template rewrites history; the template checked
    first by ``sft_turns.check_template``), for a ``text`` row ``encode_text``, for a tokenised row
    ``sft_tokens.encode_tokens``. ``completion_only`` / ``assistant_only`` False: every token of a
    prompt/completion / ``messages`` row is trained (see the module docstring). ``end_ids``: the
    model's end ids (``models.loading.eos_token_ids(tokenizer, model)``): a multi-turn row's
    assistant turns end at the first of them (``sft_turns``); None: the tokenizer's EOS alone.
    An encoding error (e.g. chat messages but no chat template) names the row's 0-based index.
    One warning line each says how many rows were cut and how many hold unknown tokens."""
    turns = {i for i, row in enumerate(rows) if "messages" in row and "input_ids" not in row and is_multi_turn(row)}
    several = [
        {"messages": [*r["prompt"], *r["completion"]], "tools": r.get("tools")}
        for r in rows
        if "prompt" in r and "input_ids" not in r and is_completion_turns(r["completion"])
    ]
    if turns or several:
        check_template([rows[i] for i in sorted(turns)] + several, tokenizer)
    out: list[Encoded] = []
    for i, row in enumerate(rows):
        try:
            if "input_ids" in row:
                out.append(encode_tokens(row, max_length, completion_only))
                continue
            if "prompt" in row and is_completion_turns(row["completion"]):
                out += encode_completion_turns(
                    row["prompt"], row["completion"], tokenizer, max_length, row.get("tools") or None,
                    completion_only, assistant_only, end_ids,
                )  # fmt: skip
                continue
            if i in turns:  # one example, or one per run of turns when the template rewrites history
                out += encode_conversation_rows(
                    row["messages"], tokenizer, max_length, row.get("tools") or None, assistant_only, end_ids
                )
                continue
            if "messages" in row:
                (prompt, completion), whole = split_messages(row["messages"]), not assistant_only
            elif "prompt" in row:
                (prompt, completion), whole = (row["prompt"], row["completion"]), not completion_only
            else:
                out.append(encode_text(row["text"], tokenizer, max_length))
                continue
            enc = encode_pair(prompt, completion, tokenizer, max_length)
            out.append(replace(enc, prompt_len=0) if whole else enc)
        except ValueError as e:
            raise ValueError(f"{name}: row index {i} (0-based): {e}") from None
    note_cut(
        name,
        sum(e.cut for e in out),
        len(out),
        "rows",
        max_length,
        "the prompt's start first, then the completion's end and its EOS",
    )
    note_unknown(name, [e.input_ids for e in out], tokenizer)
    return out


def encode_text(text: str, tokenizer, max_length: int | None) -> Encoded:
    """A ``text`` row: its tokens + EOS, every one trained; longer than ``max_length``, the end is
    cut (and ``truncated`` set: its EOS is gone)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    over = max_length is not None and len(ids) > max_length
    return Encoded(ids[:max_length] if over else ids, 0, over, over)


# ---------------------------------------------------------------- batching


def pack(encoded: list[Encoded], max_length: int) -> list[list[Encoded]]:
    """Next-fit packing: examples in order, a new row whenever the next one does not fit in
    ``max_length`` tokens. No example is split across rows."""
    groups: list[list[Encoded]] = []
    used = max_length + 1
    for e in encoded:
        n = len(e.input_ids)
        if n > max_length:
            raise ValueError(f"pack: an example has {n} tokens > max_length {max_length}; encode with max_length")
        if used + n > max_length:
            groups.append([])
            used = 0
        groups[-1].append(e)
        used += n
    return groups


def training_units(encoded: list[Encoded], packing: bool, strategy: str, max_length: int) -> list[list[Encoded]]:
    """The rows a batch is made of: one example each, or packed rows of ``max_length`` tokens by
    ``strategy`` ('next_fit': ``pack``; 'wrapped': ``pack_wrapped``)."""
    if not packing:
        return [[e] for e in encoded]
    return (pack_wrapped if strategy == "wrapped" else pack)(encoded, max_length)


def pack_wrapped(encoded: list[Encoded], max_length: int) -> list[list[Encoded]]:
    """TRL's "wrapped" packing: the examples' tokens one after another, cut every ``max_length``
    tokens (the last row may be shorter). An example may be split across rows, and each row is one
    sequence (positions from 0, attending across the examples in it): a token is trained where it is
    trained in its example (``trained_flags``), an example's first token too, from the one before it."""
    ids = [t for e in encoded for t in e.input_ids]
    flags = [f for e in encoded for f in trained_flags(e)]
    rows: list[list[Encoded]] = []
    for s in range(0, len(ids), max_length):
        chunk, mask = ids[s : s + max_length], tuple(flags[s : s + max_length])
        first = next((j for j, m in enumerate(mask) if m), len(chunk))
        rows.append([TurnsEncoded(chunk, first, False, False, mask=mask)])
    return rows


def trained_flags(e: Encoded) -> list[int]:
    """1 for each token of ``e`` its labels train, its first token included where it is a completion
    token (``example_labels`` leaves the first out: nothing in the example predicts it)."""
    if isinstance(e, TurnsEncoded):
        return list(e.mask)
    return [0] * e.prompt_len + [1] * (len(e.input_ids) - e.prompt_len)


def collate(encoded: list[Encoded], pad_id: int, packing: bool = False, max_length: int | None = None) -> dict:
    """A batch: ``input_ids``, ``attention_mask``, ``labels``, ``position_ids``, all (B, L) long.

    Without packing: one example per row, right-padded to the longest (B = len(encoded));
    ``max_length`` is unused (``encode_pair`` already truncated the examples).
    With packing: ``pack(encoded, max_length)`` rows of exactly ``max_length`` tokens.
    See ``collate_groups`` for the layout.
    """
    if packing:
        if max_length is None:
            raise ValueError("collate: packing needs max_length")
        return collate_groups(pack(encoded, max_length), pad_id, max_length)
    return collate_groups([[e] for e in encoded], pad_id)


def collate_groups(groups: list[list[Encoded]], pad_id: int, length: int | None = None) -> dict:
    """Lay out rows of one or more examples each, right-padded with ``pad_id`` to ``length``
    (default: the longest row).

    Per example starting at column ``s`` with ``n`` tokens and prompt length ``p``:
    ``labels[s + j] = input_ids[s + j]`` for ``p <= j < n``, else ``-100``; ``labels[s]`` is always
    ``-100`` (nothing in the example predicts its first token, and in a packed row this stops
    an example's last token being trained to predict the next example); ``position_ids[s + j] = j``.
    Padding: ``attention_mask`` 0, labels ``-100``, position ids counting from 0 again, so the
    padding is a segment of its own. Position ids restarting at 0 are how transformers'
    ``masking_utils`` (eager, sdpa, flex and flash attention, e.g. Llama, Qwen2, Mistral) detects
    packed sequences and builds a block-diagonal causal mask — but only when the model is called
    with ``attention_mask=None``; models that do not use ``masking_utils`` (e.g. remote code) then
    attend across examples of a packed row.
    """
    width = max(sum(len(e.input_ids) for e in g) for g in groups)
    length = width if length is None else length
    if width > length:
        raise ValueError(f"collate: a row has {width} tokens > length {length}")
    rows = [[t for e in g for t in e.input_ids] for g in groups]
    input_ids, attention_mask = pad(rows, pad_id, min_width=length)
    labels = pad([[t for e in g for t in example_labels(e)] for g in groups], IGNORE_INDEX, min_width=length)[0]
    # each example counts from 0, and so does the padding after the last one
    positions = [
        [j for n in [*(len(e.input_ids) for e in g), length - len(row)] for j in range(n)]
        for g, row in zip(groups, rows)
    ]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": labels,
        "position_ids": torch.tensor(positions, dtype=torch.long),
    }


def example_labels(e: Encoded) -> list[int]:
    """An example's labels (as ``collate_groups`` lays them out): its tokens, ``IGNORE_INDEX`` on
    the prompt and the first token (multi-turn: on the first token and wherever its mask is 0)."""
    if isinstance(e, TurnsEncoded):
        return [IGNORE_INDEX] + [t if m else IGNORE_INDEX for t, m in zip(e.input_ids[1:], e.mask[1:])]
    first = min(max(e.prompt_len, 1), len(e.input_ids))
    return [IGNORE_INDEX] * first + list(e.input_ids[first:])


__all__ = [
    "IGNORE_INDEX",
    "collate",
    "collate_groups",
    "encode_sft_rows",
    "encode_text",
    "example_labels",
    "load_sft_dataset",
    "pack",
    "pack_wrapped",
    "sft_row_problem",
    "trained_flags",
    "training_units",
]
