"""A per-prompt pass-rate posterior, used to skip prompts that would almost surely teach nothing.

Each prompt's pass rate p has a Beta(a, b) belief, starting at the prior (a0, b0). Every scored rollout
updates it (a += reward, b += 1 - reward, rewards clipped to [0, 1]). Because the policy moves, old evidence
is worth less: each weight version moves (a, b) back toward the prior by a factor `decay` (a <- a0 +
decay * (a - a0)), so a prompt skipped as "solved" drifts back to uncertain and is tried again.

A group of K samples is zero-variance when all K succeed or all fail; under the belief that happens with
probability B(a+K, b)/B(a, b) + B(a, b+K)/B(a, b). A prompt is skipped when that exceeds `skip_above`, except
with probability `explore`, so even a confident belief is re-checked now and then.

Deliberately left out: sharing evidence between prompts (difficulty features, embeddings) - a prompt never
sampled keeps the prior and is always sampled.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollwise.control.beta import beta_all_equal
from rollwise.filter import has_reward
from rollwise.types import RolloutGroup


@dataclass
class PassRatePosterior:
    prior: tuple[float, float] = (0.5, 0.5)
    """Beta prior (a0, b0) of a prompt's pass rate."""
    decay: float = 0.95
    """Per weight version, evidence shrinks toward the prior by this factor (1 = never forget)."""
    skip_above: float = 0.6
    """Skip a prompt when P(its next group is zero-variance) exceeds this."""
    explore: float = 0.1
    """Probability of sampling a prompt anyway when it would be skipped."""
    seed: int = 0
    beliefs: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        a0, b0 = self.prior
        if a0 <= 0 or b0 <= 0:
            raise ValueError(f"posterior prior must be two positive numbers, got {list(self.prior)}")
        if not 0.0 <= self.decay <= 1.0 or not 0.0 < self.skip_above <= 1.0 or not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"posterior needs decay in [0, 1], skip_above in (0, 1], explore in [0, 1]; got "
                             f"{self.decay}, {self.skip_above}, {self.explore}")
        self._rng = random.Random(self.seed)

    def belief(self, task_id: str) -> tuple[float, float]:
        ab = self.beliefs.get(task_id)
        return (ab[0], ab[1]) if ab is not None else self.prior

    def p_zero_variance(self, task_id: str, k: int) -> float:
        a, b = self.belief(task_id)
        return beta_all_equal(a, b, k, True) + beta_all_equal(a, b, k, False)

    def skip(self, task_id: str, group_size: int) -> bool:
        if self.p_zero_variance(task_id, group_size) <= self.skip_above:
            return False
        return self._rng.random() >= self.explore

    def update(self, task_id: str, reward: float) -> None:
        r = min(1.0, max(0.0, float(reward)))
        ab = self.beliefs.setdefault(task_id, list(self.prior))
        ab[0] += r
        ab[1] += 1.0 - r

    def observe(self, groups: Sequence[RolloutGroup]) -> None:
        """Every scored rollout updates its prompt's belief (errored and aborted ones have no reward)."""
        for g in groups:
            for r in g.rollouts:
                if has_reward(r):
                    self.update(g.prompt_id, r.reward)  # type: ignore[arg-type]

    def on_weights(self, versions_moved: int) -> None:
        f = self.decay ** max(versions_moved, 0)
        a0, b0 = self.prior
        for ab in self.beliefs.values():
            ab[0] = a0 + f * (ab[0] - a0)
            ab[1] = b0 + f * (ab[1] - b0)
