"""The reward ``reasoning_gym``: each completion scored by its task's own checker on the exact entry of
the row it answers — rows of a reasoning-gym dataset (``data/reasoning_gym.py``:
``train_dataset="reasoning_gym:<task>"``) carry the task, the entry and the task's options.

The answer is read as reasoning-gym recommends (its ``extract_answer``): the content of the last
``<answer>…</answer>`` in the completion, stripped; no such tag is no answer (``None``), which the
checkers score 0. It then goes to ``score_answer(answer, entry)`` of a dataset of that task built with
the row's options (checkers such as decimal_arithmetic's read them), so a mix scores every row with
its own task. A completion is text or chat messages (TRL's conversational format: their contents,
joined). A row of another dataset (no task) gets ``None``: the reward does not apply to it. A checker
that raises on a completion scores it 0 (model output is not the checker's to trust); a score that is
not a finite number is 0 too.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..data.reasoning_gym import check_options, check_task, create

_WHAT = "reward reasoning_gym"
_checkers: dict[tuple[str, str], Any] = {}  # (task, options as JSON) -> a dataset of that task


def reasoning_gym_reward(
    prompts: list,
    completions: list,
    reasoning_gym_task: list | None = None,
    reasoning_gym_entry: list | None = None,
    reasoning_gym_config: list | None = None,
    **kwargs,
) -> list[float | None]:
    """TRL's reward shape: one score in [0, 1] per completion (None for a row of no reasoning-gym task)."""
    if reasoning_gym_task is None or reasoning_gym_entry is None:
        raise ValueError(
            "the reward 'reasoning_gym' needs rows of a reasoning-gym dataset (columns reasoning_gym_task "
            "and reasoning_gym_entry), e.g. train_dataset='reasoning_gym:basic_arithmetic'"
        )
    configs = reasoning_gym_config if reasoning_gym_config is not None else [None] * len(completions)
    scores: list[float | None] = []
    for completion, task, entry, options in zip(completions, reasoning_gym_task, reasoning_gym_entry, configs):
        if task is None:
            scores.append(None)
            continue
        if not isinstance(entry, dict):
            raise ValueError(
                f"{_WHAT}: a row of task {task!r} has no entry (reasoning_gym_entry is "
                f"{type(entry).__name__}, expected the entry dict)"
            )
        checker = _checker(task, options)
        try:
            score = float(checker.score_answer(extract_answer(completion), entry))
        except Exception:
            score = 0.0
        scores.append(score if math.isfinite(score) else 0.0)
    return scores


def extract_answer(completion: Any) -> str | None:
    """The last ``<answer>…</answer>`` of a completion (text, or chat messages: their contents joined)."""
    from reasoning_gym.utils import extract_answer as rg_extract_answer

    return rg_extract_answer(completion_text(completion))


def completion_text(completion: Any) -> str:
    """A completion as text: a string as is; chat messages (dicts with ``content``) joined by newlines."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        return "\n".join(str(m.get("content") or "") if isinstance(m, dict) else str(m) for m in completion)
    return "" if completion is None else str(completion)


def _checker(task: str, options: Any):
    """A dataset of ``task`` with ``options`` (its ``score_answer`` is the checker), built once."""
    key = (task, json.dumps(options, sort_keys=True, default=str))
    if key not in _checkers:
        task = check_task(task, _WHAT)
        _checkers[key] = create(task, check_options(task, options, _WHAT), _WHAT)
    return _checkers[key]
