"""Cheap, linear-time checks on a policy's final answer before anything expensive parses it.

Why: the symbolic fallback (math-verify on sympy) will try to evaluate whatever it is given. A 21-character
power tower (`9^{9^{9^{9}}}`) holds a worker until its deadline, `(10^{10})!` likewise, and a 4,300-digit
number trips Python's int-string limit. The policy wrote those answers, so they are wrong answers, and the
cheapest place to say so is here: `answer_problem(text)` returns a one-line reason (the rollout is scored
wrong with it) or None (go on and compare). It runs in microseconds and never raises.

The limits are generous for real final answers (GSM8K / MATH answers are a few dozen characters, with
exponents in the tens) and far below what ties up sympy:

- at most `MAX_ANSWER_CHARS` characters (more when the gold answer itself is longer);
- brackets nested at most `MAX_NESTING` deep;
- powers nested at most `MAX_POWER_DEPTH` deep (`2^{2^{10}}` passes, `2^{2^{2^{2}}}` does not);
- a numeric exponent at most `MAX_EXPONENT` (`2^{2024}` passes, `9^{9^{9}}` = 9^387420489 does not);
- a factorial of at most `MAX_FACTORIAL`, and never of an expression holding a power or a factorial;
- a number at most `MAX_DIGITS` digits long.

Deliberately left out: any attempt to decide whether an answer is *right*; sums and products with huge
bounds (math-verify's deadline and its killed worker are the backstop for whatever passes here).
"""

from __future__ import annotations

import math
import re

MAX_ANSWER_CHARS = 500
MAX_NESTING = 20
MAX_POWER_DEPTH = 2
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1_000
MAX_DIGITS = 1_000

_OPEN = {"{": "}", "(": ")", "[": "]"}
_CLOSE = {v: k for k, v in _OPEN.items()}
_DIGITS = re.compile(r"\d+")
_SMALL_POWER = re.compile(r"(\d{1,7})\s*(?:\^|\*\*)\s*(\d{1,7})")


def answer_problem(text: str, gold: str = "") -> str | None:
    """Why `text` cannot be a final answer worth comparing (a one-line reason), or None when it can."""
    limit = max(MAX_ANSWER_CHARS, 2 * len(gold))
    if len(text) > limit:
        return f"answer is {len(text)} characters long (limit {limit})"
    problem = digits_problem(text)
    if problem is not None:
        return problem
    match, depth = _brackets(text)
    if depth > MAX_NESTING:
        return f"answer nests brackets {depth} deep (limit {MAX_NESTING})"
    tower, exponent = _powers(text, 0, len(text), match)
    if tower > MAX_POWER_DEPTH:
        return f"answer is a power tower {tower} deep (limit {MAX_POWER_DEPTH})"
    if exponent is not None:
        return exponent
    return _factorial_problem(text, match)


def digits_problem(text: str) -> str | None:
    """A reason when `text` holds a number longer than MAX_DIGITS digits (converting one costs superlinear time,
    and Python refuses more than 4,300 digits in int()), else None."""
    longest = max((len(m) for m in _DIGITS.findall(text)), default=0)
    if longest > MAX_DIGITS:
        return f"answer holds a {longest}-digit number (limit {MAX_DIGITS} digits)"
    return None


def _brackets(text: str) -> tuple[dict[int, int], int]:
    """Matching bracket positions (open -> close; an unclosed one runs to the end) and the deepest nesting."""
    match: dict[int, int] = {}
    stack: list[int] = []
    deepest = 0
    for i, c in enumerate(text):
        if c in _OPEN:
            stack.append(i)
            deepest = max(deepest, len(stack))
        elif c in _CLOSE and stack and text[stack[-1]] == _CLOSE[c]:
            match[stack.pop()] = i
    for i in stack:
        match[i] = len(text)
    return match, deepest


def _operand(text: str, k: int, end: int, match: dict[int, int]) -> tuple[int, int, int]:
    """The exponent after a `^` whose operand starts at k: (start, stop) of its text and where it ends."""
    while k < end and text[k].isspace():
        k += 1
    if k >= end:
        return k, k, k
    c = text[k]
    if c in _OPEN:
        close = min(match.get(k, end), end)
        return k + 1, close, close + 1
    if c.isdigit():
        j = k
        while j < end and text[j].isdigit():
            j += 1
        return k, j, j
    if c == "\\":
        j = k + 1
        while j < end and text[j].isalpha():
            j += 1
        return k, j, j
    if c in "+-":  # a signed exponent (2^-3): the sign and what it signs
        j = k
        while j < end and (text[j] in "+-" or text[j].isspace()):
            j += 1
        if j < end:  # text[j] is neither a sign nor a space: _operand does not come back here
            _, e, after = _operand(text, j, end, match)
            return k, e, after
        return k, j, j
    return k, k + 1, k + 1


def _powers(text: str, start: int, end: int, match: dict[int, int]) -> tuple[int, str | None]:
    """(deepest power nesting in text[start:end], a reason when a numeric exponent is too large)."""
    best, problem = 0, None
    k, chain_end, chain = start, -1, 0
    while k < end:
        c = text[k]
        if c in _OPEN and k in match and match[k] <= end:
            d, p = _powers(text, k + 1, match[k], match)
            best, problem = max(best, d), problem or p
            k = match[k] + 1
            continue
        op = 1 if c == "^" else 2 if text.startswith("**", k) else 0
        if not op:
            if not c.isspace():
                chain_end = -1
            k += 1
            continue
        s, e, after = _operand(text, k + op, end, match)
        inner, p = _powers(text, s, e, match)
        problem = problem or p or _exponent_problem(text[s:e])
        # a^b^c is a^(b^c): a `^` right after the previous exponent continues the same tower
        chain = (chain if k == chain_end else 0) + 1 + inner
        best = max(best, chain)
        k = after
        while k < end and text[k].isspace():
            k += 1
        chain_end = k
    return best, problem


def _exponent_problem(exp: str) -> str | None:
    """A reason when the exponent is a number (or a small numeric power) above MAX_EXPONENT."""
    e = exp.replace("{", "").replace("}", "").strip().lstrip("+- ")
    if e.isdigit():
        if len(e) > 7 or int(e) > MAX_EXPONENT:
            return f"answer has an exponent of {e[:12]}{'...' if len(e) > 12 else ''} (limit {MAX_EXPONENT})"
        return None
    m = _SMALL_POWER.fullmatch(e)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        if a > 1 and b * math.log10(a) > math.log10(MAX_EXPONENT):
            return f"answer has an exponent of {a}^{b} (limit {MAX_EXPONENT})"
    return None


def _factorial_problem(text: str, match: dict[int, int]) -> str | None:
    closing = {v: k for k, v in match.items()}
    count = 0
    for i, c in enumerate(text):
        if c != "!" or text.startswith("!=", i):
            continue
        count += 1
        j = i
        while j > 0 and text[j - 1].isspace():
            j -= 1
        if j > 0 and text[j - 1].isdigit():
            k = j
            while k > 0 and text[k - 1].isdigit():
                k -= 1
            n = text[k:j]
            if len(n) > 7 or int(n) > MAX_FACTORIAL:
                return f"answer takes the factorial of {n[:12]} (limit {MAX_FACTORIAL})"
        elif j > 0 and text[j - 1] in _CLOSE and (j - 1) in closing:
            inside = text[closing[j - 1] + 1 : j - 1]
            if "^" in inside or "**" in inside or "!" in inside:
                return "answer takes the factorial of a power or of a factorial"
            n = inside.strip()
            if n.isdigit() and (len(n) > 7 or int(n) > MAX_FACTORIAL):
                return f"answer takes the factorial of {n[:12]} (limit {MAX_FACTORIAL})"
    if count > 5:
        return f"answer has {count} factorials (limit 5)"
    return None
