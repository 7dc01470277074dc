"""A reward function that raises: the one-line error ends with where it raised in the user's own
file — the innermost frame that is neither rlhfkit's, the standard library's nor site-packages' —
as ``(file.py:LINE in function)``; nothing when no frame is the user's."""

import json
import os

import pytest
import yaml

from rlhfkit.rewards import RewardFunctions
from rlhfkit.rewards.calling import where_user_code_raised

HERE = os.path.basename(__file__)


def _line(fn, offset):
    return fn.__code__.co_firstlineno + offset


def _raise(funcs):
    with pytest.raises(ValueError) as info:
        RewardFunctions(funcs)(["p1", "p2"], ["c1", "c2"], {"answer": ["a", "b"]})
    return str(info.value)


def parse(text):
    return json.loads(text)  # raises inside the standard library


def through_stdlib(prompts, completions, **kwargs):
    return [parse(c) for c in completions]


def through_site_packages(prompts, completions, **kwargs):
    return yaml.safe_load("[" + completions[0])  # raises inside site-packages' yaml, a message of 6 lines


def through_rlhfkit(prompts, completions, log_metric, **kwargs):
    log_metric("reward/mine", 1.0)  # rlhfkit refuses the name, in rlhfkit's code
    return [1.0] * len(completions)


async def async_raiser(prompts, completions, **kwargs):
    raise RuntimeError("scoring service is down")


def without_kwargs(prompts, completions):  # called with answer=: the TypeError is raised at rlhfkit's call
    return [1.0] * len(completions)


@pytest.mark.parametrize(
    "fn,where",
    [
        (through_stdlib, f"{HERE}:{_line(parse, 1)} in parse"),
        (through_site_packages, f"{HERE}:{_line(through_site_packages, 1)} in through_site_packages"),
        (through_rlhfkit, f"{HERE}:{_line(through_rlhfkit, 1)} in through_rlhfkit"),
        (async_raiser, f"{HERE}:{_line(async_raiser, 1)} in async_raiser"),
    ],
    ids=["stdlib", "site-packages", "rlhfkit", "async"],
)
def test_the_line_ends_with_the_innermost_frame_of_the_users_file(fn, where):
    line = _raise([fn])
    assert line.startswith(f"reward function {fn.__name__!r}") and line.endswith(f"{where})"), line
    assert "\n" not in line
    assert f"tests{os.sep}rewards{os.sep}{HERE}" in line  # relative to the current directory, inside it


def test_nothing_is_added_when_no_frame_is_the_users():
    line = _raise([without_kwargs])
    assert line.endswith("so accept **kwargs"), line


def test_a_file_outside_the_current_directory_is_named_by_its_full_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _raise([async_raiser]).endswith(f"({os.path.abspath(__file__)}:{_line(async_raiser, 1)} in async_raiser)")


def test_an_exception_without_a_traceback_has_no_place():
    assert where_user_code_raised(RuntimeError("never raised")) == ""
