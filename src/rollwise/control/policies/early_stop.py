"""Early group termination: score samples as they finish, abort a group once it is surely zero-variance.

`EarlyStop` is a stopping rule, not an allocation: any policy's `ctx.generate` runs under it when the run's
`control.policy` lists `early_stop` (alone it means uniform allocation; `[adaptive, early_stop]` or `[dynamic,
early_stop]` stop the groups those policies sample). Under it every requested sample is its own engine request, so
each is seen, scored and abortable on its own. When a group's m >= `min_finished` finished samples all have the
same reward, the chance that the r samples of it still running agree too is B(a+r, b)/B(a, b) under the prompt's
Beta(a, b) pass-rate belief updated with those m results (the posterior selector's belief when it is on, else the
config prior). Above `confidence` the group's running samples are aborted: the group carries no GRPO signal, and
its remaining tokens are better spent elsewhere. Aborted samples come back with status 'aborted' and their tokens
counted as aborted tokens.

Tree rollouts (`rollout.tree`): a group is one request, its tree, so a leaf is scored when it ends inside the tree
(`Driver.ended_early`), and a decided tree is aborted whole: the samples still running and the branches not yet born
(aborted copies of their parent so far, which cost no token). The rule treats the remaining leaves as independent
draws of the prompt's pass rate; a tree's leaves share prefixes with the ones that ended, so they agree with them
more often than that, and the rule is conservative for trees.

NOTE: samples that finish first are the short ones, so the decision sees a length-biased subset; with rewards
that depend on length, set `confidence` high.

Deliberately left out: starting new prompts in the freed slots (that is what partial rollouts do), and early
stops inside partial rollouts (which drive the engine across steps themselves; the config refuses the pair).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from rollwise.control.beta import beta_all_equal
from rollwise.control.context import PendingGroup, StepContext
from rollwise.control.driver import SampleRequest
from rollwise.control.policies.uniform import UniformPolicy
from rollwise.filter import DEFAULT_RULES, FilterRules, score_values
from rollwise.types import RolloutGroup


@dataclass
class EarlyStop:
    """The stopping rule (`StepContext.stop`): generate the requested samples one request each, abort decided groups."""

    confidence: float = 0.75
    """Abort the rest of a group when P(all remaining samples agree) exceeds this."""
    min_finished: int = 2
    """Never decide on fewer finished samples than this."""

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0 or self.min_finished < 1:
            raise ValueError(f"early_stop needs confidence in (0, 1) and min_finished >= 1, got "
                             f"{self.confidence} and {self.min_finished}")

    def generate(self, ctx: StepContext, groups: Sequence[PendingGroup], indices: Sequence[Sequence[int]]) -> None:
        """Generate and score `indices[i]` of `groups[i]`; a group decided zero-variance has its running samples
        aborted (their slots hold the partial outputs, finish_reason 'abort').

        Tree rollouts (`rollout.tree`): a group's samples are one request (its tree), so the rule reads the leaves
        that end inside it after every engine step, and a decided tree is aborted whole: its running samples and
        the branches not yet born (aborted copies of their parent, no tokens of their own)."""
        drv = ctx.driver
        if ctx.episodes is not None:
            raise ValueError("control.policy early_stop works on single-turn environments only: episodes of a "
                             "multi-turn environment are not aborted or carried mid-way")
        if not drv.stepwise:
            raise ValueError("control.policy early_stop needs a step-level engine (the in-process engine or a remote "
                             "server)")
        tree = ctx.params.tree is not None
        by_id = {g.group_id: g for g in groups}
        running: dict[str, set[int]] = {g.group_id: set() for g in groups}  # group -> its samples not ended yet
        live: dict[str, SampleRequest] = {}  # request id -> request, while in flight
        for g, js in zip(groups, indices):
            # NOTE: one request per sample, so each is abortable alone; a tree is one request (it forks inside)
            for req in ctx.requests(g, js) if tree else [r for j in js for r in ctx.requests(g, [j])]:
                drv.submit(req)
                live[req.request_id] = req
                running[g.group_id].update(range(req.start, req.start + req.count))
        while any(running.values()):
            ended: list[tuple[PendingGroup, int]] = []
            for req, outs in drv.step():
                g = by_id[req.group_id]
                del live[req.request_id]
                new = self._pending(req, running)
                ctx.place(g, req, [outs[i] for i in new], new)
                ended += self._ended(g, req, new, running)
            if tree:
                for req in list(live.values()):
                    g = by_id[req.group_id]
                    new, outs = drv.ended_early(req.request_id, set(self._pending(req, running)))
                    ctx.place(g, req, outs, new)
                    ended += self._ended(g, req, new, running)
            ctx.score(ended)
            for gid in {g.group_id for g, _ in ended}:
                g = by_id[gid]
                if not running[gid] or not self.decided(g, len(running[gid]), ctx.prior(g.task.id), ctx.rules):
                    continue
                late = []
                for rid in [rid for rid, r in live.items() if r.group_id == gid]:
                    got = drv.abort(rid)
                    del live[rid]
                    if got is not None:
                        req, outs = got
                        new = self._pending(req, running)
                        ctx.place(g, req, [outs[i] for i in new], new)
                        late += [(g, req.start + i) for i in new]
                running[gid].clear()
                # NOTE: a streaming (remote) engine may have finished a sample between the step and its abort: such
                # a sample is a real completion and is scored like any other (aborted ones are skipped).
                ctx.score(late)

    @staticmethod
    def _pending(req: SampleRequest, running: dict[str, set[int]]) -> list[int]:
        """The positions of `req` whose samples have not ended yet."""
        return [i for i in range(req.count) if req.start + i in running[req.group_id]]

    @staticmethod
    def _ended(g: PendingGroup, req: SampleRequest, positions: Sequence[int],
               running: dict[str, set[int]]) -> list[tuple[PendingGroup, int]]:
        """Mark these request positions of `g` ended; the (group, sample) pairs to score."""
        js = [req.start + i for i in positions]
        running[g.group_id].difference_update(js)
        return [(g, j) for j in js]

    def decided(self, g: PendingGroup, remaining: int, prior: tuple[float, float],
                rules: FilterRules = DEFAULT_RULES) -> bool:
        """True when the `remaining` running samples of `g` almost surely agree with its finished, unanimous ones."""
        rs = score_values(g.scores, rules)  # the Filter room's values: an errored sample counts as it will train
        if remaining == 0 or len(rs) < self.min_finished or max(rs) - min(rs) > 1e-9:
            return False
        succ = min(1.0, max(0.0, rs[0]))
        a, b = prior[0] + succ * len(rs), prior[1] + (1.0 - succ) * len(rs)
        return beta_all_equal(a, b, remaining, succ >= 0.5) >= self.confidence


@dataclass
class EarlyStopPolicy:
    """`control.policy: early_stop` on its own: uniform allocation, every group under the `EarlyStop` rule."""

    confidence: float = 0.75
    min_finished: int = 2

    def __post_init__(self) -> None:
        self.rule = EarlyStop(self.confidence, self.min_finished)

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        return UniformPolicy().run(dataclasses.replace(ctx, stop=self.rule))
