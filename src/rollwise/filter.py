"""The Filter room: every decision about a rollout's status after it was scored, in one place (STYLE 13).

Scoring gives each rollout its first status (`types.rollout_status`: kept, truncated, errored or aborted).
Everything after that is decided here, and every other module asks here:

- which rewards are real (`has_reward`): a reward set, and not errored or aborted;
- what the advantages see (`advantage_values`): real rewards, plus errored rollouts at the wrong-answer
  score when `FilterRules.errored_reward` says so;
- which groups carry a signal (`informative`, `zero_variance`): at least two advantage values that differ;
  before a group's Scores become Rollouts (adaptive pilots, early stop), `score_values` and `differ` give the
  same values and the same rule; with a distillation teacher every policy token carries one (`carries_signal`),
  so a zero-variance group is counted but still trains;
- how a group or rollout leaves training (`mark`, `drop_zero_variance`, `drop_overlong`): trainable rollouts
  become 'filtered' with a reason, and the group remembers why it was dropped;
- what trains (`trains`, `select`): kept and truncated rollouts of groups not dropped, and errored ones when
  they are scored as wrong answers;
- why a step trained nothing (`no_signal`): every reward errored (`all_errored`), every group's rewards equal,
  or the rest filtered; the reason its step line and metrics.jsonl carry.

Errored rollouts keep their status whatever the rules (they stay loud, counted and shown); the rules only say
whether they also count as wrong answers in advantages and the loss.

Deliberately left out: advantage arithmetic (train/advantages.py), and what to generate next (control/):
both call this module and decide nothing about statuses themselves. The first status, at scoring, stays in
`types.rollout_status`; the status vocabulary is `types.ROLLOUT_STATUSES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollwise.types import ROLLOUT_STATUSES, Rollout, RolloutGroup, Score

TRAINED: tuple[str, ...] = ("kept", "truncated")
"""Statuses whose rollouts go into the loss (unless their group is dropped, or a rule filters them)."""
NO_REWARD: tuple[str, ...] = ("errored", "aborted")
"""Statuses that carry no reward of their own."""
REPLAYABLE: tuple[str, ...] = ("kept", "filtered")
"""Statuses the replay buffer admits by default: filtered ones on purpose, since an all-correct group that
dynamic sampling dropped is exactly what rescue needs."""
REPLAYED = "kept"
"""Status of a replayed copy (store/replay.py): it trains like a kept rollout of the step it joins."""
FINISHED: tuple[str, ...] = ("stop", "length", "max_turns")
"""Finish reasons of a completion generated in full: the only errored rollouts that may train. An episode whose
environment or tool failed on the policy's turn ends 'stop' (that turn was whole), so it trains as a wrong answer;
'abort' is left for the engine stopping a generation, which says nothing about the policy."""
SHOWN: tuple[str, ...] = ("kept", "filtered", "errored")
"""Statuses every step line and the final summary line show, at 0 too (the others only when there are some)."""
TOL = 1e-9
"""Rewards closer than this are equal (a zero-variance group)."""


@dataclass(frozen=True)
class FilterRules:
    """How the Filter room decides; built once from the config (`from_config`), handed to whoever asks.

    `errored_reward` is the default that matters: see its docstring and README's "Reliability" section."""

    skip_zero_variance: bool = True
    """Drop groups whose advantage values are all equal (no GRPO signal) from the loss (`algo.skip_zero_variance`)."""
    overlong_filter: bool = False
    """DAPO overlong filtering: truncated rollouts leave the loss but keep their place in the baseline."""
    max_tokens: int | None = None
    """The length limit, for the overlong filter's reason."""
    critic_baseline: bool = False
    """The advantages' baseline is a learned critic (`algo.advantage: gae`), not the group: a group of equal rewards
    still carries signal (each token's advantage is its return minus the critic's value), so it is never dropped
    as zero-variance (`skip_zero_variance` does not apply), and whatever trains moves the policy."""
    teacher_signal: bool = False
    """A distillation teacher scores every sampled token (`algo.distill.teacher`): every rollout with a policy token
    carries a signal whatever its reward, so zero-variance groups are counted but never dropped."""
    errored_reward: float | None = 0.0
    """What advantages make of an errored rollout (`algo.errored_reward`). A number: it counts as a wrong answer
    with that reward (or its group's lowest reward, if lower) in its group's baseline, and trains with the
    advantage that gives it, so a policy never gains by making the scorer fail. None: it is left out of the
    advantages and the loss (the choice that trusts every error to be the scorer's, not the policy's).

    Default 0.0 (wrong, the built-in verifiers' wrong-answer value): the errors that remain after the built-in
    verifiers score their output failures as wrong are a user's reward function raising, and such a function
    most often raises on exactly the odd output a policy learns to produce; leaving those out would pay the
    policy for finding them. The cost, penalising a correct answer when infrastructure failed, is noise that
    no policy can exploit, and every such rollout is still counted and shown as errored."""

    @classmethod
    def from_config(cls, algo: object, *, overlong_filter: bool = False, max_tokens: int | None = None) -> FilterRules:
        """From an `AlgoConfig` (duck-typed: the room sits below config) and the resolved overlong options."""
        teacher = getattr(getattr(algo, "distill", None), "teacher", None) is not None
        return cls(skip_zero_variance=bool(getattr(algo, "skip_zero_variance", True)), overlong_filter=overlong_filter,
                   max_tokens=max_tokens, errored_reward=getattr(algo, "errored_reward", 0.0),
                   critic_baseline=getattr(algo, "advantage", None) == "gae", teacher_signal=teacher)


DEFAULT_RULES = FilterRules()


def has_reward(r: Rollout) -> bool:
    """The one meaning of a real reward: set, and the rollout is neither errored nor aborted."""
    return r.reward is not None and r.status not in NO_REWARD


def scored_as_wrong(r: Rollout, rules: FilterRules = DEFAULT_RULES) -> bool:
    """An errored rollout that the rules score as a wrong answer (its completion was generated in full)."""
    return rules.errored_reward is not None and r.status == "errored" and r.finish_reason in FINISHED


def advantage_values(group: RolloutGroup, rules: FilterRules = DEFAULT_RULES,
                     shaping: Callable[[Rollout], float] | None = None) -> list[float | None]:
    """Per rollout, the reward its group's advantages see (None: left out).

    Real rewards plus `shaping(r)` (DAPO's overlong penalty); an errored rollout scored as wrong gets
    min(errored_reward, the lowest of the others), so it is never worth more than any answer of its group."""
    vals: list[float | None] = [float(r.reward) + (shaping(r) if shaping else 0.0) if has_reward(r) else None  # type: ignore[arg-type]
                                for r in group.rollouts]
    if rules.errored_reward is not None and any(scored_as_wrong(r, rules) for r in group.rollouts):
        real = [v for v in vals if v is not None]
        worst = min([rules.errored_reward, *real])
        vals = [worst if scored_as_wrong(r, rules) else v for r, v in zip(group.rollouts, vals)]
    return vals


def score_values(scores: Sequence[Score | None], rules: FilterRules = DEFAULT_RULES) -> list[float]:
    """What a pending group's finished Scores stand for, for decisions taken before they become Rollouts (adaptive
    pilots, early stop): real values, plus each errored one as the wrong answer `advantage_values` will make it."""
    real = [s.value for s in scores if s is not None and s.error is None]
    errored = sum(s is not None and s.error is not None for s in scores)
    if rules.errored_reward is None or not errored:
        return real
    return real + [min([rules.errored_reward, *real])] * errored


def differ(values: Sequence[float]) -> bool:
    """At least two values, and not all equal (within TOL)."""
    return len(values) > 1 and max(values) - min(values) > TOL


def informative(group: RolloutGroup, rules: FilterRules = DEFAULT_RULES) -> bool:
    """At least two advantage values that differ: the group carries a GRPO signal."""
    return differ([v for v in advantage_values(group, rules) if v is not None])


def zero_variance(group: RolloutGroup, rules: FilterRules = DEFAULT_RULES) -> bool:
    """No GRPO signal (fewer than two advantage values, or all equal): the complement of `informative`."""
    return not informative(group, rules)


def mark(group: RolloutGroup, status: str, reason: str) -> None:
    """Re-mark a group's trainable rollouts (kept / truncated) with `status` and `reason`; others keep theirs.
    Marking 'filtered' drops the whole group from training (its errored rollouts too): `group.dropped`."""
    if status not in ROLLOUT_STATUSES:
        raise ValueError(f"unknown rollout status {status!r}; known: {', '.join(ROLLOUT_STATUSES)}")
    for r in group.rollouts:
        if r.status in TRAINED:
            r.status, r.status_reason = status, reason  # type: ignore[assignment]
    if status == "filtered":
        group.dropped = group.dropped or reason


def drop_zero_variance(groups: Sequence[RolloutGroup], rules: FilterRules = DEFAULT_RULES) -> int:
    """Count the zero-variance groups; with `skip_zero_variance` (and a group baseline: no critic, no teacher signal),
    drop them from training. Returns the count."""
    n = 0
    for g in groups:
        if zero_variance(g, rules):
            n += 1
            if rules.skip_zero_variance and not (rules.critic_baseline or rules.teacher_signal):
                mark(g, "filtered", "zero-variance group (no GRPO signal)")
    return n


def drop_overlong(groups: Sequence[RolloutGroup], rules: FilterRules = DEFAULT_RULES) -> int:
    """With `overlong_filter`, truncated rollouts leave the loss (they already counted in their group's baseline).
    Returns how many were filtered."""
    if not rules.overlong_filter:
        return 0
    reason = f"overlong filtering: hit max_tokens={rules.max_tokens}" if rules.max_tokens else "overlong filtering"
    n = 0
    for g in groups:
        for r in g.rollouts:
            if r.status == "truncated":
                r.status, r.status_reason = "filtered", reason
                n += 1
    return n


def is_overlong(r: Rollout) -> bool:
    """Cut off by the length limit: status 'truncated', or finish_reason 'length' (a replayed copy is 'kept')."""
    return r.status == "truncated" or r.finish_reason == "length"


def trains(r: Rollout, group: RolloutGroup, rules: FilterRules = DEFAULT_RULES) -> bool:
    """Whether `r` (of `group`) goes into the loss."""
    if group.dropped:
        return False
    if r.status in TRAINED:
        return not (rules.overlong_filter and is_overlong(r))
    return scored_as_wrong(r, rules)


def trainable(groups: Sequence[RolloutGroup], rules: FilterRules = DEFAULT_RULES) -> list[Rollout]:
    """The rollouts that go into the loss, in group order."""
    return [r for g in groups for r in g.rollouts if trains(r, g, rules)]


@dataclass
class Selection:
    """What `select` decided for one step."""

    trainable: list[Rollout]
    zero_variance_groups: int


def select(groups: Sequence[RolloutGroup], rules: FilterRules = DEFAULT_RULES) -> Selection:
    """After the advantages: drop zero-variance groups and overlong rollouts as the rules say; what trains."""
    zero_var = drop_zero_variance(groups, rules)
    drop_overlong(groups, rules)
    return Selection(trainable(groups, rules), zero_var)


def all_errored(rollouts: Sequence[Rollout]) -> bool:
    """Every finished (not aborted) rollout errored, and there is one: the reward failed on the whole batch, which
    a broken reward does and a policy's output alone seldom can (`run/guard.py` stops a run on it)."""
    scored = [r for r in rollouts if r.status != "aborted"]
    return bool(scored) and all(r.status == "errored" for r in scored)


def carries_signal(r: Rollout, rules: FilterRules = DEFAULT_RULES) -> bool:
    """Whether training on `r` moves the policy: a non-zero advantage (`Rollout.has_signal`), or, with a
    distillation teacher or a critic's baseline, any policy token (each gets its own per-token advantage in the
    trainer)."""
    return r.has_signal or ((rules.teacher_signal or rules.critic_baseline) and r.num_generated > 0)


def no_signal(groups: Sequence[RolloutGroup], trained: Sequence[Rollout],
              rules: FilterRules = DEFAULT_RULES) -> str | None:
    """Why a step's update moves nothing (no trained rollout has a non-zero advantage), in one phrase for its step
    line: 'every sample's reward errored (16/16)', '8/8 groups had equal rewards', or equal groups and the other
    groups' rollouts filtered / errored / aborted with the first reason. None when something with signal trained."""
    if any(carries_signal(r, rules) for r in trained):
        return None
    rollouts = [r for g in groups for r in g.rollouts]
    n = len(rollouts)
    if not n:
        return "no rollouts this step"
    if all_errored(rollouts):
        k = sum(r.status == "errored" for r in rollouts)
        return f"every sample's reward errored ({k}/{k})"
    equal = [g for g in groups if zero_variance(g, rules)]
    parts = [f"{len(equal)}/{len(groups)} groups had equal rewards"] if equal else []
    rest = [r for g in groups if not zero_variance(g, rules) for r in g.rollouts if not trains(r, g, rules)]
    if rest:
        counts = {s: sum(r.status == s for r in rest) for s in ROLLOUT_STATUSES}
        first = next((r.status_reason for r in rest if r.status_reason), "")
        said = ", ".join(f"{k} {s}" for s, k in counts.items() if k)
        parts.append(f"the other groups' {len(rest)} rollouts: {said}" + (f" ({first})" if first else ""))
    if not parts:
        parts.append("no trained rollout had a non-zero advantage")
    return "; ".join(parts)
