"""How RewardFunctions calls a function (rewards/calling.py): TRL's extra keywords only to functions
that take them, ``log_metric`` / ``log_extra`` collected and checked, ``async def`` functions awaited
together; and ``module:function`` found in the current directory, as ``python -m`` finds it."""

from __future__ import annotations

import asyncio
import re
import sys
import time

import pytest

from rlhfkit.rewards import RewardFunctions, get_reward_function
from rlhfkit.rewards.calling import TrainingState

PROMPTS, COMPLETIONS = ["p1", "p2"], ["a", "bb"]


def test_the_extra_keywords_reach_only_the_functions_that_take_them():
    seen = {}

    def everything(prompts, completions, **kwargs):
        seen["everything"] = sorted(kwargs)
        return [1.0, 1.0]

    def ids_only(prompts, completions, completion_ids):
        seen["ids_only"] = completion_ids
        return [1.0, 1.0]

    def plain(prompts, completions):  # written before the contract grew: still called as it was
        return [1.0, 1.0]

    state = TrainingState(global_step=3, max_steps=10)
    out = RewardFunctions([everything, ids_only, plain])(
        PROMPTS, COMPLETIONS, completion_ids=[[1, 2], [3]], trainer_state=state
    )
    assert out.valid.all()
    assert seen["everything"] == ["completion_ids", "log_extra", "log_metric", "trainer_state"]
    assert seen["ids_only"] == [[1, 2], [3]]


def test_log_metric_and_log_extra_are_collected_per_batch_and_checked():
    def logs(prompts, completions, log_metric, log_extra, **kwargs):
        log_metric("chars", 1.0)
        log_metric("chars", 3)
        log_extra("note", [c.upper() for c in completions])
        return [0.0, 0.0]

    out = RewardFunctions([logs])(PROMPTS, COMPLETIONS)
    assert out.metrics == {"chars": [1.0, 3.0]} and out.extra == {"note": ["A", "BB"]}

    def bad(call):
        def fn(prompts, completions, log_metric, log_extra, **kwargs):
            call(log_metric, log_extra)
            return [0.0, 0.0]

        return fn

    for call, problem in [
        (lambda m, e: m("reward/mean", 1.0), "the run's own families"),
        (lambda m, e: m("x", float("nan")), "needs a finite number"),
        (lambda m, e: e("score", [1, 2]), "samples.jsonl's own"),
        (lambda m, e: e("x", [1]), "one value per sample (2), got 1"),
        (lambda m, e: (e("x", [1, 2]), e("x", [1, 2])), "already logged"),
    ]:
        with pytest.raises(ValueError, match=r"^reward function 'fn': .*" + re.escape(problem)):
            RewardFunctions([bad(call)])(PROMPTS, COMPLETIONS)


class AsyncScorer:
    async def __call__(self, prompts, completions, **kwargs):
        await asyncio.sleep(0.2)
        return [2.0] * len(completions)


def test_async_functions_run_concurrently():
    async def slow_a(prompts, completions, **kwargs):
        await asyncio.sleep(0.2)
        return [1.0] * len(completions)

    def sync(prompts, completions, **kwargs):
        return [0.5] * len(completions)

    rewards = RewardFunctions([slow_a, sync, AsyncScorer()])
    rewards(PROMPTS, COMPLETIONS)  # the event loop's thread starts on first use
    start = time.perf_counter()
    out = rewards(PROMPTS, COMPLETIONS)
    elapsed = time.perf_counter() - start
    assert out.per_function["slow_a"].tolist() == [1.0, 1.0] and out.per_function["AsyncScorer"].tolist() == [2.0, 2.0]
    assert out.scores.tolist() == [3.5, 3.5]
    assert 0.19 < elapsed < 0.35, f"two 0.2 s async reward functions took {elapsed:.3f} s"  # together, not 0.4 s


def test_an_async_function_that_raises_is_named():
    async def broken(prompts, completions, **kwargs):
        raise KeyError("answer")

    with pytest.raises(ValueError, match=r"reward function 'broken' raised KeyError: 'answer'"):
        RewardFunctions([broken])(PROMPTS, COMPLETIONS)


def test_module_function_is_found_in_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "my_first_rewards.py").write_text(
        "def fn(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        assert get_reward_function("my_first_rewards:fn")(["p"], ["c"]) == [1.0]
    finally:
        sys.modules.pop("my_first_rewards", None)
    with pytest.raises(ValueError) as err:
        get_reward_function("no_such_module_here:fn")
    msg = str(err.value)
    assert f"no module 'no_such_module_here' in the current directory {tmp_path} and sys.path [" in msg
    assert "\n" not in msg


def test_the_cli_finds_a_module_of_the_current_directory_or_says_where_it_looked(
    tmp_path, monkeypatch, capsys, tiny_model_dir
):
    from rlhfkit.cli import main

    (tmp_path / "cli_rewards.py").write_text(
        "def fn(prompts, completions, **kw):\n    return [1.0] * len(completions)\n"
    )
    (tmp_path / "train.jsonl").write_text('{"prompt": "ab"}\n{"prompt": "cd"}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    common = ["rl", f"model={tiny_model_dir}", "train_dataset=train.jsonl", "max_steps=0", "--quiet"]
    try:
        assert main(common + ["reward_funcs=[cli_rewards:fn]", "output_dir=ok"]) == 0
    finally:
        sys.modules.pop("cli_rewards", None)
    capsys.readouterr()
    assert main(common + ["reward_funcs=[cli_rewardz:fn]", "output_dir=bad"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"no module 'cli_rewardz' in the current directory {tmp_path}" in err and len(err.splitlines()) == 1
