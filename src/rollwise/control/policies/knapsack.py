"""Knapsack allocation: the step's sample budget spread over prompts by how likely each is to give a signal.

Uniform sampling gives every prompt K samples. Where the base rate is low, most of those groups are all-wrong and
teach nothing, while a prompt the policy has solved once or twice would give a mixed group if it got more samples.
Here a step takes more candidate prompts than it needs (`oversample` x prompts_per_step) and splits the uniform
step's budget (`budget_factor` x prompts_per_step x K samples) among them in chunks of two: each chunk goes to the
prompt where it raises P(the group is informative) the most, under that prompt's Beta pass-rate belief (the posterior
selector's). P(informative | n samples) = 1 - E[p^n] - E[(1-p)^n] is concave in n, so the greedy split is the
knapsack's optimum. A prompt seen succeeding gets up to `max_group` samples; a prompt seen failing everything
gets few or none; an unseen prompt is judged by the pass rate seen so far (below).

An unseen prompt's belief is the prior, and the default Jeffreys prior is U-shaped: it says a fresh prompt is as
likely mixed as one seen succeeding. Where the base rate is low that is wrong, and a step of mostly fresh prompts
(the first pass over a large data set) would spread its budget thin over them. So a prompt with no evidence gets
the prior's strength around the pass rate pooled over this step's candidates that have some (empirical Bayes); with
no evidence anywhere (the first steps) the prior stands.

The value is the chance of a non-zero GRPO signal, the quantity behind Knapsack RL (Li et al. 2025)'s budget split; it
leaves out how much a mixed group's gradient is worth, which a larger group estimates better but does not change
much. Candidates left with no samples are skipped for this step (counted in `skipped_prompts`) and come back with
the data's next pass. It needs the posterior selector (`control.select: posterior`): without beliefs every
prompt looks the same and the split is uniform over the candidates.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from rollwise.control.beta import p_informative
from rollwise.control.context import StepContext, build_group
from rollwise.types import RolloutGroup

CHUNK = 2
"""Samples are handed out two at a time: a group needs two to show a mix."""


def pooled_beliefs(beliefs: list[tuple[float, float]], prior: tuple[float, float]) -> list[tuple[float, float]]:
    """Each candidate's belief, an unseen one's (exactly the prior) centred on the pass rate pooled over the
    candidates with evidence, at the prior's strength a0 + b0."""
    a0, b0 = prior
    seen = [(a - a0, b - b0) for a, b in beliefs if (a, b) != (a0, b0)]
    wins, n = sum(w for w, _ in seen), sum(w + f for w, f in seen)
    if n <= 0:
        return list(beliefs)
    m = min(max(wins / n, 1e-3), 1 - 1e-3)
    fresh = (m * (a0 + b0), (1 - m) * (a0 + b0))
    return [fresh if (a, b) == (a0, b0) else (a, b) for a, b in beliefs]


def allocate(beliefs: list[tuple[float, float]], budget: int, max_group: int) -> list[int]:
    """Samples per candidate (0 or an even number from 2 to max_group) summing to at most `budget`, chosen greedily
    by the marginal gain in P(informative); ties go to the earlier candidate (the data's order)."""
    if max_group < CHUNK:
        raise ValueError(f"knapsack: the largest group must be at least {CHUNK} samples, got {max_group}")
    sizes = [0] * len(beliefs)
    heap = [(-p_informative(b, CHUNK), i) for i, b in enumerate(beliefs)]
    heapq.heapify(heap)
    left = budget
    while heap and left >= CHUNK:
        gain, i = heapq.heappop(heap)
        if -gain <= 0.0:  # nothing left to gain anywhere (every belief certain)
            break
        sizes[i] += CHUNK
        left -= CHUNK
        if sizes[i] + CHUNK <= max_group:
            nxt = p_informative(beliefs[i], sizes[i] + CHUNK) - p_informative(beliefs[i], sizes[i])
            heapq.heappush(heap, (-nxt, i))
    return sizes


@dataclass
class KnapsackPolicy:
    budget_factor: float = 1.0
    """Samples per step = budget_factor x prompts_per_step x K."""
    oversample: float = 1.5
    """Candidate prompts per step = ceil(prompts_per_step x oversample)."""
    max_group: int = 0
    """Most samples one prompt gets; 0 = twice the group size K."""
    prior: tuple[float, float] = (0.5, 0.5)
    """The posterior's Beta prior (control.prior_a, prior_b): a belief equal to it is a prompt without evidence."""

    def __post_init__(self) -> None:
        if self.budget_factor <= 0 or self.oversample < 1 or self.max_group < 0:
            raise ValueError(f"knapsack needs budget_factor > 0, oversample >= 1, max_group >= 0; got "
                             f"{self.budget_factor}, {self.oversample}, {self.max_group}")

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        k = ctx.group_size
        budget = max(CHUNK, round(self.budget_factor * ctx.batch_groups * k))
        tasks = ctx.take(math.ceil(ctx.batch_groups * self.oversample))
        beliefs = pooled_beliefs([ctx.prior(t.id) for t in tasks], self.prior)
        sizes = allocate(beliefs, budget, self.max_group or 2 * k)
        ctx.acc.rounds = 1
        ctx.acc.skipped_prompts += sum(1 for n in sizes if n == 0)
        groups = [ctx.new_group(t, n) for t, n in zip(tasks, sizes) if n > 0]
        ctx.generate(groups)
        return [build_group(g, ctx.step, ctx.params.max_tokens) for g in groups]
