"""The two kinds of pluggable control object: a generation policy and a prompt selector (one module each under
`control/policies/`, registered by name in `control/__init__.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rollwise.control.context import StepContext
from rollwise.types import RolloutGroup


class Policy(Protocol):
    """A generation policy: given the step's context, return the step's scored groups."""

    def run(self, ctx: StepContext) -> list[RolloutGroup]: ...


class Selector(Protocol):
    """A prompt selector: skips prompts not worth sampling now, learns from every scored rollout."""

    def skip(self, task_id: str, group_size: int) -> bool: ...

    def observe(self, groups: Sequence[RolloutGroup]) -> None: ...

    def on_weights(self, versions_moved: int) -> None: ...

    def belief(self, task_id: str) -> tuple[float, float]: ...

