"""The rollout controller: decide what to generate each step, and account for every token of it.

The idea. A step asks the controller for a batch of scored `RolloutGroup`s. The controller hands a *policy*
(one module each under `control/policies/`: uniform, dynamic, adaptive, early_stop, partial) a `StepContext` with
everything it may use (an engine `Driver`, a source of tasks already filtered by the optional prompt selector, the
sampling params, scoring) and gets groups back. It then checks that every rollout has a status and that the token
ledger (`control/ledger.py`) balances, and keeps cross-step state (the pass-rate posterior, partial samples carried
to the next step).

The controller runs every step of every loop (uniform is the default policy), on any engine of
`engine.protocol`; how each engine shape is driven is `control/driver.py`.

Deliberately left out: cross-step scheduling of the trainer (that is the async loop) and any knowledge of
advantages beyond "which groups have zero reward variance" (advantages are computed by the loop, after).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollwise import filter as room
from rollwise.control.context import ParamsFn, StepContext, Stopping, TaskSource, default_encoder
from rollwise.control.drafts import DraftStore
from rollwise.control.driver import Driver
from rollwise.control.episodes import EpisodeSource
from rollwise.control.ledger import Accounting
from rollwise.control.protocols import Policy, Selector
from rollwise.engine.protocol import Engine, StepEngine
from rollwise.envs.base import Environment
from rollwise.rewards.concurrent import score_many
from rollwise.types import (ROLLOUT_STATUSES, Rollout, RolloutGroup, SamplingParams, Score, ScoreItem, Scorer, Task,
                            Tokenizer)


@dataclass
class ControlStep:
    """One step's result: the groups (every rollout with a status) and the books."""

    groups: list[RolloutGroup]
    accounting: Accounting


class RolloutController:
    """Runs one policy (and optionally a prompt selector) step after step; owns their cross-step state."""

    def __init__(self, policy: Policy, env: Environment, tokenizer: Tokenizer | None, *, selector: Selector | None = None,
                 prior: tuple[float, float] = (0.5, 0.5), max_skip_factor: int = 4, score_workers: int = 8,
                 score_timeout_s: float | None = 30.0, params_fn: ParamsFn | None = None,
                 encode: Callable[[Task], list[int]] | None = None, scorer: Scorer | None = None,
                 episodes: EpisodeSource | None = None, drafts: DraftStore | None = None,
                 rules: room.FilterRules | None = None, stop: Stopping | None = None, refill: bool = True) -> None:
        """rules: the Filter room's rules the run applies (which groups are informative; default
        `filter.DEFAULT_RULES`); encode: a task's prompt token ids (default: the tokenizer's plain encoding of
        `task.prompt`);
        scorer: `scorer(items) -> scores` in input order (default: `score_many` over `env` in this process; the
        Ray backend passes its scoring actors); episodes: a `control.episodes.EpisodeRunner` when the environment is
        multi-turn (samples are then whole episodes, scored by the environment); drafts: a `control.drafts.DraftStore`
        for speculative rollouts (fed every step's groups; step-level engines only); stop: a stopping rule
        (`early_stop.EarlyStop`) every policy's generation runs under; refill: replace prompts the selector skips
        (true, the step keeps its size) or not (false: the step samples fewer groups, at least one)."""
        if max_skip_factor < 1:
            raise ValueError(f"max_skip_factor must be >= 1, got {max_skip_factor}")
        self.policy = policy
        self.env = env
        self.tokenizer = tokenizer
        if encode is None:
            if tokenizer is None:
                raise ValueError("the rollout controller needs an `encode` for the prompts, or a tokenizer to build one")
            encode = default_encoder(tokenizer)
        self.encode = encode
        self.scorer = scorer
        self.episodes = episodes
        self.selector = selector
        self.prior = prior
        self.max_skip_factor = max_skip_factor
        self.score_workers = score_workers
        self.score_timeout_s = score_timeout_s
        self.params_fn = params_fn
        self.drafts = drafts
        self.rules = rules if rules is not None else room.DEFAULT_RULES
        self.stop = stop
        self.refill = refill
        self._driver: Driver | None = None
        self._version: int | None = None

    def _score(self, items: list[ScoreItem]) -> list[Score]:
        if self.scorer is not None:
            return self.scorer(items)
        return score_many(self.env, items, max_workers=max(1, min(self.score_workers, len(items))),
                          timeout_s=self.score_timeout_s)

    def _selecting(self, source: TaskSource, acc: Accounting, group_size: int) -> TaskSource:
        sel = self.selector
        if sel is None:
            return source

        def take(k: int) -> list[Task]:
            out: list[Task] = []
            drawn = 0
            if not self.refill:  # k prompts drawn, the skipped ones not replaced; the first kept if all are skipped
                got = source(k)
                for t in got:
                    if sel.skip(t.id, group_size):
                        acc.skipped_prompts += 1
                    else:
                        out.append(t)
                if not out and got:
                    acc.skipped_prompts -= 1
                    out.append(got[0])
                return out
            while len(out) < k:
                for t in source(k - len(out)):
                    drawn += 1
                    # NOTE: after max_skip_factor x k draws everything is accepted, so a step always fills even
                    # when the selector would skip the whole data set.
                    if drawn <= self.max_skip_factor * k and sel.skip(t.id, group_size):
                        acc.skipped_prompts += 1
                    else:
                        out.append(t)
            return out

        return take

    def run_step(self, engine: Engine | StepEngine, source: TaskSource, params: SamplingParams, *, step: int,
                 batch_groups: int) -> ControlStep:
        """Generate and score one step's groups. `params.n` is the group size; `batch_groups` the target."""
        if batch_groups < 1:
            raise ValueError(f"batch_groups must be >= 1, got {batch_groups}")
        if self._driver is None or self._driver.engine is not engine:
            self._driver = Driver(engine)
        drv = self._driver
        drv.reset()
        v = drv.weight_version
        if self.selector is not None and self._version is not None and v != self._version:
            self.selector.on_weights(v - self._version)
        self._version = v
        acc = Accounting()
        sel = self.selector
        ctx = StepContext(drv, self._selecting(source, acc, params.n), params, step, batch_groups, self.encode,
                          self._score, self.params_fn, acc,
                          prior=(sel.belief if sel is not None else (lambda _tid: self.prior)), rules=self.rules,
                          episodes=self.episodes,
                          drafts=self.drafts.for_task if self.drafts is not None and drv.speculative else None,
                          stop=self.stop)
        groups = self.policy.run(ctx)
        acc.gen_s, acc.idle_s, acc.generated_tokens, acc.tail_s = drv.gen_s, drv.idle_s, drv.generated_tokens, drv.tail_s
        books = drv.spec_books()
        if books is not None:
            acc.spec_acceptance, acc.spec_tokens_per_forward, acc.spec_saved_s, tested = books
            if self.drafts is not None:  # the next requests' cold-start acceptance estimate
                self.drafts.observe_acceptance(acc.spec_acceptance * tested, tested)
        if self.drafts is not None:
            self.drafts.observe(groups)
        acc.groups = len(groups)
        acc.zero_variance_groups = sum(room.zero_variance(g, self.rules) for g in groups)
        for g in groups:
            for r in g.rollouts:
                if r.status not in acc.rollouts:
                    raise RuntimeError(f"rollout {r.group_id}/{r.sample_index} has unknown status {r.status!r}")
                acc.rollouts[r.status] += 1
                acc.rollout_tokens += r.num_generated  # policy tokens, every segment (env tokens aside)
                acc.shared_tokens += r.tree_fork or 0
                if r.status == "aborted":
                    acc.aborted_tokens += r.num_generated
        acc.check()  # carried_in/out_tokens were set by the policy (partial rollouts), 0 otherwise
        if sel is not None:
            sel.observe(groups)
        return ControlStep(groups, acc)

    def finalize(self, result: ControlStep, trained_version: int,
                 trained: Sequence[Rollout] | None = None) -> Accounting:
        """After the loop assigned advantages and statuses: useful tokens and staleness of what trains.

        trained: the rollouts the Filter room selected (`filter.select`); default: ask it (`filter.trains`)."""
        acc = result.accounting
        ages: list[int] = []
        acc.useful_tokens = acc.trained_tokens = 0
        acc.rollouts = {s: 0 for s in ROLLOUT_STATUSES}
        chosen = {id(r) for r in trained} if trained is not None else None
        for g in result.groups:
            for r in g.rollouts:
                acc.rollouts[r.status] += 1
                if not (id(r) in chosen if chosen is not None else room.trains(r, g, self.rules)):
                    continue
                seqs = r.sequences()  # an agent episode's segments train too
                n = sum(len(s.completion_token_ids) for s in seqs)
                acc.trained_tokens += n
                if room.carries_signal(r, self.rules):
                    acc.useful_tokens += n
                ages.extend(trained_version - w for s in seqs for w in s.weight_versions)
        acc.staleness_mean = sum(ages) / len(ages) if ages else 0.0
        acc.staleness_max = max(ages) if ages else 0
        return acc
