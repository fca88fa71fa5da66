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


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters, or its type's name when even that fails (an int past Python's digit
    limit, an object whose `__repr__` raises): for messages about values a user's code returned."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a message about the value must not fail on the value
        return f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def finite_number(value: Any) -> float | str:
    """`value` (a bool, an int, a float, or a one-element numpy / torch value) as a finite float, or why it is not
    one. Never raises: an int too large for a float (`int()` of a policy's 400-digit answer), inf, NaN or an array of
    several values is the reason, so one bad value errors its own sample only."""
    try:
        if hasattr(value, "item") and callable(value.item) and not isinstance(value, (int, float)):
            value = value.item()  # numpy / torch scalars; an array of several values raises here
        if not isinstance(value, (bool, int, float)):
            return f"{type(value).__name__} ({shown(value)})"
        v = float(value)
    except Exception as e:  # noqa: BLE001 - OverflowError, ValueError from .item(), a hostile __float__
        return f"{type(value).__name__} that is not one finite number ({describe(e)[:120]})"
    if not math.isfinite(v):
        return repr(v)
    return v


def as_score(value: Any, where: str = "reward function") -> Score:
    """Accept a Score, a number or a bool; anything else (or NaN, inf, an int past a float's range) is an errored
    score naming what came back. Never raises."""
    if isinstance(value, Score):
        got = finite_number(value.value)
        if not isinstance(got, float):
            return Score(0.0, error=f"{where} returned a Score with value {got}", info=value.info)
        parts: dict[str, float] = {}
        for name, part in (value.parts.items() if isinstance(value.parts, dict) else ()):
            p = finite_number(part)
            if not isinstance(p, float):  # parts land in metrics and the store: numbers only
                return Score(0.0, error=f"{where} returned a Score whose part {shown(name)} is {p}", info=value.info)
            parts[str(name)] = p
        if got == value.value and type(value.value) is float and parts == value.parts:
            return value
        return Score(got, parts=parts, error=value.error, info=value.info)
    if isinstance(value, (bool, int, float)) or (hasattr(value, "item") and callable(value.item)):
        got = finite_number(value)
        if isinstance(got, float):
            return Score(got)
        return Score(0.0, error=f"{where} returned {got}")
    return Score(0.0, error=f"{where} returned {type(value).__name__} ({shown(value)}), expected a Score or a number")


def describe(exc: BaseException) -> str:
    """`Type: first line of the message`; the type alone when the message itself cannot be made (an exception
    carrying an int past Python's digit limit), so describing a failure never fails."""
    try:
        text = str(exc).strip()
    except Exception:  # noqa: BLE001
        text = ""
    msg = text.splitlines()[0] if text else ""
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
