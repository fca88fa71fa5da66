"""Math verifier: pull the final answer out of free text, then decide equivalence with the gold answer.

Extraction tries, in order, the conventions models are trained on: `#### N` (GSM8K), `\\boxed{...}`,
"The answer is ..." / a final "A: ..." line, and at last the last number in the text. Equivalence is
numeric first (commas, currency and unit words, trailing zeros, percents, fractions `3/4` and `\\frac`
all normalise to an exact `Fraction`), and falls back to math-verify (sympy) for symbolic answers.

Every step takes time linear in the text: extraction uses no pattern that backtracks over the whole text
(40k and 400k characters of hostile text take milliseconds; tests/rewards/test_scoring_attacks.py).

The symbolic fallback runs in a worker process (`rewards.procpool`) with a deadline: sympy can run for ever
on some inputs (`9^{9^{9^{9}}}`), inside C code no signal interrupts, and math-verify's own timeouts only work
in the main thread. Before any of that, `rewards.bounds.answer_problem` rejects answers too long, too deeply
nested, or holding power towers, huge exponents or factorials. Whatever the policy's answer makes go wrong
(rejected, the worker missed its deadline or failed on it) is a wrong answer with its reason
(`check_answer`), never errored: an errored rollout would escape the wrong answer's penalty. Only a worker
that cannot start at all (`WorkerStartError`: rollwise's setup, not the answer) gives an errored Score.
Numeric answers (all of GSM8K) never leave the calling thread.

Deliberately left out: multiple-choice letter answers and set/interval answers beyond what math-verify
does by itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from rollwise.rewards.base import wrong
from rollwise.rewards.bounds import MAX_DIGITS, answer_problem
from rollwise.types import Score, Task

_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]*)", re.IGNORECASE)
_A_LINE = re.compile(r"^[^\S\n]*A:\s*([^\n]+)", re.MULTILINE)  # NOTE: not ^\s*: that rescans blank lines (quadratic)
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}")
_BOXED = ("\\boxed", "\\fbox")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf)\s*\{[^{}]*\}")  # NOTE: [^{}], so an unclosed one stops at the next {


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` with balanced braces (or `\\boxed N`), None if absent."""
    start = max(text.rfind(tag) for tag in _BOXED)
    if start < 0:
        return None
    i = text.find("{", start)
    gap = text[start:i] if i >= 0 else ""
    if i < 0 or not re.fullmatch(r"\\(?:boxed|fbox)\s*", gap):
        m = re.match(r"\\(?:boxed|fbox)\s+([^\s$]+)", text[start:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _clean_tail(s: str) -> str:
    # NOTE: a backwards scan, not re.sub(r"[.\s]+$"): that regex is quadratic on a long run of dots and spaces
    s = s.strip()
    i = len(s)
    while i and (s[i - 1] == "." or s[i - 1].isspace()):  # sentence-final period(s), any mix of dots and spaces
        i -= 1
    return s[:i].strip("*").strip()


def extract_answer(text: str) -> str | None:
    """The final answer as written in `text`, or None when there is none. Never raises on any str."""
    if not isinstance(text, str) or not text.strip():
        return None
    m = _HASHES.findall(text)
    if m and _clean_tail(m[-1]):
        return _clean_tail(m[-1])
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    for pattern in (_ANSWER_IS, _A_LINE):
        hits = [h for h in pattern.findall(text) if _clean_tail(h)]
        if hits:
            tail = _clean_tail(hits[-1])
            # "The answer is 42 apples" -> "42"; "The answer is x^2+1" stays symbolic.
            if re.search(r"[a-zA-Z]\s*[\^*/+]|\\", tail):
                return tail
            num = _NUMBER.search(tail.replace("$", " "))
            if num is None:
                return tail
            return num.group(0) + ("%" if tail[num.end() :].lstrip().startswith("%") else "")
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


def to_number(s: str) -> Fraction | None:
    """Exact value of a numeric answer string ("1,000", "$18.00", "3/4", "\\frac{1}{2}", "50%"), else None."""
    if not isinstance(s, str):
        return None
    t = s.strip().replace("\\$", "").replace("$", "").replace("\\!", "").replace("{,}", ",").replace("\\,", "")
    t = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", t)
    t = _TEXT.sub(" ", t)  # \text{ dollars}
    t = t.replace("\\%", "").replace("%", "")  # a percent keeps its written value: "50%" == "50"
    m = _NUMBER.search(t)
    if not m:
        return None
    # Reject strings where the number is only part of a symbolic expression ("2x+1", "3^2", "sqrt(2)").
    rest = (t[: m.start()] + " " + t[m.end() :]).strip()
    if re.search(r"[\^*+=()\\]|(?<![a-zA-Z])[a-zA-Z](?![a-zA-Z])|sqrt|pi", rest):
        return None
    num = m.group(0).replace(",", "").replace(" ", "")
    if len(num) > MAX_DIGITS:  # no answer is that long, and converting it costs superlinear time
        return None
    try:
        if "/" in num:
            a, b = num.split("/")
            if Decimal(b) == 0:
                return None
            val = Fraction(Decimal(a)) / Fraction(Decimal(b))
        else:
            val = Fraction(Decimal(num))
    except (InvalidOperation, ValueError, ZeroDivisionError):
        return None
    return val


MAX_SYMBOLIC_CHARS = 500


class MathVerifyTimeout(RuntimeError):
    """The symbolic comparison did not finish by its deadline (its worker process was killed)."""


def math_verify_local(pred: str, gold: str) -> bool:
    """math-verify in this process, without its SIGALRM timeouts: runs inside a killable worker process."""
    from math_verify import parse, verify

    g = parse(f"${gold}$", parsing_timeout=None)  # type: ignore[arg-type]
    p = parse(f"${pred}$", parsing_timeout=None)  # type: ignore[arg-type]
    if not g or not p:
        return False
    return bool(verify(g, p, timeout_seconds=None))  # type: ignore[arg-type]


def math_verify_warm() -> None:
    """Import math-verify and build its parsers once (seconds on a busy machine), in a fresh worker."""
    math_verify_local("x^2+1", "1+x^2")


def _math_verify_equal(pred: str, gold: str, pool=None) -> bool:
    if len(pred) > MAX_SYMBOLIC_CHARS or len(gold) > MAX_SYMBOLIC_CHARS:
        return False  # no final answer is that long; sympy on it would only burn time
    from rollwise.rewards.procpool import CallTimeout, default_pool

    pool = pool or default_pool()
    try:
        return bool(pool.call("math_verify_equal", pred, gold))
    except CallTimeout:
        raise MathVerifyTimeout(
            f"math-verify did not finish within {pool.deadline_s:g}s comparing {pred[:60]!r} with {gold[:60]!r}"
            " (its worker was killed)") from None


def _decimals(s: str) -> int:
    m = re.search(r"\.(\d+)", s)
    return len(m.group(1)) if m else 0


def _rounds_to(written: str, value: Fraction, other: Fraction) -> bool:
    """`written` (value `value`) shows >= 2 decimals and `other` rounded to that many equals it ("0.33" ~ 1/3)."""
    d = _decimals(written)
    return d >= 2 and round(other, d) == value


def math_equal(pred: str | None, gold: str, pool=None) -> bool:
    """Whether two answer strings denote the same value: exact numbers first, math-verify otherwise.

    Raises `MathVerifyTimeout` when the symbolic comparison misses its deadline (or `procpool.WorkerError` when
    its worker fails); `pool` is a `procpool.WorkerPool` (default: the shared one).

    NOTE: numbers compare exactly (999999 != 1000000); the only slack is for a rounded decimal, which must
    show at least two decimals and equal the other side rounded to as many.
    """
    if pred is None:
        return False
    a, b = to_number(pred), to_number(gold)
    if a is not None and b is not None:
        return a == b or _rounds_to(pred, a, b) or _rounds_to(gold, b, a)
    if a is None and b is None and pred.strip() == gold.strip():
        return True
    return _math_verify_equal(pred, gold, pool)


def gold_of(answer: object) -> str:
    """The gold answer string: a GSM8K solution's `#### N` part, else the answer itself."""
    s = str(answer)
    m = _HASHES.findall(s)
    return _clean_tail(m[-1]) if m else s.strip()


@dataclass(frozen=True)
class Verdict:
    """Whether an answer is right; when the answer itself is at fault, why (one line, '' otherwise)."""

    correct: bool
    reason: str = ""


def symbolic_verdict(pred: str, gold: str, pool=None) -> Verdict:
    """math-verify in a worker (after `rewards.bounds` passed the answer). A missed deadline or a failure on this
    answer is a wrong answer saying so; only a worker that cannot start (`procpool.WorkerStartError`) raises."""
    from rollwise.rewards.procpool import WorkerError, WorkerStartError

    try:
        return Verdict(_math_verify_equal(pred, gold, pool))
    except MathVerifyTimeout as e:
        return Verdict(False, str(e))
    except WorkerStartError:
        raise
    except WorkerError as e:
        return Verdict(False, f"math-verify failed on the answer {pred[:60]!r}: {e}")


def check_answer(pred: str | None, gold: str, pool=None) -> Verdict:
    """`math_equal` for scoring: the answer is checked by `rewards.bounds` first, and whatever the answer makes go
    wrong is a wrong Verdict with its reason. Raises only `procpool.WorkerStartError` (not the answer's fault)."""
    if pred is None:
        return Verdict(False, "no final answer found")
    problem = answer_problem(pred, gold)
    if problem is not None:
        return Verdict(False, problem)
    a, b = to_number(pred), to_number(gold)
    if a is not None and b is not None:
        return Verdict(a == b or _rounds_to(pred, a, b) or _rounds_to(gold, b, a))
    if a is None and b is None and pred.strip() == gold.strip():
        return Verdict(True)
    return symbolic_verdict(pred, gold, pool)


AUDIT_CHARS = 200
"""Longest extracted answer kept in a Score's info (it lands in the rollout store)."""


def verify_math(completion: str, answer: object, pool=None) -> Score:
    """1.0 when the completion's final answer equals the gold one; info keeps both for audit. An answer that
    cannot be checked (no answer, over `rewards.bounds`' limits, math-verify timed out or failed on it) is wrong,
    with `info["reason"]`; only a scoring worker that cannot start gives an errored Score."""
    from rollwise.rewards.procpool import WorkerStartError

    gold = gold_of(answer)
    pred = extract_answer(completion)
    info = {"extracted": pred if pred is None or len(pred) <= AUDIT_CHARS else pred[:AUDIT_CHARS] + "...",
            "gold": gold}
    try:
        v = check_answer(pred, gold, pool)
    except WorkerStartError as e:
        return Score(0.0, error=str(e), info=info)
    if v.reason:
        return wrong(v.reason, parts={"correct": 0.0}, **info)
    return Score(float(v.correct), parts={"correct": float(v.correct)}, info=info)


def math_reward(task: Task, completion: str) -> Score:
    """Reward function form of `verify_math` (gold from `task.answer`)."""
    return verify_math(completion, task.answer)
