"""Weighted composition: several reward functions into one score, each part kept under its name.

If any part errors, the composite carries the error (naming the part) so the rollout is counted as
errored, not silently scored on the remaining parts; `value` still holds the weighted sum of the parts
that did score, for inspection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollwise.rewards.base import call_reward
from rollwise.rewards.cached import add_counts
from rollwise.types import Score, Task


@dataclass
class Weighted:
    """`value = sum(weight_i * part_i)`; `parts` holds each part's own value by name."""

    parts: list[tuple[str, object, float]]
    """(name, reward function or environment, weight)."""
    name: str = "weighted"

    def __post_init__(self) -> None:
        names = [p[0] for p in self.parts]
        if not self.parts:
            raise ValueError("Weighted needs at least one (name, fn, weight) part")
        if len(set(names)) != len(names):
            raise ValueError(f"Weighted part names must be unique, got {names}")

    def __call__(self, task: Task, completion: str) -> Score:
        total, parts, errors, info = 0.0, {}, [], {}
        for name, fn, weight in self.parts:
            s = call_reward(fn, task, completion)
            parts[name] = s.value
            if s.info:
                info[name] = s.info
                add_counts(info, s.info)  # judge calls / cache hits add up across parts
            if s.error:
                errors.append(f"{name}: {s.error}")
            else:
                total += weight * s.value
        if not errors and not math.isfinite(total):  # finite parts whose weighted sum overflows
            errors, total = [f"the weighted sum of the parts is {total!r}"], 0.0
        return Score(total, parts=parts, error="; ".join(errors) or None, info=info)
