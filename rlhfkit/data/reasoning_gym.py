"""reasoning-gym tasks by name as prompt datasets (``pip install 'rlhfkit[reasoning-gym]'``).

reasoning-gym generates its tasks offline and procedurally, each with its own checker
(``score_answer(answer, entry)``). A source naming one is taken wherever a prompt dataset is —
``RLTrainer(train_dataset=..., eval_dataset=...)``, the ``train_dataset`` / ``eval_dataset`` keys of
``rlhfkit rl`` (YAML or ``key=value``), ``rlhfkit eval --dataset`` — through ``load_prompt_dataset``:

- ``"reasoning_gym:<task>"``, e.g. ``"reasoning_gym:basic_arithmetic"``: ``DEFAULT_SIZE`` rows of the
  task with its default options, seed 0;
- a mapping ``{"reasoning_gym": "basic_arithmetic", "size": 500, "seed": 0, "config": {...},
  "system_prompt": "default"}``, every key but ``reasoning_gym`` optional. ``config``: the task's own
  options (the fields of its config dataclass, e.g. ``{"min_terms": 2, "max_terms": 3}``);
- a weighted mix: ``{"reasoning_gym": {"leg_counting": 1.0, "basic_arithmetic": 2.0}, "config":
  {"leg_counting": {...}}, ...}``, through reasoning-gym's ``CompositeDataset``: each row comes from
  one task, drawn with probability proportional to its weight; ``config`` maps a task to its options.

Each row: ``prompt``, the chat ``[system, user]`` — the system message is reasoning-gym's recommended
prompt, ``reasoning_gym.utils.SYSTEM_PROMPTS["default"]`` (think step by step, then give only the final
answer inside ``<answer>…</answer>``, which is where the reward ``reasoning_gym`` reads it);
``system_prompt`` names another of ``SYSTEM_PROMPTS``, gives the text itself, or is ``None`` for a
user message alone — the user message is the task's question; ``reasoning_gym_task``: the task that
made the row (in a mix, the row's own task); ``reasoning_gym_entry``: the entry as reasoning-gym made
it (``question``, ``answer``, ``metadata``), exactly what the task's ``score_answer`` takes;
``reasoning_gym_config``: the task's options, so that the reward (``rewards/reasoning_gym.py``) scores
with a checker configured like the generator (a few checkers read their options: decimal_arithmetic,
time_intervals, polynomial_equations). Entries are JSON-serialisable, but a JSON round trip turns
their tuples into lists, which the arc_agi and rearc checkers notice: a run records the source, not
the rows, and a rerun generates them again.

Train and eval sets never overlap. reasoning-gym makes item ``i`` of a set with seed ``s`` from
``Random(s + i)``, so sets with neighbouring seeds share most of their items. A set loaded as a
training set is generated with its ``seed`` (default 0); one loaded as an eval set (``eval_dataset``,
``rlhfkit eval``) with ``seed + EVAL_SEED_OFFSET`` (10**9), far from every training stream — so one
source serves as both. A small task can still draw the same question twice: the questions of the
training set loaded last in the process (``RLTrainer`` loads its training set just before its eval
set) are dropped from a reasoning-gym eval set, with a one-line warning naming the tasks; an eval set
left empty is an error.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from typing import Any

PREFIX = "reasoning_gym:"
PINNED = "reasoning-gym==0.1.25"  # the version of the extra (pyproject.toml)
DEFAULT_SIZE = 500  # reasoning-gym's own default
EVAL_SEED_OFFSET = 10**9  # an eval set's seed: the source's seed plus this
MAX_SEED = 2**31  # seed + offset + size stays below 2**32 (numpy's limit, used by some tasks)
MAX_SIZE = 10**6
KEYS = ("reasoning_gym", "size", "seed", "config", "system_prompt")
COLUMNS = ("reasoning_gym_task", "reasoning_gym_entry", "reasoning_gym_config")


def is_reasoning_gym_source(source: Any) -> bool:
    """A ``"reasoning_gym:<task>"`` string or a mapping (a plain dict is no other kind of source)."""
    if isinstance(source, str):
        return source.startswith(PREFIX)
    return isinstance(source, dict) and type(source).__name__ != "DatasetDict"


def prompt_rows(source: Any, name: str, train_rows: list[dict] | None = None) -> Any:
    """``load_prompt_dataset``'s hook: the rows of a reasoning-gym source (a training or, when
    ``name`` starts with "eval", an eval set less every question of ``train_rows``, the training
    set's rows), or any other source unchanged."""
    if not is_reasoning_gym_source(source):
        return source
    spec = parse_source(source, name)
    evaluating = name.startswith("eval")
    rows = generate(spec, evaluating)
    return _without_training_questions(rows, spec["label"], train_rows or []) if evaluating else rows


def import_reasoning_gym(what: str):
    """The ``reasoning_gym`` package, or one line saying how to install it."""
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(
            f"{what}: reasoning-gym is not installed; pip install 'rlhfkit[reasoning-gym]' (or pip install '{PINNED}')"
        ) from None
    return reasoning_gym


def task_names(what: str) -> list[str]:
    """Every task reasoning-gym registers (its "composite" is the mapping form of a mix)."""
    import_reasoning_gym(what)
    from reasoning_gym.factory import DATASETS

    return sorted(n for n in DATASETS if n != "composite")


def check_task(task: Any, what: str) -> str:
    """``task`` if reasoning-gym has it; else one line with the closest names (or all of them)."""
    names = task_names(what)
    if isinstance(task, str) and task in names:
        return task
    hint = did_you_mean(task, names) or f" Tasks: {', '.join(names)}."
    return _fail(f"{what}: unknown reasoning-gym task {task!r}.{hint}")


def check_options(task: str, options: Any, what: str) -> dict:
    """The task's options as a dict, each a field of the task's config dataclass."""
    from reasoning_gym.factory import DATASETS

    if options is None:
        return {}
    if not isinstance(options, dict):
        _fail(
            f"{what}: the options of task {task!r} must be a mapping of option names to values, got "
            f"{type(options).__name__}"
        )
    known = [f.name for f in dataclasses.fields(DATASETS[task][1]) if f.name not in ("seed", "size")]
    for option in options:
        if option in ("seed", "size"):
            _fail(
                f"{what}: task {task!r}: set {option!r} at the top level of the reasoning_gym mapping, "
                "not among the task's options"
            )
        if option not in known:
            hint = did_you_mean(option, known) or f" Its options: {', '.join(known) or '(none)'}."
            _fail(f"{what}: task {task!r} has no option {option!r}.{hint}")
    return dict(options)


def create(task: str, options: dict, what: str, size: int = 1, seed: int = 0):
    """``reasoning_gym.create_dataset(task, size=..., seed=..., **options)``; the task refusing its
    options (its config's ``validate``) is one line naming the task and the options."""
    rg = import_reasoning_gym(what)
    try:
        return rg.create_dataset(task, size=size, seed=seed, **options)
    except (AssertionError, ValueError, TypeError) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        _fail(f"{what}: task {task!r} refused its options {options!r}: {reason}")


def parse_source(source: Any, name: str) -> dict:
    """A source checked and spelled out: label (for messages), tasks (task -> weight), options
    (task -> options), size, seed, system (the system prompt's text, or None). One-line errors."""
    if isinstance(source, str):
        label = f"{name} {source!r}"
        source = {"reasoning_gym": source[len(PREFIX) :]}
    else:
        if "reasoning_gym" not in source:
            unknown = ", ".join(map(repr, source)) or "none"
            hint = next((h for h in (did_you_mean(k, ["reasoning_gym"]) for k in source) if h), "")
            _fail(
                f"{name}: a mapping names reasoning-gym tasks under the key 'reasoning_gym' (keys given: "
                f"{unknown}); other data are a file path, a Hub id, a list of dicts or a datasets.Dataset.{hint}"
            )
        label = f"{name} {PREFIX}" + (
            "+".join(map(str, source["reasoning_gym"]))
            if isinstance(source["reasoning_gym"], dict)
            else str(source["reasoning_gym"])
        )
    import_reasoning_gym(label)
    for key in source:
        if key not in KEYS:
            _fail(
                f"{label}: unknown key {key!r} in a reasoning_gym mapping (keys: {', '.join(KEYS)})."
                f"{did_you_mean(key, KEYS)}"
            )
    given, config = source["reasoning_gym"], source.get("config")
    if isinstance(given, dict):
        if not given:
            _fail(f"{label}: the mix names no task")
        tasks = {check_task(task, label): _weight(task, weight, label) for task, weight in given.items()}
        if config is not None and not isinstance(config, dict):
            _fail(f"{label}: 'config' of a mix maps each task to its options, got {type(config).__name__}")
        for task in config or {}:
            if task not in tasks:
                _fail(
                    f"{label}: 'config' names task {task!r}, which is not in the mix "
                    f"({', '.join(tasks)}).{did_you_mean(task, tasks)}"
                )
        options = {task: check_options(task, (config or {}).get(task), label) for task in tasks}
    else:
        tasks = {check_task(given, label): 1.0}
        options = {given: check_options(given, config, label)}
    return {
        "label": label,
        "tasks": tasks,
        "options": options,
        "size": _integer(source, "size", DEFAULT_SIZE, 1, MAX_SIZE, label),
        "seed": _integer(source, "seed", 0, 0, MAX_SEED - 1, label),
        "system": _system_prompt(source.get("system_prompt", "default"), label),
    }


def generate(spec: dict, evaluating: bool = False) -> list[dict]:
    """The rows of a parsed source (``parse_source``): a training set, or an eval set
    (seed + ``EVAL_SEED_OFFSET``)."""
    seed = spec["seed"] + (EVAL_SEED_OFFSET if evaluating else 0)
    size, label, tasks, options = spec["size"], spec["label"], spec["tasks"], spec["options"]
    if len(tasks) == 1:
        (task,) = tasks
        dataset = create(task, options[task], label, size=size, seed=seed)
    else:
        from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

        specs = [DatasetSpec(task, weight, options[task]) for task, weight in tasks.items()]
        for task in tasks:
            create(task, options[task], label)  # the options refused with the task's name, as for one task
        dataset = CompositeDataset(CompositeConfig(size=size, seed=seed, datasets=specs))
    rows = []
    for i in range(size):
        entry = dataset[i]
        task = entry.get("metadata", {}).get("source_dataset") if len(tasks) > 1 else next(iter(tasks))
        user = {"role": "user", "content": entry["question"]}
        prompt = [{"role": "system", "content": spec["system"]}, user] if spec["system"] else [user]
        rows.append(
            {
                "prompt": prompt,
                "reasoning_gym_task": task,
                "reasoning_gym_entry": entry,
                "reasoning_gym_config": options[task],
            }
        )
    return rows


def _without_training_questions(rows: list[dict], label: str, train_rows: list[dict]) -> list[dict]:
    """An eval set less the questions of the training rows (a one-line warning says how many)."""
    questions = {
        r["reasoning_gym_entry"]["question"] for r in train_rows if isinstance(r.get("reasoning_gym_entry"), dict)
    }
    seen = [i for i, row in enumerate(rows) if row["reasoning_gym_entry"]["question"] in questions]
    if not seen:
        return rows
    tasks = ", ".join(sorted({rows[i]["reasoning_gym_task"] for i in seen}))
    if len(seen) == len(rows):
        _fail(
            f"{label}: every one of its {len(rows)} questions is also in the training set (task {tasks}); "
            "choose other options or a larger eval size"
        )
    warnings.warn(
        f"{label}: dropped {len(seen)} of its {len(rows)} questions, which the training set also "
        f"holds (task {tasks}), so eval and training share no question",
        stacklevel=4,
    )
    dropped = set(seen)
    return [row for i, row in enumerate(rows) if i not in dropped]


def _weight(task: str, weight: Any, label: str) -> float:
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight <= 0:
        _fail(f"{label}: the weight of task {task!r} must be a positive number, got {weight!r}")
    return float(weight)


def _integer(source: dict, key: str, default: int, low: int, high: int, label: str) -> int:
    value = source.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= int(value) <= high:
        _fail(f"{label}: {key!r} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _system_prompt(value: Any, label: str) -> str | None:
    """None, the text of a named reasoning-gym system prompt, or a text given whole."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        _fail(f"{label}: 'system_prompt' must be a name ({', '.join(SYSTEM_PROMPTS)}), a text or null, got {value!r}")
    if value in SYSTEM_PROMPTS:
        return SYSTEM_PROMPTS[value]
    if len(value.split()) == 1:  # one word: a misspelt name, not a prompt
        _fail(
            f"{label}: unknown system prompt {value!r} (names: {', '.join(SYSTEM_PROMPTS)}; a text of several "
            f"words is used as given).{did_you_mean(value, SYSTEM_PROMPTS)}"
        )
    return value


def did_you_mean(name: Any, choices) -> str:
    """``algorithms.registry.did_you_mean``, imported when an error needs it (it loads torch)."""
    from ..algorithms.registry import did_you_mean as hint

    return hint(name, choices)


def _fail(message: str):
    raise ValueError(message)
