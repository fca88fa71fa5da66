"""The knapsack allocation: its split against a brute-force optimum, and its decisions on a fake engine."""

from __future__ import annotations

import itertools

import pytest

from rollwise.control import KnapsackPolicy, PassRatePosterior, RolloutController, UniformPolicy
from rollwise.control.beta import p_informative
from rollwise.control.policies.knapsack import allocate, pooled_beliefs
from rollwise.filter import zero_variance
from rollwise.types import SamplingParams
from tests.control.fakes import FakeEngine, FakeEnv, FakeTokenizer, TaskStream, check_books, task

SP = SamplingParams(n=8, max_tokens=64, seed=1)


def test_p_informative_matches_a_monte_carlo_estimate_and_grows_with_the_group():
    import random

    rng = random.Random(0)
    for a, b, n in ((0.5, 0.5, 8), (1.5, 7.5, 16), (0.5, 8.5, 4)):
        hits = 0
        for _ in range(40_000):
            p = rng.betavariate(a, b)
            wins = sum(rng.random() < p for _ in range(n))
            hits += 0 < wins < n
        assert abs(p_informative((a, b), n) - hits / 40_000) < 0.01
    curve = [p_informative((1.5, 7.5), n) for n in range(0, 33, 2)]
    assert curve[0] == 0.0 and all(x < y for x, y in zip(curve, curve[1:]))


def test_allocate_is_the_brute_force_optimum_within_budget_and_group_cap():
    beliefs = [(0.5, 0.5), (1.5, 7.5), (0.5, 8.5), (3.0, 3.0), (0.5, 20.5)]
    for budget, cap in ((16, 8), (24, 16), (10, 4)):
        sizes = allocate(beliefs, budget, cap)
        assert sum(sizes) <= budget and all(n % 2 == 0 and 0 <= n <= cap for n in sizes)
        best = max(sum(p_informative(b, n) for b, n in zip(beliefs, combo))
                   for combo in itertools.product(range(0, cap + 1, 2), repeat=len(beliefs)) if sum(combo) <= budget)
        assert sum(p_informative(b, n) for b, n in zip(beliefs, sizes)) == pytest.approx(best, abs=1e-9)
    # The prompt seen succeeding gets more than the one seen failing everything; a hopeless one gets the least.
    sizes = allocate(beliefs, 32, 16)
    assert sizes[1] > sizes[2] >= sizes[4]
    with pytest.raises(ValueError, match="at least 2"):
        allocate(beliefs, 8, 1)


def test_unseen_prompts_take_the_pooled_pass_rate_so_a_low_base_rate_does_not_spread_the_budget_thin():
    prior = (0.5, 0.5)
    seen = [(1.5, 7.5), (0.5, 8.5), (0.5, 8.5), (0.5, 8.5)]  # one success in 32 samples
    fresh = [prior] * 12
    pooled = pooled_beliefs(seen + fresh, prior)
    assert pooled[:4] == seen
    a, b = pooled[4]
    assert a + b == pytest.approx(1.0) and a / (a + b) == pytest.approx(1 / 32)
    # Under the Jeffreys prior the fresh prompts take most of the budget in groups of 4-6, and the prompts seen
    # failing get nothing; pooled, the prompt seen succeeding gets the most and fresh ones at most a probe of 2.
    naive = allocate(seen + fresh, 64, 16)
    sizes = allocate(pooled, 64, 16)
    assert all(4 <= n <= 6 for n in naive[4:]) and naive[0] <= 6 and naive[1:4] == [0, 0, 0]
    assert sizes[0] >= 12 and sizes[0] == max(sizes) and max(sizes[4:]) <= 2
    assert pooled_beliefs(fresh, prior) == fresh  # no evidence anywhere: the prior stands


def test_knapsack_moves_samples_to_prompts_seen_succeeding_and_finds_more_mixed_groups():
    # A low base rate: one prompt in four is solved one time in five, the rest never.
    tasks = [task(i, 0.2 if i % 4 == 0 else 0.0) for i in range(32)]
    p_of = {t.id: t.metadata["p"] for t in tasks}

    def run(policy, steps=16):
        post = PassRatePosterior(decay=1.0, explore=0.1, seed=1)
        eng, src = FakeEngine(tasks), TaskStream(tasks)
        ctl = RolloutController(policy, FakeEnv(), FakeTokenizer(), score_workers=2, selector=post)
        mixed = samples = 0
        hard_share = []
        for s in range(1, steps + 1):
            res = ctl.run_step(eng, src, SP, step=s, batch_groups=4)
            check_books(res, eng)
            n = res.accounting.total_rollouts
            assert n <= 4 * 8  # never more than the uniform step's budget
            samples += n
            mixed += sum(not zero_variance(g) for g in res.groups)
            if s > 8:  # once every prompt has been seen
                hard_share.append(sum(len(g.rollouts) for g in res.groups if p_of[g.prompt_id] > 0) / max(n, 1))
        return mixed, samples, sum(hard_share) / len(hard_share)

    k_mixed, k_samples, k_share = run(KnapsackPolicy(oversample=2.0, max_group=16))
    u_mixed, u_samples, u_share = run(UniformPolicy())
    assert k_samples <= u_samples
    assert k_share > u_share  # more of the budget where a success was seen
    assert k_mixed > u_mixed


def test_knapsack_needs_the_posterior_and_sane_settings():
    from rollwise.config import RunConfig

    with pytest.raises(ValueError, match="needs control.select 'posterior'"):
        RunConfig.model_validate({"control": {"policy": "knapsack"}})
    with pytest.raises(ValueError, match="at least 2"):
        RunConfig.model_validate({"control": {"policy": "knapsack", "select": "posterior", "max_group": 1}})
    from rollwise.config import inert_keys

    assert inert_keys(RunConfig.model_validate({"control": {"max_group": 16}}), ["control.max_group"]) == [
        "bad config: 'control.max_group' is set but has no effect unless control.policy is 'knapsack'"]
    cfg = RunConfig.model_validate({"control": {"policy": "knapsack", "select": "posterior", "max_group": 16,
                                                "oversample": 2.0}})
    assert cfg.control.policies == ("knapsack",)
    with pytest.raises(ValueError, match="knapsack needs"):
        KnapsackPolicy(oversample=0.5)
