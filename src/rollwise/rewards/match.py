"""Exact and numeric match rewards: the simplest verifiers, for tasks whose answer is one token or number."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollwise.rewards.math import to_number
from rollwise.types import Score, Task

_LEADING_INT = re.compile(r"\s*(-?\d+)")


def leading_int(text: str) -> int | None:
    """The integer a completion starts with ("68" -> 68, " -7 rest" -> -7), None if it does not start with one."""
    m = _LEADING_INT.match(text)
    return int(m.group(1)) if m else None


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
        pred, gold = to_number(completion), to_number(str(task.answer))
        if gold is None:
            raise ValueError(f"task {task.id}: answer {task.answer!r} is not a number")
        ok = pred is not None and (pred == gold or abs(pred - gold) <= self.rel_tol * max(1, abs(gold)))
        return Score(float(ok), parts={self.name: float(ok)}, info={"pred": None if pred is None else str(pred)})


exact_match = ExactMatch()
numeric_match = NumericMatch()
