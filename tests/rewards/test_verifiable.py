import pytest

from rlhfkit.rewards import (
    REWARD_FUNCTIONS,
    answer_format,
    answers_match,
    exact_match,
    extract_answer,
    get_reward_function,
    math_answer,
    strict_math_answer,
)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("27 + 47 = 78", "78"),
        ("74", "74"),
        ("The answer is 1,234.", "1234"),
        ("-5", "-5"),
        ("x = 0.5", "0.5"),
        ("about 3/4", "3/4"),
        ("so \\boxed{12} and 13", "12"),
        ("", None),
        ("no digits", None),
        (None, None),
        (42, None),
    ],
)
def test_extract_answer_rule(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    "pred,gold,ok",
    [
        ("74", "74", True),
        ("74.0", "74", True),
        ("1/2", "0.5", True),
        ("75", "74", False),
        (None, "74", False),
        ("$x^{2}$", "$x^2$", True),
        ("$2(x+1)$", "$2x+2$", True),
        ("2", "$\\sqrt{4}$", True),
        ("garbage(", "2", False),
    ],
)
def test_answers_match(pred, gold, ok):
    assert answers_match(pred, gold) is ok


def test_math_answer_and_format_and_strict():
    completions = ["27 + 47 = 74", "74", "", "seventy-four", " 74. ", "74 is the answer"]
    answers = ["74"] * len(completions)
    assert math_answer(None, completions, answers) == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert answer_format(None, completions) == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert strict_math_answer(None, completions, answers) == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_exact_match():
    assert exact_match(None, ["Paris", " Paris ", "paris"], ["Paris"] * 3) == [1.0, 1.0, 0.0]


def test_usable_by_name():
    for name in ("math_answer", "answer_format", "strict_math_answer", "exact_match"):
        assert name in REWARD_FUNCTIONS or get_reward_function(f"rlhfkit.rewards.verifiable:{name}")


def test_concise_math_answer_rewards_shorter_right_answers_only():
    from rlhfkit.rewards import concise_math_answer

    scores = concise_math_answer(
        None, ["27 + 42 = 69.", "69", "69.", "68", "", "27 + 42 equals exactly sixty-nine, 69"], ["69"] * 6
    )
    assert scores[1] == 1.0 and scores[0] == pytest.approx(0.45) and scores[2] == pytest.approx(0.95)
    assert scores[3] == 0.0 and scores[4] == 0.0 and scores[5] == 0.0  # 36 extra characters: floor at 0


def test_digit_match_partial_credit_for_bare_numbers_only():
    from rlhfkit.rewards import digit_match

    completions = ["69", "69.", " 68 ", "19", "96", "169", "9", "27 + 42 = 69", "", "sixty-nine", None, "-69", "6.9"]
    scores = digit_match(None, completions, ["69"] * len(completions))
    assert scores[:5] == [1.0, 1.0, 0.5, 0.5, 0.0]  # the share of digits right, place by place
    assert scores[5:] == [0.0] * 8  # the wrong number of digits, not a bare whole number, or the wrong sign
    assert digit_match(None, ["-5", "5", "-4", "-15"], ["-5", "-5", "-5", "-5"]) == [1.0, 0.0, 0.0, 0.0]
    assert digit_match(None, ["1", "0.5"], ["1/2", "0.5"]) == [0.0, 0.0]  # answers that are not whole numbers
    assert "digit_match" in REWARD_FUNCTIONS
