"""rollwise.control: decide what to generate each step, and account for every rollout and token.

`RolloutController` (controller.py) runs one generation policy (an allocation, optionally under a stopping rule),
optionally behind a prompt selector, and returns a
step's scored groups with an `Accounting` whose counts add up. Policies are one module each (`policies/`), registered in
`POLICIES` by the name `control.policy` takes; selectors in `SELECTORS` by `control.select`. See docs/control.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rollwise import filter as room
from rollwise.control.policies.adaptive import AdaptiveGroupPolicy
from rollwise.control.context import ParamsFn, StepContext
from rollwise.control.controller import ControlStep, RolloutController
from rollwise.control.drafts import DraftStore
from rollwise.control.driver import Driver
from rollwise.control.episodes import EpisodeSource
from rollwise.control.ledger import Accounting
from rollwise.control.protocols import Policy, Selector
from rollwise.control.policies.dynamic import DynamicSamplingPolicy
from rollwise.control.policies.early_stop import EarlyStop, EarlyStopPolicy
from rollwise.control.policies.knapsack import KnapsackPolicy
from rollwise.control.policies.partial import PartialRolloutPolicy
from rollwise.control.policies.posterior import PassRatePosterior
from rollwise.control.policies.uniform import UniformPolicy
from rollwise.envs.base import Environment
from rollwise.types import ScoreItem, Scorer, Task, Tokenizer

if TYPE_CHECKING:  # the section's type only: importing control does not import pydantic
    from rollwise.config import ControlConfig

POLICIES: dict[str, Callable[[ControlConfig], Policy]] = {
    "uniform": lambda c: UniformPolicy(),
    "dynamic": lambda c: DynamicSamplingPolicy(oversample=c.oversample, max_rounds=c.max_rounds),
    "adaptive": lambda c: AdaptiveGroupPolicy(pilot=c.pilot_samples, budget_factor=c.budget_factor,
                                              oversample=c.oversample, max_rounds=c.max_rounds,
                                              direct_above=c.direct_above),
    "knapsack": lambda c: KnapsackPolicy(budget_factor=c.budget_factor, oversample=c.oversample,
                                         max_group=c.max_group, prior=(c.prior_a, c.prior_b)),
    "early_stop": lambda c: EarlyStopPolicy(confidence=c.confidence, min_finished=c.min_finished),  # uniform + stop
    "partial": lambda c: PartialRolloutPolicy(over_provision=c.over_provision),
}
"""control.policy name -> factory taking the `control` config section."""

SELECTORS: dict[str, Callable[[ControlConfig, int], Selector | None]] = {
    "all": lambda c, seed: None,
    "posterior": lambda c, seed: PassRatePosterior(prior=(c.prior_a, c.prior_b), decay=c.decay,
                                                   skip_above=c.skip_above, explore=c.explore, seed=seed),
}
"""control.select name -> factory taking the `control` config section and a seed."""


def make_controller(control_cfg: ControlConfig, env: Environment, tokenizer: Tokenizer | None, *, seed: int = 0,
                    params_fn: ParamsFn | None = None, encode: Callable[[Task], list[int]] | None = None,
                    scorer: Scorer | None = None, episodes: EpisodeSource | None = None,
                    drafts: DraftStore | None = None, rules: room.FilterRules | None = None) -> RolloutController:
    """Build the controller a `control` config section describes (read by attribute, so anything shaped like a
    `config.ControlConfig` does); `rules`: the run's `filter.FilterRules`."""
    names = (control_cfg.policy,) if isinstance(control_cfg.policy, str) else tuple(control_cfg.policy)
    for n in names:
        if n not in POLICIES:
            raise ValueError(f"unknown control.policy {n!r}; known: {', '.join(sorted(POLICIES))}")
    # A list composes one allocation with the early-stop rule (config.ControlConfig checks the combination).
    alloc = next((n for n in names if n != "early_stop"), None)
    stop = EarlyStop(control_cfg.confidence, control_cfg.min_finished) if alloc and "early_stop" in names else None
    policy = POLICIES[alloc or "early_stop"](control_cfg)
    if control_cfg.select not in SELECTORS:
        raise ValueError(f"unknown control.select {control_cfg.select!r}; known: {', '.join(sorted(SELECTORS))}")
    return RolloutController(policy, env, tokenizer, stop=stop, refill=control_cfg.refill,
                             selector=SELECTORS[control_cfg.select](control_cfg, seed),
                             prior=(control_cfg.prior_a, control_cfg.prior_b), params_fn=params_fn,
                             encode=encode, scorer=scorer, episodes=episodes, drafts=drafts, rules=rules)


__all__ = ["Accounting", "AdaptiveGroupPolicy", "ControlStep", "Driver", "DynamicSamplingPolicy", "EarlyStop",
           "EarlyStopPolicy",
           "KnapsackPolicy", "POLICIES", "PartialRolloutPolicy", "PassRatePosterior", "RolloutController", "SELECTORS", "ScoreItem",
           "Scorer", "StepContext", "UniformPolicy", "make_controller"]
