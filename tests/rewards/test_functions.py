"""Reward functions: TRL's calling shape, weighted NaN-sum combination, validity mask, errors that
name the function / row / prompt, and the name registry."""

import functools
import math
import os.path

import numpy as np
import pytest
import torch

from rlhfkit.rewards import (
    REWARD_FUNCTIONS,
    RewardFunctions,
    RewardOutput,
    get_reward_function,
    register_reward_function,
)

PROMPTS = ["What is 2+2? Answer with a number only, please, and be quick about it today.", "Say hi", "3*3="]
COMPLETIONS = ["4", "hi", "9"]


@pytest.fixture(autouse=True)
def clean_registry():
    """Each test sees and leaves the registry as it was."""
    saved = dict(REWARD_FUNCTIONS)
    REWARD_FUNCTIONS.clear()  # start empty: other modules (the embedded tasks) register their own
    yield
    REWARD_FUNCTIONS.clear()
    REWARD_FUNCTIONS.update(saved)


def exact(prompts, completions, answer, **kwargs):
    return [1.0 if c == a else 0.0 for c, a in zip(completions, answer)]


def length(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def returning(values):
    def fn(prompts, completions, **kwargs):
        return values

    return fn


def test_weighted_sum_and_per_function():
    rf = RewardFunctions([exact, length], weights=[2.0, -0.5])
    out = rf(PROMPTS, COMPLETIONS, {"answer": ["4", "hello", "9"]})
    assert isinstance(out, RewardOutput)
    assert out.scores.dtype == torch.float32 and out.scores.shape == (3,)
    torch.testing.assert_close(out.scores, torch.tensor([2 - 0.5, 0 - 1.0, 2 - 0.5]))
    assert list(out.per_function) == ["exact", "length"]
    torch.testing.assert_close(out.per_function["exact"], torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(out.per_function["length"], torch.tensor([1.0, 2.0, 1.0]))
    assert out.valid.dtype == torch.bool and out.valid.all()


def test_default_weights_are_one_and_ints_numpy_scalars_accepted():
    out = RewardFunctions([returning([1, np.float64(0.5), np.int64(2)]), returning((0.5, 0.5, 0.5))])(
        PROMPTS, COMPLETIONS
    )
    torch.testing.assert_close(out.scores, torch.tensor([1.5, 1.0, 2.5]))


def test_none_contributes_nothing_and_all_none_is_invalid():
    rf = RewardFunctions([returning([None, 1.0, None]), returning([None, None, 2.0])], weights=[1.0, 3.0])
    out = rf(PROMPTS, COMPLETIONS)
    torch.testing.assert_close(out.scores, torch.tensor([0.0, 1.0, 6.0]))
    assert out.valid.tolist() == [False, True, True]
    first = out.per_function["fn"]
    assert math.isnan(first[0]) and first[1] == 1.0 and math.isnan(first[2])
    assert not torch.isnan(out.scores).any()


def test_zero_weight_with_none_is_still_nan_free():
    out = RewardFunctions([returning([None, 1.0, 1.0])], weights=[0.0])(PROMPTS, COMPLETIONS)
    assert out.scores.tolist() == [0.0, 0.0, 0.0] and out.valid.tolist() == [False, True, True]


def test_columns_arrive_as_keyword_lists_and_are_copies():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, **kwargs)
        completions.append("mutated")
        kwargs["answer"].clear()
        return [0.0] * 3

    answer = ["4", "hi", "9"]
    rf = RewardFunctions([spy, exact])
    out = rf(PROMPTS, COMPLETIONS, {"answer": answer, "id": [1, 2, 3]})
    assert seen["prompts"] == PROMPTS and seen["id"] == [1, 2, 3] and seen["answer"] == []
    assert answer == ["4", "hi", "9"] and COMPLETIONS == ["4", "hi", "9"]
    assert out.per_function["exact"].tolist() == [1.0, 1.0, 1.0]


def test_empty_batch():
    out = RewardFunctions([length])([], [])
    assert out.scores.shape == (0,) and out.valid.shape == (0,) and out.per_function["length"].shape == (0,)


# ---------------------------------------------------------------- names and weights


class Scorer:
    def __call__(self, prompts, completions, **kwargs):
        return [1.0] * len(completions)


def test_names_default_dedupe_and_custom():
    rf = RewardFunctions([length, length, Scorer(), functools.partial(length), lambda prompts, completions, **k: []])
    assert rf.names == ["length", "length_2", "Scorer", "partial", "<lambda>"]
    assert RewardFunctions([length, exact], names=["a", "a"]).names == ["a", "a_2"]
    assert "length=1" in repr(RewardFunctions([length]))


def test_names_must_match_and_be_strings():
    with pytest.raises(ValueError, match="got 1 names for 2 reward functions"):
        RewardFunctions([length, exact], names=["a"])
    with pytest.raises(ValueError, match="names must be non-empty strings"):
        RewardFunctions([length], names=[""])


def test_weights_length_mismatch():
    with pytest.raises(ValueError, match="got 1 weights for 2 reward functions"):
        RewardFunctions([length, exact], weights=[1.0])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), True, "1"])
def test_weights_must_be_finite_numbers(bad):
    with pytest.raises(ValueError, match=r"weight 1 must be a finite number"):
        RewardFunctions([length, exact], weights=[1.0, bad])


def test_needs_a_non_empty_list():
    with pytest.raises(ValueError, match="non-empty list"):
        RewardFunctions([])
    with pytest.raises(ValueError, match="non-empty list"):
        RewardFunctions(length)


def test_funcs_by_registered_name_or_path():
    register_reward_function("len_reward")(length)
    rf = RewardFunctions(["len_reward", "len_reward", "os.path:join", "os.path:join"])
    assert rf.funcs == [length, length, os.path.join, os.path.join]
    assert rf.names == ["len_reward", "len_reward_2", "join", "join_2"]


# ---------------------------------------------------------------- batch checks


def test_batch_length_mismatches():
    rf = RewardFunctions([length])
    with pytest.raises(ValueError, match="got 3 prompts but 2 completions"):
        rf(PROMPTS, COMPLETIONS[:2])
    with pytest.raises(ValueError, match="column 'answer' must be a list of 3 values, got 2"):
        rf(PROMPTS, COMPLETIONS, {"answer": ["4", "hi"]})
    with pytest.raises(ValueError, match="column 'answer' must be a list of 3 values, got str"):
        rf(PROMPTS, COMPLETIONS, {"answer": "4"})
    with pytest.raises(ValueError, match="column 'completions' clashes"):
        rf(PROMPTS, COMPLETIONS, {"completions": COMPLETIONS})


# ---------------------------------------------------------------- function errors


def test_function_raises_is_chained_and_named():
    def broken(prompts, completions, **kwargs):
        raise KeyError("answer")

    with pytest.raises(ValueError) as err:
        RewardFunctions([length, broken])(PROMPTS, COMPLETIONS)
    msg = str(err.value)
    assert "reward function 'broken' raised KeyError: 'answer'" in msg
    assert repr(PROMPTS[0][:60]) in msg and PROMPTS[0] not in msg
    assert isinstance(err.value.__cause__, KeyError)


def test_missing_kwargs_gets_a_hint():
    def strict(prompts, completions):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"'strict' raised TypeError: .*unexpected keyword.*accept \*\*kwargs"):
        RewardFunctions([strict])(PROMPTS, COMPLETIONS, {"answer": ["4", "hi", "9"]})


@pytest.mark.parametrize(
    "value, expected",
    [
        (torch.tensor([1.0, 2.0, 3.0]), "must return a list of 3 floats (or None), got Tensor; convert"),
        (np.zeros(3), "got ndarray"),
        (1.0, "got float"),
        (None, "got NoneType"),
        ([1.0, 2.0], "returned the wrong number of scores: expected 3, got 2"),
        ([1.0] * 4, "expected 3, got 4"),
    ],
)
def test_wrong_return_container(value, expected):
    with pytest.raises(ValueError) as err:
        RewardFunctions([returning(value)], names=["bad"])(PROMPTS, COMPLETIONS)
    assert "reward function 'bad'" in str(err.value) and expected in str(err.value)


@pytest.mark.parametrize(
    "value, problem",
    [
        (float("nan"), "returned nan at row 2, which is not finite"),
        (float("-inf"), "returned -inf at row 2, which is not finite"),
        (True, "returned True at row 2, which is a bool"),
        ("1.0", "returned '1.0' at row 2, which is not a number (str)"),
        (torch.tensor(1.0), "which is not a number (Tensor)"),
        ([1.0], "returned [1.0] at row 2, which is not a number (list)"),
    ],
)
def test_bad_values_name_row_and_prompt(value, problem):
    with pytest.raises(ValueError) as err:
        RewardFunctions([returning([0.0, None, value])], names=["bad"])(PROMPTS, COMPLETIONS)
    msg = str(err.value)
    assert msg.startswith("reward function 'bad' ") and problem in msg and "prompt '3*3='" in msg


def test_chat_prompt_preview_uses_last_message():
    chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": "x" * 100}]
    with pytest.raises(ValueError, match=r"prompt '" + "x" * 60 + r"'\)"):
        RewardFunctions([returning([math.nan])])([chat], ["c"])


# ---------------------------------------------------------------- registry


def test_register_and_get_by_name():
    @register_reward_function("exact_match")
    def em(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    assert REWARD_FUNCTIONS["exact_match"] is em and get_reward_function("exact_match") is em
    with pytest.raises(ValueError, match="'exact_match' is already registered"):
        register_reward_function("exact_match")(length)
    assert REWARD_FUNCTIONS["exact_match"] is em


def test_register_refuses_non_callable():
    with pytest.raises(ValueError, match="must be callable"):
        register_reward_function("x")(3)


def test_get_callable_as_is():
    assert get_reward_function(length) is length
    scorer = Scorer()
    assert get_reward_function(scorer) is scorer


def test_get_dotted_paths():
    assert get_reward_function("os.path:join") is os.path.join
    assert get_reward_function("os:path.join") is os.path.join


def test_only_the_colon_form_imports_anything(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "this", raising=False)  # `import this` prints: it must not run
    with pytest.raises(ValueError, match="unknown reward function 'this.s'"):
        get_reward_function("this.s")
    with pytest.raises(ValueError, match="unknown reward function 'os.path.join'"):
        get_reward_function("os.path.join")
    assert "this" not in sys.modules


def test_get_dotted_path_errors():
    with pytest.raises(ValueError, match=r"cannot import module 'no_such_pkg_xyz\.mod'") as err:
        get_reward_function("no_such_pkg_xyz.mod:f")
    assert isinstance(err.value.__cause__, ImportError)
    with pytest.raises(ValueError, match=r"module 'os\.path' has no attribute 'nope'"):
        get_reward_function("os.path:nope")
    with pytest.raises(ValueError, match=r"'os:sep' is not callable \(got str\)"):
        get_reward_function("os:sep")
    with pytest.raises(ValueError, match="expected 'package.module:function'"):
        get_reward_function("os:")


def test_unknown_name_lists_registered_and_close_matches():
    register_reward_function("exact_match")(length)
    register_reward_function("format_reward")(length)
    with pytest.raises(ValueError) as err:
        get_reward_function("exact_mach")
    msg = str(err.value)
    assert "unknown reward function 'exact_mach'; registered: exact_match, format_reward." in msg
    assert "Did you mean 'exact_match'?" in msg


def test_unknown_name_with_empty_registry():
    REWARD_FUNCTIONS.clear()
    with pytest.raises(ValueError, match=r"registered: \(none registered\)\. An import path"):
        get_reward_function("anything")


def test_get_refuses_other_types():
    with pytest.raises(ValueError, match="must be a callable or a name, got int"):
        get_reward_function(3)
