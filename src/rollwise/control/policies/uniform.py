"""Uniform sampling (the default policy): the step's prompts, K samples each, every group returned as generated.

One request per group (its samples share the prompt's prefill); on a step-level engine the controller's books
also measure the engine time left idle while the long tail finishes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollwise.control.context import StepContext, build_group
from rollwise.types import RolloutGroup


@dataclass
class UniformPolicy:
    """No choices: take `batch_groups` prompts, sample K each."""

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        groups = [ctx.new_group(t, ctx.group_size) for t in ctx.take(ctx.batch_groups)]
        ctx.acc.rounds = 1
        ctx.generate(groups)
        return [build_group(g, ctx.step, ctx.params.max_tokens) for g in groups]
