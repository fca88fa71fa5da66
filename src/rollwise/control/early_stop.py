"""Early group termination: score samples as they finish, abort a group once it is surely zero-variance.

The controller drives the engine step by step. Each finished sample is scored at once; when a group's first
m >= `min_finished` finished samples all have the same reward, the chance that the r samples still running
agree too is B(a+r, b)/B(a, b) under the prompt's Beta(a, b) pass-rate belief updated with those m results
(the posterior selector's belief when it is on, else the config prior). Above `confidence` the rest of the
group is aborted: the group carries no GRPO signal, and its remaining tokens are better spent elsewhere.
Aborted samples are returned with status 'aborted' and their tokens counted as aborted tokens.

NOTE: samples that finish first are the short ones, so the decision sees a length-biased subset; with rewards
that depend on length, set `confidence` high.

Deliberately left out: starting new prompts in the freed slots (that is what partial rollouts do).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollwise.control.base import PendingGroup, StepContext, beta_all_equal, build_group
from rollwise.filter import DEFAULT_RULES, FilterRules, score_values
from rollwise.types import RolloutGroup


@dataclass
class EarlyStopPolicy:
    confidence: float = 0.75
    """Abort the rest of a group when P(all remaining samples agree) exceeds this."""
    min_finished: int = 2
    """Never decide on fewer finished samples than this."""

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0 or self.min_finished < 1:
            raise ValueError(f"early_stop needs confidence in (0, 1) and min_finished >= 1, got "
                             f"{self.confidence} and {self.min_finished}")

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        drv = ctx.driver
        if ctx.episodes is not None:
            raise ValueError("control.policy=early_stop works on single-turn environments only: episodes of a multi-turn "
                             "environment are not aborted or carried mid-way")
        if not drv.stepwise:
            raise ValueError("control.policy=early_stop needs a step-level engine (the in-process engine or a remote server)")
        groups = [ctx.new_group(t, ctx.group_size) for t in ctx.take(ctx.batch_groups)]
        by_id = {g.group_id: g for g in groups}
        # NOTE: one request per sample (n=1), so each is seen, scored and abortable on its own.
        for g in groups:
            for j in range(g.size):
                for req in ctx.requests(g, [j]):
                    drv.submit(req)
        ctx.acc.rounds = 1
        while drv.inflight:
            done = drv.step()
            for req, outs in done:
                ctx.place(by_id[req.group_id], req, outs)
            ctx.score([(by_id[req.group_id], req.start) for req, _ in done])
            for gid in {req.group_id for req, _ in done}:
                g = by_id[gid]
                if self._decided(g, ctx.prior(g.task.id), ctx.rules):
                    late = []
                    for j, o in enumerate(g.outputs):
                        if o is None:
                            got = drv.abort(f"{gid}/{j}")
                            if got is not None:
                                ctx.place(g, *got)
                                late.append((g, j))
                    # NOTE: a streaming (remote) engine may have finished a sample between the step and its abort:
                    # such a sample is a real completion and is scored like any other (aborted ones are skipped).
                    ctx.score(late)
        return [build_group(g, ctx.step, ctx.params.max_tokens) for g in groups]

    def _decided(self, g: PendingGroup, prior: tuple[float, float], rules: FilterRules = DEFAULT_RULES) -> bool:
        remaining = sum(o is None for o in g.outputs)
        rs = score_values(g.scores, rules)  # the Filter room's values: an errored sample counts as it will train
        if remaining == 0 or len(rs) < self.min_finished or max(rs) - min(rs) > 1e-9:
            return False
        succ = min(1.0, max(0.0, rs[0]))
        a, b = prior[0] + succ * len(rs), prior[1] + (1.0 - succ) * len(rs)
        return beta_all_equal(a, b, remaining, succ >= 0.5) >= self.confidence
