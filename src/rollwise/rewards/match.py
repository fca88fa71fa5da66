"""Exact and numeric match rewards: the simplest verifiers, for tasks whose answer is one token or number."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from rollwise.rewards.base import wrong
from rollwise.rewards.bounds import digits_problem
from rollwise.rewards.math import to_number
from rollwise.types import Score, Task

_LEADING_INT = re.compile(r"\s*(-?\d+)")
MAX_INT_DIGITS = 100
"""Longest integer a completion may lead with; a longer one is no answer to these tasks (and Python refuses to
convert more than 4,300 digits at all), so it is a wrong answer, not a failure."""


def leading_int_text(text: str) -> str | None:
    """The digits of the integer a completion starts with, sign included ("  -7 rest" -> "-7"), or None."""
    m = _LEADING_INT.match(text)
    return m.group(1) if m else None


def leading_int(text: str) -> int | None:
    """The integer a completion starts with ("68" -> 68, " -7 rest" -> -7), None if it does not start with one
    or if it is longer than MAX_INT_DIGITS digits."""
    s = leading_int_text(text)
    return int(s) if s is not None and len(s.lstrip("-")) <= MAX_INT_DIGITS else None


@dataclass(frozen=True)
class ExactMatch:
    """1.0 when the stripped completion equals the answer's string (optionally ignoring case)."""

    ignore_case: bool = False
    name: str = "exact_match"

    def __call__(self, task: Task, completion: str) -> Score:
        a, b = completion.strip(), str(task.answer).strip()
        if self.ignore_case:
            a, b = a.lower(), b.lower()
        return Score(float(a == b), parts={self.name: float(a == b)})


@dataclass(frozen=True)
class NumericMatch:
    """1.0 when the completion's number equals the answer within `rel_tol` (exact fractions by default)."""

    rel_tol: float = 0.0
    name: str = "numeric_match"

    def __call__(self, task: Task, completion: str) -> Score:
        gold = to_number(str(task.answer))
        if gold is None:  # the task's data, not the completion: errored
            raise ValueError(f"task {task.id}: answer {task.answer!r} is not a number")
        problem = digits_problem(completion)
        if problem is not None:
            return wrong(problem, parts={self.name: 0.0}, pred=None)
        pred = to_number(completion)
        ok = pred is not None and (pred == gold or abs(pred - gold) <= self.rel_tol * max(1, abs(gold)))
        shown = None if pred is None else _short(pred)
        return Score(float(ok), parts={self.name: float(ok)}, info={"pred": shown})


def _short(v: Fraction) -> str:
    """A value for audit: exact when short; never str() of a huge int (Python's int-string limit raises)."""
    if v.numerator.bit_length() + v.denominator.bit_length() < 600:
        return str(v)
    return f"{float(v):.6g}" if abs(v) < 1e300 else "a number of over 300 digits"


exact_match = ExactMatch()
numeric_match = NumericMatch()
