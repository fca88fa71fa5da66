"""Reward functions: `fn(task, completion) -> Score | float`, the same shape as `Environment.score`.

`call_reward` is the one place where a reward function's failure becomes data: an exception turns into
`Score(value=0.0, error="<Type>: <message>")` so an errored rollout is never mistaken for a real zero.

Two kinds of failure, kept apart on purpose (README, "Reliability"):
- the policy's output is at fault (too long, too deep, too slow to verify, unparsable, over a cap): the
  built-in verifiers score it as a wrong answer, `wrong(reason)`: `value = WRONG`, the reason in
  `info["reason"]`. Never 'errored': an errored rollout would escape the wrong answer's penalty.
- rollwise cannot blame the output (a user's reward function raised, the sandbox could not be built, a
  scoring worker could not start): an errored Score, counted and shown (`filter.FilterRules.errored_reward`
  decides what advantages make of it).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Union

from rollwise.types import Score, Task

RewardFn = Callable[[Task, str], Union[Score, float, int, bool]]

WRONG = 0.0
"""The value every built-in verifier gives a wrong answer."""


def wrong(reason: str, parts: dict[str, float] | None = None, **info: Any) -> Score:
    """A wrong answer because of what the policy wrote, with the reason (in `info["reason"]`, one line)."""
    return Score(WRONG, parts=dict(parts or {}), info={**info, "reason": reason})


def as_score(value: Any, where: str = "reward function") -> Score:
    """Accept a Score, a number or a bool; anything else (or NaN) is an errored score naming what came back."""
    if isinstance(value, Score):
        if isinstance(value.value, (int, float)) and not math.isnan(value.value):
            return value
        return Score(0.0, parts=value.parts, error=f"{where} returned a Score with value {value.value!r}", info=value.info)
    if isinstance(value, bool):
        return Score(float(value))
    if isinstance(value, (int, float)):
        if math.isnan(value) or math.isinf(value):
            return Score(0.0, error=f"{where} returned {value!r}")
        return Score(float(value))
    return Score(0.0, error=f"{where} returned {type(value).__name__} ({value!r:.80}), expected a Score or a number")


def describe(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def describe_at(exc: BaseException) -> str:
    """`describe(exc)`, then ` (at FILE:LINE)` when the exception was raised in the user's own code (a reward
    file): the one line that tells a broken reward from a broken output (`usercode.raised_at`)."""
    from rollwise.usercode import raised_at

    where = raised_at(exc)
    return f"{describe(exc)} (at {where})" if where else describe(exc)


def call_reward(fn: Any, task: Task, completion: str) -> Score:
    """Score one completion with an environment (`.score`) or a reward function; never raises."""
    scorer = fn.score if hasattr(fn, "score") else fn
    name = getattr(fn, "name", None) or getattr(scorer, "__name__", type(fn).__name__)
    try:
        return as_score(scorer(task, completion), where=str(name))
    except Exception as e:  # noqa: BLE001 - turning failures into data is this function's job
        return Score(0.0, error=describe_at(e))


def is_correct(score: Score, pass_threshold: float = 1.0) -> bool:
    """Whether a sample counts as correct (pass rate, accuracy): not errored and `value >= pass_threshold`.

    One rule for every reward: built-in verifiers give 1.0 for a right answer, so the default threshold 1.0
    means "right"; a user reward with graded values sets `env.pass_threshold`.
    """
    return score.error is None and score.value >= pass_threshold - 1e-9
