"""Answer extraction and comparison for math rewards: LaTeX (via math-verify), GSM8K ``####``, thousands
separators, the plain-number fast path, garbage in, and calls from worker threads."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlhfkit.rewards import answers_match, extract_answer, math_answer, verifiable

HALF = r"so \boxed{\frac{1}{2}}"

# (completion, gold answer, expected math_answer score)
PAIRS = [
    # LaTeX answers
    (HALF, "1/2", 1.0),
    (HALF, r"\frac{1}{2}", 1.0),
    (HALF, "0.5", 1.0),
    (r"Thus \boxed{\frac{\sqrt{3}}{2}}.", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"so the answer is \boxed{x^{2}+1}", "x^2+1", 1.0),
    (r"The side is \boxed{5\text{ cm}}", "5", 1.0),
    (r"The answer is $\dfrac{3}{4}$.", "0.75", 1.0),
    (r"Therefore \(x^2\)", "x^2", 1.0),
    (r"$$\sqrt{2}$$", r"\sqrt{2}", 1.0),
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0),
    (r"\[ \frac{7}{2} \]", "3.5", 1.0),
    (r"\boxed{-\frac{1}{2}}", "-0.5", 1.0),
    (r"\boxed{1{,}234}", "1234", 1.0),
    (r"so \boxed{0.5}", r"\frac{1}{2}", 1.0),
    ("The answer is x^{2}", "x^2", 1.0),
    (r"\boxed{\frac12}", 0.5, 1.0),  # a gold answer given as a number
    # plain text, GSM8K
    ("#### 72\nThat is 3 more than 69.", "72", 1.0),  # the number after #### wins
    ("She has 1,234 apples in total.", "1234", 1.0),
    ("It costs $1,234.", 1234, 1.0),
    ("He pays $5 and earns $10, so he keeps 15", "15", 1.0),  # currency, not a math span
    ("The temperature fell to -7", "-7", 1.0),
    ("x = 2.5", "5/2", 1.0),
    ("27 + 45 = 72", "Natalia sold 48 + 24 = 72 clips.\n#### 72", 1.0),  # a full GSM8K solution as gold
    # wrong answers
    (r"\boxed{\frac{1}{3}}", "1/2", 0.0),
    (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
    ("0.333", "1/3", 0.0),  # plain numbers compare exactly
    ("1, 2, 3", "123", 0.0),  # a list, not a thousands separator
    (r"\boxed{x^{2}-1}", "x^2+1", 0.0),
    ("The answer is 7", "-7", 0.0),
    (r"\boxed{2}, not 0.5", "0.5", 0.0),  # the boxed answer wins over a later number
    (r"\boxed{2^{2^{40}}}", "5", 0.0),  # too big to evaluate: no match, and no hang
    # garbage in: 0, never an exception
    (None, "1/2", 0.0),
    ("", "1/2", 0.0),
    (r"\boxed{", "1/2", 0.0),
    ("\\frac{1}{", "1/2", 0.0),
    ("$$$", "1", 0.0),
    ("{^}", "1", 0.0),
    ("7", None, 0.0),
    ("7", "", 0.0),
    (42, "42", 0.0),
    ("garbage(", r"\frac{", 0.0),
]


@pytest.mark.parametrize("completion,gold,score", PAIRS)
def test_math_answer_pairs(completion, gold, score):
    assert math_answer(None, [completion], [gold]) == [score]


def test_the_boxed_fraction_bug_is_fixed():
    assert extract_answer(HALF) == r"\frac{1}{2}"  # was "2": the regex stopped at the inner brace
    assert math_answer(None, [HALF, HALF], ["1/2", r"\frac{1}{2}"]) == [1.0, 1.0]


@pytest.mark.parametrize(
    "text,expected",
    [
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),  # nested braces
        (r"A first guess was \boxed{1}, but on checking it is \boxed{x^{2}+1}.", "x^{2}+1"),  # the last box
        (r"\boxed{1}, no: \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # not the set math-verify reads in both
        (r"\boxed{5\text{ cm}}", "5"),
        (r"\boxed{0.5}", "0.5"),
        (r"\boxed{1,234}", "1234"),
        (r"We get $\dfrac{3}{4}$.", r"\frac{3}{4}"),
        ("so x^{2}+1", "x^{2}+1"),
        ("#### 1,234", "1234"),
        ("#### 72\nthen 5", "72"),
        ("She has 1,234 apples.", "1234"),
        ("1, 2, 3", "3"),
        ("1,23", "23"),
        ("from 3-5", "5"),
        ("x = -0.5.", "-0.5"),
        ("Janet makes 9 * 2 = $18.", "18"),
        ("He pays $5 and earns $10, so 15", "15"),
        (r"\boxed{}", None),
        ("$", None),
        ("{", None),
        ("   ", None),
        (["1"], None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_plain_numbers_take_the_fast_path_without_math_verify(monkeypatch):
    def no_math_verify(*args, **kwargs):
        raise AssertionError("math-verify called for plain numbers")

    monkeypatch.setattr(verifiable, "_mv_parse", no_math_verify)
    assert answers_match("0.5", "1/2") and answers_match("1234", "1,234") and answers_match("-3", -3)
    assert not answers_match("0.5", "1/3") and not answers_match("3", "1, 2, 3")


def test_math_answer_from_a_worker_thread():
    completions = [HALF, r"$\sqrt{2}$", r"\boxed{x^{2}}", "#### 72"]
    answers = ["0.5", r"\sqrt{2}", "x^2", "72"]
    with ThreadPoolExecutor(2) as pool:  # math-verify's SIGALRM timeout would fail here: scores of 0
        scores = list(pool.map(lambda _: math_answer(None, completions, answers), range(4)))
    assert scores == [[1.0] * 4] * 4


def test_a_slow_comparison_in_the_main_thread_is_cut_off(monkeypatch):
    import math_verify

    monkeypatch.setattr(verifiable, "_TIMEOUT_S", 1.0)
    limits, original = [], math_verify.verify

    def spy(*args, **kwargs):  # math-verify's own SIGALRM timeout, as answers_match passes it
        limits.append(kwargs.get("timeout_seconds"))
        return original(*args, **kwargs)

    monkeypatch.setattr(math_verify, "verify", spy)
    start = time.perf_counter()
    assert answers_match("(x+y+z)^{30}", "(x+y+1)^{30}") is False  # uncut, sympy takes ~8 s here
    assert limits == [1]  # the main thread's comparison runs under a 1 s alarm
    assert time.perf_counter() - start < 60.0  # a no-hang bound only (loaded CI machines are slow)
    assert answers_match(r"\frac{1}{2}", "0.5")
