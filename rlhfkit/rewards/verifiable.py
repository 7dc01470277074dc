"""Verifiable rewards (RLVR): a math-answer checker, a format reward and exact match, usable by name
from YAML (``reward_funcs: [math_answer, answer_format]``) and from Python. None of them raises on
empty or non-numeric text: such a completion simply scores 0.

Number extraction rule (``extract_answer``): the content of the last ``\\boxed{...}`` if there is
one; otherwise the last number in the completion — an optional minus sign, digits with optional
thousands commas, an optional decimal part or ``/denominator``. "27 + 47 = 78" → "78".
"""

from __future__ import annotations

import re
from fractions import Fraction

from .functions import register_reward_function

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_JUST_A_NUMBER = re.compile(r"^\s*-?\d[\d,]*(?:\.\d+)?(?:/\d+)?\s*\.?\s*$")


def extract_answer(text) -> str | None:
    """The answer a completion gives, by the rule in the module docstring (None: no number)."""
    if not isinstance(text, str):
        return None
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _as_fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, gold) -> bool:
    """Numeric equality when both are numbers (1/2 == 0.5); otherwise symbolic equivalence with
    ``math-verify`` (e.g. expressions, LaTeX). Never raises."""
    if predicted is None or gold is None:
        return False
    gold = str(gold)
    a, b = _as_fraction(predicted), _as_fraction(gold)
    if a is not None and b is not None:
        return a == b
    try:
        from math_verify import parse, verify

        return bool(verify(parse(gold), parse(predicted)))
    except Exception:  # a checker must never stop training: unparseable means wrong
        return False


@register_reward_function("math_answer")
def math_answer(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the completion's answer (``extract_answer``) equals the ``answer`` column, else 0."""
    return [float(answers_match(extract_answer(c), a)) for c, a in zip(completions, answer)]


@register_reward_function("answer_format")
def answer_format(prompts, completions, **columns) -> list[float]:
    """1.0 when the completion is just a number (as "Answer with just the number" asks), else 0."""
    return [float(isinstance(c, str) and bool(_JUST_A_NUMBER.match(c))) for c in completions]


@register_reward_function("strict_math_answer")
def strict_math_answer(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the completion is just a number *and* that number is right (accuracy in the requested form)."""
    fmt = answer_format(prompts, completions)
    return [f * m for f, m in zip(fmt, math_answer(prompts, completions, answer))]


@register_reward_function("exact_match")
def exact_match(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the stripped completion equals the stripped ``answer`` column (case-sensitive)."""
    return [float(isinstance(c, str) and c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


@register_reward_function("concise_math_answer")
def concise_math_answer(prompts, completions, answer, **columns) -> list[float]:
    """For a right answer, 1 minus 0.05 per character beyond the answer itself (0 at 20 extra); 0 for a
    wrong one. A smooth path from "27 + 42 = 69." (0.45) to "69" (1.0), where the all-or-nothing
    format reward gives no gradient until a bare right answer happens to be sampled."""
    out = []
    for c, a, right in zip(completions, answer, math_answer(prompts, completions, answer)):
        extra = len(c.strip()) - len(str(a)) if isinstance(c, str) else 0
        out.append(right * max(0.0, 1.0 - 0.05 * max(0, extra)))
    return out


@register_reward_function("digit_match")
def digit_match(prompts, completions, answer, **columns) -> list[float]:
    """Partial credit for a completion that is just a whole number *with as many digits as the
    answer*: the share of its digits that are right ("68" for 69 → 0.5, "69." → 1.0). A number of
    the wrong length ("169" for 69), any other completion, and answers that are not whole numbers
    score 0. A dense signal for learning to compute an answer directly, where the all-or-nothing
    ``strict_math_answer`` is rarely earned at first; the length gate makes the number of digits
    (the carry into a new place) part of what is rewarded."""
    out = []
    for c, a, bare in zip(completions, answer, answer_format(prompts, completions)):
        gold, got = str(a).strip(), c.strip().rstrip(".").strip() if bare else ""
        same_sign = got.startswith("-") == gold.startswith("-")
        gold, got = gold.lstrip("-"), got.lstrip("-")
        if not (same_sign and gold.isdigit() and got.isdigit() and len(got) == len(gold)):
            out.append(0.0)
            continue
        out.append(sum(x == y for x, y in zip(got, gold)) / len(gold))
    return out
