"""Dynamic sampling (DAPO, Yu et al. 2025): over-sample prompts, drop zero-variance groups, refill.

Each round samples K completions for ceil(missing x oversample) fresh prompts; groups whose rewards all agree
carry no GRPO signal and are dropped (every rollout marked 'filtered', so they are counted, not hidden). Rounds
continue until `batch_groups` informative groups are in hand or `max_rounds` is reached; informative groups
beyond the target are filtered too ("batch already full"), so the train batch has DAPO's constant size.

Deliberately left out: keeping zero-variance groups for a later step (they are stale by then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollwise.control.context import StepContext, build_group, informative, mark
from rollwise.types import RolloutGroup


@dataclass
class DynamicSamplingPolicy:
    oversample: float = 1.5
    """Prompts sampled per round = ceil(missing informative groups x oversample)."""
    max_rounds: int = 4
    """Give up refilling after this many rounds (the batch may then be short)."""

    def __post_init__(self) -> None:
        if self.oversample < 1.0 or self.max_rounds < 1:
            raise ValueError(f"dynamic sampling needs oversample >= 1 and max_rounds >= 1, got "
                             f"{self.oversample} and {self.max_rounds}")

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        out: list[RolloutGroup] = []
        n_info = 0
        while n_info < ctx.batch_groups and ctx.acc.rounds < self.max_rounds:
            ctx.acc.rounds += 1
            missing = ctx.batch_groups - n_info
            pending = [ctx.new_group(t, ctx.group_size) for t in ctx.take(math.ceil(missing * self.oversample))]
            ctx.generate(pending)
            for p in pending:
                g = build_group(p, ctx.step, ctx.params.max_tokens)
                if not informative(g, ctx.rules):
                    mark(g, "filtered", "dynamic sampling: zero-variance group")
                elif n_info >= ctx.batch_groups:
                    mark(g, "filtered", "dynamic sampling: batch already full")
                else:
                    n_info += 1
                out.append(g)
        return out
