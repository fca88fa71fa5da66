"""Adaptive group size: a small pilot group per prompt, the full group only where the pilot is mixed.

Under uniform sampling every prompt gets K samples, and the many prompts the policy always solves (or never
does) burn K samples for a zero-variance group. Here each prompt first gets `pilot` samples; a prompt whose
pilot rewards already differ is extended to K (its group is informative whatever the rest say); a unanimous
pilot stops there and its rollouts are filtered (counted, never trained). A prompt whose pass-rate belief (the
posterior selector's, when on) already says its group will very likely be mixed skips the pilot and gets all K. Rounds of fresh pilots continue
until `batch_groups` informative groups are in hand, the step's rollout budget (budget_factor x batch_groups
x K samples, the uniform step's cost by default) is spent, or `max_rounds` is reached.

On a step-level engine the pilots and extensions stream: a prompt whose pilot ends mixed gets its other K - pilot
samples submitted at once, beside the pilots still running, and a new round of pilots starts as soon as the last
one's pilots have ended (extensions still running), so a round waits on its longest pilot only, not then also on
its longest extension. What stays costly on a CPU is the batch: a round of pilots keeps about half of uniform's
samples in flight, and a decode step of half the batch costs nearly as much as a full one (on the long-tail recipe
generation cost 1.5x uniform's per token, before and after the extensions streamed; docs/control.md). Admitting a
new pilot whenever the batch has room, rather than by rounds, is the lever that would fix it. A batch-only engine,
multi-turn episodes, tree rollouts and a stopping rule (`early_stop`, which submits and aborts samples itself) take
the rounds in whole batches.

Deliberately left out: extending unanimous pilots with a few more samples to catch rare successes (the
posterior selector, retrying skipped prompts, covers that across steps), and group sizes other than pilot or K.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rollwise.control.beta import p_informative
from rollwise.control.context import PendingGroup, StepContext, build_group, informative, mark
from rollwise.filter import DEFAULT_RULES, FilterRules, differ, score_values
from rollwise.types import RolloutGroup


@dataclass
class AdaptiveGroupPolicy:
    pilot: int = 2
    """Samples per prompt in the pilot; must be >= 2 (one sample cannot show a mix) and < the group size."""
    budget_factor: float = 1.0
    """Rollouts per step = budget_factor x batch_groups x K."""
    oversample: float = 2.0
    """Pilots per round = ceil(missing informative groups x oversample)."""
    max_rounds: int = 4
    """Most pilot rounds per step."""
    direct_above: float = 0.7
    """Skip the pilot (sample all K at once) for a prompt whose Beta belief gives P(informative group) >= this; with
    the posterior selector that is a prompt seen mixed before. Under the default Jeffreys prior an unseen prompt has
    0.61 for K=8, so it is piloted. 1.0 = always pilot."""

    def __post_init__(self) -> None:
        if self.pilot < 2 or self.budget_factor <= 0 or self.oversample < 1 or self.max_rounds < 1 or not (
                0 < self.direct_above <= 1):
            raise ValueError(f"adaptive needs pilot >= 2, budget_factor > 0, oversample >= 1, max_rounds >= 1, direct_above "
                             f"in (0, 1]; got {self.pilot}, {self.budget_factor}, {self.oversample}, {self.max_rounds}, "
                             f"{self.direct_above}")

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        k = ctx.group_size
        if self.pilot >= k:
            raise ValueError(f"adaptive: control.pilot_samples ({self.pilot}) must be smaller than the group size "
                             f"rollout.samples_per_prompt ({k})")
        budget = max(self.pilot, round(self.budget_factor * ctx.batch_groups * k))
        if (ctx.driver.stepwise and ctx.episodes is None and ctx.stop is None and ctx.params.tree is None):
            return _Stream(self, ctx, budget).run()
        spent = n_info = 0
        out: list[RolloutGroup] = []
        while n_info < ctx.batch_groups and ctx.acc.rounds < self.max_rounds and budget - spent >= self.pilot:
            ctx.acc.rounds += 1
            missing = ctx.batch_groups - n_info
            pend, direct = self.new_round(ctx, missing, budget - spent)
            ctx.generate(pend, [range(k) if p.group_id in direct else range(self.pilot) for p in pend])
            spent += self.pilot * len(pend) + (k - self.pilot) * len(direct)
            ctx.acc.direct_groups += len(direct)
            mixed = [p for p in pend if p.group_id not in direct and _pilot_mixed(p, self.pilot, ctx.rules)]
            ext: list[PendingGroup] = []
            for p in mixed[: max(0, missing - len(direct))]:
                if budget - spent < k - self.pilot:
                    break
                ext.append(p)
                spent += k - self.pilot
            ctx.generate(ext, [range(self.pilot, k)] * len(ext))
            full = direct | {p.group_id for p in ext}
            for p in pend:
                if p.group_id not in full:  # a pilot-only group: drop the slots it never used
                    p.outputs, p.scores = p.outputs[: self.pilot], p.scores[: self.pilot]
                g = build_group(p, ctx.step, ctx.params.max_tokens)
                if informative(g, ctx.rules):
                    n_info += 1
                else:
                    mark(g, "filtered", "adaptive: zero-variance group" if p.group_id in full
                         else f"adaptive: unanimous pilot of {self.pilot}")
                out.append(g)
        return out

    def new_round(self, ctx: StepContext, missing: int, left: int) -> tuple[list[PendingGroup], set[str]]:
        """A round's fresh groups, and those whose prompt is already believed mixed (they skip the pilot and get all K
        at once, when the budget `left` covers it)."""
        k = ctx.group_size
        # NOTE: a round's pilots get at most half the budget left, so mixed pilots can still be extended.
        m = min(math.ceil(missing * self.oversample), max(1, left // (2 * self.pilot)))
        pend = [ctx.new_group(t, k) for t in ctx.take(m)]
        direct = {p.group_id for p in pend if p_informative(ctx.prior(p.task.id), k) >= self.direct_above}
        if left - self.pilot * len(pend) < (k - self.pilot) * len(direct):
            direct = set()
        return pend, direct


class _Stream:
    """One adaptive step on a step-level engine: the same decisions as the rounds above (pilots, the prompts believed
    mixed given all K at once, mixed pilots extended while informative groups are missing and the budget lasts), made
    as each request ends rather than once per phase."""

    def __init__(self, policy: AdaptiveGroupPolicy, ctx: StepContext, budget: int) -> None:
        self.pol, self.ctx, self.budget = policy, ctx, budget
        self.spent = self.n_info = self.pilots = 0  # pilots: groups whose pilot is still running
        self.order: list[PendingGroup] = []
        self.full: set[str] = set()  # groups given all K samples (direct, or a pilot extended)
        self.done: dict[str, RolloutGroup] = {}
        self.live: dict[str, PendingGroup] = {}  # request id -> its group
        self.waiting: dict[str, int] = {}  # group id -> its requests in flight

    def run(self) -> list[RolloutGroup]:
        ctx, pol = self.ctx, self.pol
        while True:
            if (self.pilots == 0 and self.committed() < ctx.batch_groups and ctx.acc.rounds < pol.max_rounds
                    and self.budget - self.spent >= pol.pilot):
                self.launch()
            if not self.live:
                break
            for req, outs in ctx.driver.step():
                g = self.live.pop(req.request_id)
                ctx.place(g, req, outs)
                ctx.score([(g, req.start + i) for i in range(req.count)])
                self.waiting[g.group_id] -= 1
                if not self.waiting[g.group_id]:
                    self.ended(g)
        return [self.done[g.group_id] for g in self.order]

    def committed(self) -> int:
        """Informative groups in hand plus full groups still running (an extended pilot is mixed already)."""
        return self.n_info + sum(1 for gid in self.full if gid not in self.done)

    def launch(self) -> None:
        """A round of fresh pilots (and full groups for prompts believed mixed), sized as the rounds above."""
        ctx, pol, k = self.ctx, self.pol, self.ctx.group_size
        ctx.acc.rounds += 1
        missing = ctx.batch_groups - self.committed()
        pend, direct = pol.new_round(ctx, missing, self.budget - self.spent)
        ctx.acc.direct_groups += len(direct)
        for p in pend:
            self.order.append(p)
            if p.group_id in direct:
                self.full.add(p.group_id)
                self.submit(p, range(k))
            else:
                self.pilots += 1
                self.submit(p, range(pol.pilot))

    def submit(self, g: PendingGroup, indices: range) -> None:
        self.spent += len(indices)
        for req in self.ctx.requests(g, indices):
            self.ctx.driver.submit(req)
            self.live[req.request_id] = g
            self.waiting[g.group_id] = self.waiting.get(g.group_id, 0) + 1

    def ended(self, g: PendingGroup) -> None:
        """Every requested sample of `g` has ended: extend a mixed pilot while groups are missing, else close it."""
        ctx, pol, k = self.ctx, self.pol, self.ctx.group_size
        if g.group_id not in self.full:
            self.pilots -= 1
            if (_pilot_mixed(g, pol.pilot, ctx.rules) and self.committed() < ctx.batch_groups
                    and self.budget - self.spent >= k - pol.pilot):
                self.full.add(g.group_id)
                self.submit(g, range(pol.pilot, k))
                return
            g.outputs, g.scores = g.outputs[: pol.pilot], g.scores[: pol.pilot]
        built = build_group(g, ctx.step, ctx.params.max_tokens)
        if informative(built, ctx.rules):
            self.n_info += 1
        else:
            mark(built, "filtered", "adaptive: zero-variance group" if g.group_id in self.full
                 else f"adaptive: unanimous pilot of {pol.pilot}")
        self.done[g.group_id] = built


def _pilot_mixed(p: PendingGroup, pilot: int, rules: FilterRules = DEFAULT_RULES) -> bool:
    return differ(score_values(p.scores[:pilot], rules))  # the Filter room's values and rule
