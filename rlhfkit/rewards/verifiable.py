r"""Verifiable rewards (RLVR): a math-answer checker, a format reward and exact match, usable by name
from YAML (``reward_funcs: [math_answer, answer_format]``) and from Python. None of them raises on
any input (None, empty, garbage, LaTeX that does not parse): such a completion simply scores 0.

Answer extraction rule (``extract_answer``; it returns a string, or None):

1. GSM8K: the number after the last ``####`` wins (``#### 1,234`` → "1234").
2. LaTeX: otherwise, if the text has a ``\boxed{…}`` (or ``\fbox{…}``), the content of the last one
   (nested braces kept; earlier boxes ignored); else, if it has a math span (``$…$``, ``$$…$$``,
   ``\(…\)``, ``\[…\]``), the last one (or one after "final answer is"); else, if it ends in bare
   LaTeX (a run of tokens, none a word, holding ``\``, ``^`` or ``{``: "so x^{2}+1"), that run. It is
   read by math-verify's ``parse`` and returned as its normalised LaTeX (``\dfrac`` → ``\frac``;
   ``\text{}`` units dropped: ``\boxed{5\text{ cm}}`` → "5"), but a plain number in the box is
   returned as written (``\boxed{0.5}`` → "0.5"). A ``$…$`` pair whose content reads as prose (two or
   more tokens, one a word of two or more letters: "$5 and $10") is currency, not a math span.
3. Otherwise (or when step 2 finds nothing): the last number — an optional minus sign, digits, an
   optional decimal part or ``/denominator`` ("27 + 47 = 78" → "78", "about 3/4" → "3/4"). A comma is
   a thousands separator only when exactly three digits follow it: "1,234" → "1234", "1, 2, 3" → "3".
4. No answer: None.

Comparison (``answers_match(predicted, gold)``, used by ``math_answer``):

a. Both plain numbers (as in rule 3; a gold answer holding ``####`` is first reduced by rule 1):
   exact rational equality, without math-verify: 1/2 == 0.5 == "0.50", "1,234" == 1234, 0.333 != 1/3.
b. Otherwise math-verify's ``verify(parse(gold), parse(predicted))``, each side read as LaTeX (``$…$``
   added when it has no delimiters): ``\frac{1}{2}`` == 0.5, ``x^{2}`` == x^2, ``\sqrt{8}`` == 2\sqrt{2}.
c. Never raises: an error, a timeout (``_TIMEOUT_S`` per math-verify call, in the main thread) or a number
   of more than ``_MAX_DIGITS`` digits (``2^{2^{40}}``, which sympy could not finish) is no match.
"""

from __future__ import annotations

import math
import re
import threading
from fractions import Fraction

from .functions import register_reward_function

# --- The rules above, in one place ------------------------------------------------------------------
_NUM = r"-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+"  # rule 3: a plain number
_NUMBER = re.compile(rf"(?<![A-Za-z0-9_.])(?:{_NUM})")  # not inside a word or after a decimal point
_PLAIN_NUMBER = re.compile(rf"\s*\+?(?:{_NUM})\s*")  # the whole string is one plain number
_GSM8K = re.compile(rf"####\s*\$?\s*({_NUM})")  # rule 1
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")  # rule 2
_MATH_SPAN = re.compile(r"(?<!\\)\$|\\\(|\\\[")  # rule 2: opens a math span (once currency is escaped)
_SINGLE_DOLLAR = re.compile(r"(?<![\\$])\$(?!\$)")
_WORD = re.compile(r"\(?[A-Za-z]{2,}[.,;:!?)]*")  # a prose token ("and", "cm.", "(so")
_LATEX_CHAR = re.compile(r"[\\^{]")
_JUST_A_NUMBER = re.compile(r"^\s*-?\d[\d,]*(?:\.\d+)?(?:/\d+)?\s*\.?\s*$")  # answer_format
_TIMEOUT_S = 3.0  # per math-verify call (parse or verify)
_MAX_DIGITS = 10_000  # a larger number in an answer is never evaluated (it could hang)


def _is_prose(tokens: list[str]) -> bool:
    return len(tokens) >= 2 and any(_WORD.fullmatch(t) for t in tokens)


def _escape_currency(text: str) -> str:
    """Escape (``\\$``) every single ``$`` that does not open or close a math span (rule 2)."""
    dollars = [m.start() for m in _SINGLE_DOLLAR.finditer(text)]
    currency, i = [], 0
    while i < len(dollars):
        if i + 1 < len(dollars):
            inner = text[dollars[i] + 1 : dollars[i + 1]]
            if "\n" not in inner and inner.strip() and not _is_prose(inner.split()):
                i += 2
                continue
        currency.append(dollars[i])
        i += 1
    for pos in reversed(currency):
        text = text[:pos] + "\\" + text[pos:]
    return text


def _trailing_latex(text: str) -> str | None:
    """The bare LaTeX expression the text ends with (rule 2), if any."""
    tokens = text.split()
    start = len(tokens)
    while start > 0 and not _WORD.fullmatch(tokens[start - 1]):
        start -= 1
    run = " ".join(tokens[start:]).rstrip(".,;:!?")
    return run if _LATEX_CHAR.search(run) else None


def _time_limited(call):
    """``call(timeout)`` with math-verify's own timeout (``parsing_timeout``/``timeout_seconds``) of
    ``_TIMEOUT_S`` in the main thread, where rlhfkit calls reward functions. math-verify's timeout is
    a SIGALRM, which only the main thread can receive, so elsewhere the call runs without one (None):
    there ``_too_big`` is the only guard (it keeps the known hangs — huge powers and factorials —
    away from sympy), and a slow symbolic comparison runs to its end."""
    if threading.current_thread() is threading.main_thread():
        return call(max(1, math.ceil(_TIMEOUT_S)))
    return call(None)


_FACTORIAL_LIKE = ("factorial", "factorial2", "subfactorial", "gamma", "binomial")


def _log10_bound(e) -> float:
    """An upper bound on log10 of the size of the numbers sympy may compute from ``e``
    (``10^{10^{10}}`` → 1e10); a symbol counts as 1, so ``x^{10^{10}}`` is big too."""
    import sympy

    if isinstance(e, sympy.Symbol):
        return 1.0
    if isinstance(e, sympy.Integer):
        return abs(int(e)).bit_length() * 0.30103
    if isinstance(e, sympy.Rational):
        return max(abs(e.p).bit_length(), e.q.bit_length()) * 0.30103
    if isinstance(e, sympy.Float):
        return math.log10(abs(float(e)) + 1.0)
    if isinstance(e, sympy.Pow):
        return _log10_bound(e.base) * 10.0 ** min(_log10_bound(e.exp), 300.0)
    if type(e).__name__ in _FACTORIAL_LIKE and e.args:
        n = 10.0 ** min(_log10_bound(e.args[0]), 300.0)
        return n * math.log10(n + 1.0)
    args = list(e) if isinstance(e, sympy.MatrixBase) else getattr(e, "args", ())
    bounds = [_log10_bound(a) for a in args if isinstance(a, (sympy.Basic, sympy.MatrixBase))]
    if isinstance(e, sympy.Mul):
        return sum(bounds)
    return max(bounds, default=0.0) + (1.0 if isinstance(e, sympy.Add) else 0.0)


def _too_big(parsed: list) -> bool:
    """Whether a parsed answer holds a number of more than ``_MAX_DIGITS`` digits (sympy could hang
    on it: ``2^{2^{40}}``, ``(10^{9})!``); such an answer matches nothing."""
    try:
        return any(not isinstance(x, str) and _log10_bound(x) > _MAX_DIGITS for x in parsed)
    except Exception:
        return True


def _mv_parse(text: str, latex_only: bool = False) -> list:
    """math-verify's ``parse`` (latex_only: LaTeX only, \\boxed before anything else, the last match
    only); [] on any error or timeout."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if latex_only:
        config, mode = [LatexExtractionConfig(boxed_match_priority=0)], "first_match"
    else:
        config, mode = [LatexExtractionConfig(), ExprExtractionConfig()], "any_match"
    try:
        return _time_limited(lambda t: parse(text, config, extraction_mode=mode, parsing_timeout=t)) or []
    except Exception:
        return []


def _gsm8k(text: str) -> str | None:
    found = _GSM8K.findall(text)
    return found[-1].replace(",", "") if found else None


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}``/``\\fbox{…}``, nested braces kept (to the end if unclosed)."""
    opened = list(_BOX_OPEN.finditer(text))
    if not opened:
        return None
    start, depth = opened[-1].end(), 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return text[start:]


def _latex_answer(latex: str) -> str | None:
    """The answer math-verify's ``parse`` reads in ``latex`` (its last match only), as normalised LaTeX."""
    found = _mv_parse(latex, latex_only=True)
    answer = found[-1].strip() if found and isinstance(found[-1], str) else ""
    if not re.search(r"[^\W_]", answer):  # no letter or digit: nothing, or stray markup
        return None
    return answer.replace(",", "") if _PLAIN_NUMBER.fullmatch(answer) else answer


def extract_answer(text) -> str | None:
    """The answer a completion gives, by the rule in the module docstring (None: no answer)."""
    if not isinstance(text, str) or not text.strip():
        return None
    gsm8k = _gsm8k(text)
    if gsm8k is not None:
        return gsm8k
    boxed, answer, escaped = _last_boxed(text), None, _escape_currency(text)
    if boxed is not None and _PLAIN_NUMBER.fullmatch(boxed):
        return boxed.strip().replace(",", "")  # as written, without asking math-verify
    if boxed is not None:
        answer = _latex_answer(f"\\boxed{{{boxed}}}")
    elif _MATH_SPAN.search(escaped):
        answer = _latex_answer(escaped)
    elif (bare := _trailing_latex(text)) is not None:
        answer = _latex_answer(f"${bare}$")
    if answer is not None:
        return answer
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def _as_fraction(text: str) -> Fraction | None:
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def _as_latex(text: str) -> str:
    return text if _MATH_SPAN.search(text) or _BOX_OPEN.search(text) else "$" + text.replace("\n", " ") + "$"


def answers_match(predicted, gold) -> bool:
    """Exact numeric equality when both are plain numbers (1/2 == 0.5); otherwise equivalence by
    math-verify (expressions, LaTeX), as the module docstring says. Never raises."""
    try:
        if predicted is None or gold is None:
            return False
        predicted, gold = str(predicted).strip(), str(gold).strip()
        gold = _gsm8k(gold) or gold
        if not predicted or not gold:
            return False
        a, b = _as_fraction(predicted), _as_fraction(gold)
        if a is not None and b is not None:
            return a == b
        from math_verify import verify

        g, p = _mv_parse(_as_latex(gold)), _mv_parse(_as_latex(predicted))
        if not g or not p or _too_big(g) or _too_big(p):
            return False
        return bool(_time_limited(lambda t: verify(g, p, timeout_seconds=t)))
    except Exception:  # a checker must never stop training: unparseable means wrong
        return False


def final_text(completion) -> str:
    """The answer a completion gives: the string itself, or, for a conversation (an agent's
    messages, as TRL passes conversational completions), the content of its last assistant message
    ("" when it has none). The built-in rewards below score this."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        said = [m.get("content") or "" for m in completion if isinstance(m, dict) and m.get("role") == "assistant"]
        return said[-1] if said else ""
    return completion


@register_reward_function("math_answer")
def math_answer(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the completion's answer (``extract_answer``) equals the ``answer`` column, else 0."""
    completions = [final_text(c) for c in completions]
    return [float(answers_match(extract_answer(c), a)) for c, a in zip(completions, answer)]


@register_reward_function("answer_format")
def answer_format(prompts, completions, **columns) -> list[float]:
    """1.0 when the completion is just a number (as "Answer with just the number" asks), else 0."""
    completions = [final_text(c) for c in completions]
    return [float(isinstance(c, str) and bool(_JUST_A_NUMBER.match(c))) for c in completions]


@register_reward_function("strict_math_answer")
def strict_math_answer(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the completion is just a number *and* that number is right (accuracy in the requested form)."""
    completions = [final_text(c) for c in completions]
    fmt = answer_format(prompts, completions)
    return [f * m for f, m in zip(fmt, math_answer(prompts, completions, answer))]


@register_reward_function("exact_match")
def exact_match(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the stripped completion equals the stripped ``answer`` column (case-sensitive)."""
    completions = [final_text(c) for c in completions]
    return [float(isinstance(c, str) and c.strip() == str(a).strip()) for c, a in zip(completions, answer)]


@register_reward_function("concise_math_answer")
def concise_math_answer(prompts, completions, answer, **columns) -> list[float]:
    """For a right answer, 1 minus 0.05 per character beyond the answer itself (0 at 20 extra); 0 for a
    wrong one. A smooth path from "27 + 42 = 69." (0.45) to "69" (1.0), where the all-or-nothing
    format reward gives no gradient until a bare right answer happens to be sampled."""
    completions = [final_text(c) for c in completions]
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
    completions = [final_text(c) for c in completions]
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
