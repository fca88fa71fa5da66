"""Each policy's decisions and the books, on a fake engine with fake scores (no model)."""

from __future__ import annotations

import math

import pytest

from rollwise.control import (AdaptiveGroupPolicy, DynamicSamplingPolicy, EarlyStopPolicy, PartialRolloutPolicy,
                              PassRatePosterior, RolloutController, UniformPolicy)
from rollwise.control.beta import beta_all_equal
from rollwise.filter import zero_variance
from rollwise.types import SamplingParams
from tests.control.fakes import BatchOnlyEngine, FakeEngine, FakeEnv, FakeTokenizer, TaskStream, check_books, task

SP = SamplingParams(n=8, max_tokens=64, seed=1)


def controller(policy, **kw):
    return RolloutController(policy, FakeEnv(), FakeTokenizer(), score_workers=2, **kw)


def test_uniform_samples_every_prompt_k_times_and_books_balance_against_the_engine():
    tasks = [task(0, 1.0), task(1, 0.0), task(2, 0.5, length=[2, 9])]
    eng = FakeEngine(tasks)
    res = controller(UniformPolicy()).run_step(eng, TaskStream(tasks), SP, step=1, batch_groups=3)
    assert [g.prompt_id for g in res.groups] == ["t0", "t1", "t2"] and all(len(g.rollouts) == 8 for g in res.groups)
    check_books(res, statuses={"kept"})
    assert res.accounting.generated_tokens == eng.produced
    assert res.accounting.zero_variance_groups == 2 and not zero_variance(res.groups[2])
    # Short samples leave their slots empty while the 9-token ones finish: idle time is measured.
    assert res.accounting.idle_s > 0
    assert {r.seed for g in res.groups for r in g.rollouts} == {SP.seed}  # the step seed, as the loop stores it
    assert eng.added == 3  # one request per group: its samples share the prompt's prefill
    assert len({tuple(r.completion_token_ids) + (r.reward,) for r in res.groups[2].rollouts}) > 1


def test_uniform_works_on_a_batch_only_engine_and_step_policies_refuse_it():
    tasks = [task(0, 0.5)]
    res = controller(UniformPolicy()).run_step(BatchOnlyEngine(tasks), TaskStream(tasks), SP, step=1, batch_groups=1)
    check_books(res)
    assert res.accounting.generated_tokens == 24 and res.accounting.idle_s == 0
    for pol in (EarlyStopPolicy(), PartialRolloutPolicy()):
        with pytest.raises(ValueError, match="step-level engine"):
            controller(pol).run_step(BatchOnlyEngine(tasks), TaskStream(tasks), SP, step=1, batch_groups=1)


def test_errored_scores_and_truncation_get_their_status():
    tasks = [task(0, 0.5, broken=True), task(1, 0.5, length=100)]
    res = controller(UniformPolicy()).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1, batch_groups=2)
    check_books(res)
    assert {r.status for r in res.groups[0].rollouts} == {"errored"}
    assert "verifier crashed" in res.groups[0].rollouts[0].status_reason
    assert {r.status for r in res.groups[1].rollouts} == {"truncated"}


def test_dynamic_sampling_refills_until_the_batch_is_informative_and_counts_what_it_drops():
    tasks = [task(i, [1.0, 0.0, 0.5][i % 3]) for i in range(30)]
    eng = FakeEngine(tasks)
    src = TaskStream(tasks)
    res = controller(DynamicSamplingPolicy(oversample=1.5, max_rounds=10)).run_step(eng, src, SP, step=1, batch_groups=4)
    check_books(res, eng, statuses={"kept", "filtered"})
    kept = [g for g in res.groups if g.rollouts[0].status == "kept"]
    assert len(kept) == 4 and all(not zero_variance(g) for g in kept)
    for g in res.groups:
        if zero_variance(g):
            assert {r.status_reason for r in g.rollouts} == {"dynamic sampling: zero-variance group"}
    assert res.accounting.rounds > 1 and res.accounting.prompts == src.pos == len(res.groups)
    assert res.accounting.generated_tokens == eng.produced


def test_dynamic_sampling_stops_at_max_rounds_when_nothing_is_informative():
    tasks = [task(i, 1.0) for i in range(5)]
    res = controller(DynamicSamplingPolicy(max_rounds=3)).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1,
                                                                   batch_groups=2)
    check_books(res, statuses={"filtered"})
    assert res.accounting.rounds == 3 and res.accounting.zero_variance_groups == len(res.groups)


def test_posterior_maths_update_decay_and_skip():
    post = PassRatePosterior(prior=(1.0, 1.0), decay=0.5, skip_above=0.9, explore=0.0)
    # Uniform prior, K=2: P(both equal) = 2/3 (p^2 + (1-p)^2 integrated).
    assert math.isclose(post.p_zero_variance("x", 2), 2 / 3)
    assert math.isclose(beta_all_equal(3.0, 1.0, 2, True), 3 / 4 * 4 / 5)
    for _ in range(30):
        post.update("x", 1.0)
    # Beta(31, 1): P(8 more all correct) = 31/39 < 0.9, plus a negligible all-wrong tail: not yet skipped.
    assert post.belief("x") == (31.0, 1.0) and not post.skip("x", 8)
    for _ in range(50):
        post.update("x", 1.0)
    assert post.p_zero_variance("x", 8) > 81 / 89 and post.skip("x", 8)
    assert not post.skip("never-seen", 8)
    post.on_weights(3)  # the policy moved: evidence shrinks toward the prior
    assert post.belief("x") == (1.0 + 80 / 8, 1.0)
    assert not post.skip("x", 8)
    with pytest.raises(ValueError, match="prior"):
        PassRatePosterior(prior=(0.0, 1.0))


def test_posterior_selector_skips_decided_prompts_and_still_explores_them():
    tasks = [task(0, 1.0), task(1, 0.0), task(2, 0.5), task(3, 0.5)]
    eng = FakeEngine(tasks)
    post = PassRatePosterior(decay=1.0, skip_above=0.9, explore=0.2, seed=3)
    ctl = controller(UniformPolicy(), selector=post)
    src = TaskStream(tasks)
    seen: list[str] = []
    skipped = 0
    for step in range(1, 41):
        res = ctl.run_step(eng, src, SP, step=step, batch_groups=2)
        check_books(res)
        seen += [g.prompt_id for g in res.groups]
        skipped += res.accounting.skipped_prompts
    later = seen[16:]
    # After one look each, t0 (all correct) and t1 (all wrong) are mostly skipped, but exploration retries them.
    assert skipped > 0
    assert 0 < later.count("t0") < later.count("t2") / 2 and 0 < later.count("t1") < later.count("t3") / 2
    assert post.belief("t0")[0] > 8 and post.belief("t1")[1] > 8


def test_selector_fills_the_step_even_when_every_prompt_would_be_skipped():
    tasks = [task(i, 1.0) for i in range(3)]
    post = PassRatePosterior(explore=0.0)
    for t in tasks:
        for _ in range(50):
            post.update(t.id, 1.0)
    res = controller(UniformPolicy(), selector=post).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1,
                                                             batch_groups=2)
    assert len(res.groups) == 2 and res.accounting.skipped_prompts == 8  # 4 x 2 draws skipped, then accepted


def test_selector_without_refill_samples_only_the_prompts_it_keeps():
    """control.refill false: a step draws its prompts_per_step prompts and drops the skipped ones (a cheaper step);
    with every prompt skipped it still samples one, so a step is never empty."""
    tasks = [task(0, 1.0), task(1, 0.5), task(2, 1.0), task(3, 0.5)]
    post = PassRatePosterior(explore=0.0)
    for tid in ("t0", "t2"):
        for _ in range(50):
            post.update(tid, 1.0)
    eng = FakeEngine(tasks)
    res = controller(UniformPolicy(), selector=post, refill=False).run_step(eng, TaskStream(tasks), SP, step=1,
                                                                           batch_groups=4)
    check_books(res, eng)
    assert [g.prompt_id for g in res.groups] == ["t1", "t3"] and res.accounting.skipped_prompts == 2
    assert res.accounting.generated_tokens == eng.produced == 2 * 8 * 3  # two groups generated, not four
    solved = [task(i, 1.0) for i in range(3)]
    post2 = PassRatePosterior(explore=0.0)
    for t in solved:
        for _ in range(50):
            post2.update(t.id, 1.0)
    res = controller(UniformPolicy(), selector=post2, refill=False).run_step(FakeEngine(solved), TaskStream(solved),
                                                                            SP, step=1, batch_groups=2)
    assert [g.prompt_id for g in res.groups] == ["t0"] and res.accounting.skipped_prompts == 1


def test_adaptive_pilots_every_prompt_and_extends_only_mixed_ones_within_budget():
    # Three prompts in four are always or never solved (the common case the policy is for).
    tasks = [task(i, [1.0, 0.0, 1.0, 0.5][i % 4]) for i in range(400)]
    p_of = {t.id: t.metadata["p"] for t in tasks}

    def run(policy, steps=6):
        eng, src, ctl = FakeEngine(tasks), TaskStream(tasks), controller(policy)
        tokens = useful = extended = 0
        for s in range(1, steps + 1):
            res = ctl.run_step(eng, src, SP, step=s, batch_groups=8)
            check_books(res, eng, statuses={"kept", "filtered"})
            assert res.accounting.total_rollouts <= 8 * 8  # the uniform step's budget
            assert res.accounting.generated_tokens == eng.produced - tokens
            tokens = eng.produced
            useful += res.accounting.groups - res.accounting.zero_variance_groups
            for g in res.groups:
                if p_of[g.prompt_id] in (0.0, 1.0) and isinstance(policy, AdaptiveGroupPolicy):
                    assert len(g.rollouts) == 2 and {r.status for r in g.rollouts} == {"filtered"}
                    assert {r.status_reason for r in g.rollouts} == {"adaptive: unanimous pilot of 2"}
                if len(g.rollouts) == 8 and isinstance(policy, AdaptiveGroupPolicy):
                    extended += 1
                    assert not zero_variance(g) and {r.status for r in g.rollouts} == {"kept"}
        return tokens / max(useful, 1), extended

    adaptive, extended = run(AdaptiveGroupPolicy(pilot=2, oversample=2.0, max_rounds=4))
    uniform, _ = run(UniformPolicy())
    assert extended >= 3
    assert adaptive < uniform  # fewer generated tokens per informative group


def test_adaptive_streams_extensions_beside_running_pilots_with_the_batch_rounds_decisions():
    """On a step-level engine a mixed pilot is extended as soon as it ends, beside the pilots still running, instead
    of after the round's longest pilot: the same groups, fewer engine steps where lengths have a tail."""
    # Mixed prompts whose samples are 2 or 40 tokens long, among always- and never-solved ones.
    tasks = [task(i, [1.0, 0.0, 0.5, 0.5][i % 4], length=[2, 2, 2, 40]) for i in range(64)]

    def run(engine):
        ctl, src = controller(AdaptiveGroupPolicy(pilot=2, oversample=2.0, max_rounds=4)), TaskStream(tasks)
        res = ctl.run_step(engine, src, SP, step=1, batch_groups=4)
        check_books(res, statuses={"kept", "filtered"})
        assert res.accounting.total_rollouts <= 4 * 8
        return res, (engine.inner if isinstance(engine, BatchOnlyEngine) else engine).steps

    streamed, steps_streamed = run(FakeEngine(tasks))
    batched, steps_batched = run(BatchOnlyEngine(tasks))
    shape = [[(g.prompt_id, len(g.rollouts), g.rollouts[0].status) for g in r.groups] for r in (streamed, batched)]
    assert shape[0] == shape[1] and any(n == 8 for _, n, _ in shape[0])
    assert streamed.accounting.rounds == batched.accounting.rounds
    assert steps_streamed < steps_batched, (steps_streamed, steps_batched)


def test_adaptive_rejects_a_pilot_as_large_as_the_group():
    tasks = [task(0, 0.5)]
    with pytest.raises(ValueError, match="pilot_samples"):
        controller(AdaptiveGroupPolicy(pilot=8)).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1, batch_groups=1)
    with pytest.raises(ValueError, match="pilot >= 2"):
        AdaptiveGroupPolicy(pilot=1)


def test_early_stop_aborts_decided_groups_and_counts_aborted_tokens():
    lens = [2, 2, 30]  # drawn per sample: most finish at once, some run long
    tasks = [task(0, 1.0, length=lens), task(1, 0.0, length=lens), task(2, 0.5, length=lens)]
    eng = FakeEngine(tasks)
    pol = EarlyStopPolicy(confidence=0.6, min_finished=3)
    res = controller(pol, prior=(0.5, 0.5)).run_step(eng, TaskStream(tasks), SP, step=1, batch_groups=3)
    check_books(res, eng)
    acc = res.accounting
    assert acc.generated_tokens == eng.produced and acc.aborted_tokens > 0 and acc.rollouts["aborted"] > 0
    assert eng.added == 3 * 8  # one request per sample: each is scored and aborted on its own
    by = {g.prompt_id: g for g in res.groups}
    for pid in ("t0", "t1"):
        st = [r.status for r in by[pid].rollouts]
        assert "aborted" in st and zero_variance(by[pid])
        assert all(r.reward is None for r in by[pid].rollouts if r.status == "aborted")
    # The mixed group's decision never fires once its finished samples disagree... unless they all agreed first:
    g2 = by["t2"]
    if any(r.status == "aborted" for r in g2.rollouts):
        done = [r.reward for r in g2.rollouts if r.status != "aborted"]
        assert len(set(done)) == 1
    # Uniform on the same tasks spends more tokens.
    uni = controller(UniformPolicy()).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1, batch_groups=3)
    assert acc.generated_tokens < uni.accounting.generated_tokens


def test_early_stop_never_aborts_with_an_uninformative_prior_and_high_confidence():
    tasks = [task(0, 1.0, length=[2, 20])]
    res = controller(EarlyStopPolicy(confidence=0.95)).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1,
                                                                 batch_groups=1)
    assert res.accounting.aborted_tokens == 0 and {r.status for r in res.groups[0].rollouts} == {"kept"}


def test_partial_rollouts_stop_at_the_target_and_resume_carried_samples_under_new_weights():
    tasks = [task(0, 0.5, length=3), task(1, 0.5, length=3), task(2, 0.5, length=40), task(3, 0.5, length=3),
             task(4, 0.5, length=3), task(5, 0.5, length=3)]
    eng = FakeEngine(tasks)
    pol = PartialRolloutPolicy(over_provision=0.5)
    ctl = controller(pol)
    src = TaskStream(tasks)
    returned = 0
    long_group = None
    for step in range(1, 6):
        res = ctl.run_step(eng, src, SP, step=step, batch_groups=2)
        check_books(res, eng, statuses={"kept"})
        assert len(res.groups) >= 2
        returned += res.accounting.rollout_tokens
        for g in res.groups:
            if g.prompt_id == "t2":
                long_group = (step, g)
        ctl.finalize(res, trained_version=eng.weight_version)
        if any(g.prompt_id == "t2" for g in res.groups):
            assert res.accounting.staleness_max >= 1 and res.accounting.staleness_mean > 0
        eng.load_weights()  # the trainer's update reaches the engine
        assert not eng.requests  # nothing left running between steps
    # Every token the engine produced is either in a returned rollout or still carried.
    assert eng.produced == returned + sum(len(o.token_ids) for g in pol.carry for o in g.outputs if o)
    step, g = long_group
    assert step > 1 and g.group_id.startswith("s1-")  # started at step 1, finished later
    for r in g.rollouts:
        assert len(r.weight_versions) == len(r.completion_token_ids) == 40
        assert r.weight_versions == sorted(r.weight_versions) and r.weight_versions[0] == 0
        assert r.weight_versions[-1] == step - 1  # resumed under the newer weights
        assert r.step == step


def test_partial_rollouts_keep_the_step_short_on_a_heavy_tail():
    lens = [4] * 15 + [60]  # one sample in 16 runs long: most groups have none, nearly every step has one
    tasks = [task(i, 0.5, length=lens) for i in range(40)]
    def engine_steps(pol, steps=4):
        eng = FakeEngine(tasks)
        ctl, src = controller(pol), TaskStream(tasks)
        for s in range(1, steps + 1):
            ctl.run_step(eng, src, SP, step=s, batch_groups=4)
            eng.load_weights()
        return eng.steps
    assert engine_steps(PartialRolloutPolicy(over_provision=1.0)) < engine_steps(UniformPolicy()) / 1.3


def test_partial_rollouts_cut_the_tail_when_a_selector_hands_over_fewer_prompts():
    """With the posterior and no refill a step may get fewer prompts than it asked for; partial rollouts then wait
    for the same share of what is in flight (here 4 of 6), not for every group."""
    lens = [4] * 15 + [60]
    tasks = [task(i, 0.5 if i % 2 else 1.0, length=lens) for i in range(48)]
    post = PassRatePosterior(explore=0.0)
    for t in tasks[::2]:  # every other prompt is known solved: skipped, not replaced
        for _ in range(50):
            post.update(t.id, 1.0)
    eng = FakeEngine(tasks)
    ctl = controller(PartialRolloutPolicy(over_provision=0.5), selector=post, refill=False)
    res = ctl.run_step(eng, TaskStream(tasks), SP, step=1, batch_groups=8)
    check_books(res, eng)
    assert res.accounting.skipped_prompts == 6  # 12 drawn, 6 kept
    assert len(res.groups) == 4 and len(ctl.policy.carry) == 2
    assert res.accounting.carried_out_tokens > 0


def test_controller_rejects_bad_input():
    with pytest.raises(ValueError, match="batch_groups"):
        controller(UniformPolicy()).run_step(FakeEngine([]), TaskStream([task(0, 1.0)]), SP, step=1, batch_groups=0)
    with pytest.raises(ValueError, match="not an engine"):
        controller(UniformPolicy()).run_step(object(), TaskStream([task(0, 1.0)]), SP, step=1, batch_groups=1)
    with pytest.raises(ValueError, match="oversample"):
        DynamicSamplingPolicy(oversample=0.5)


def test_partial_rollouts_with_per_sample_lengths_resubmit_only_unfinished_samples():
    import dataclasses

    tasks = [task(i, 0.5, length=64) for i in range(30)]
    lengths = {}

    def params_fn(t, j, sp):  # per-sample lengths: one long sample in four
        n = 40 if (int(t.id[1:]) + j) % 4 == 0 else 3
        lengths[(t.id, j)] = n
        return dataclasses.replace(sp, max_tokens=n)

    eng = FakeEngine(tasks)
    pol = PartialRolloutPolicy(over_provision=1.0)
    ctl = controller(pol, params_fn=params_fn)
    returned = 0
    for step in range(1, 5):
        res = ctl.run_step(eng, TaskStream(tasks[(step - 1) * 4:]), SP, step=step, batch_groups=2)
        check_books(res, eng)
        returned += res.accounting.rollout_tokens
        for g in res.groups:
            for r in g.rollouts:
                assert len(r.completion_token_ids) == lengths[(g.prompt_id, r.sample_index)]
        eng.load_weights()
    assert eng.produced == returned + sum(len(o.token_ids) for g in pol.carry for o in g.outputs if o)


def test_config_rejects_a_pilot_as_large_as_the_group_at_load_time():
    from rollwise.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="control.pilot_samples \\(4\\) must be smaller"):
        load_config(None, ["control.policy=adaptive", "control.pilot_samples=4", "rollout.samples_per_prompt=4"])
    with pytest.raises(ConfigError, match="'control.pilot_samples' is set but has no effect unless control.policy is 'adaptive'"):
        load_config(None, ["control.pilot_samples=4", "rollout.samples_per_prompt=4"])


def test_early_stop_composes_with_dynamic_and_adaptive_allocation():
    """`control.policy: [dynamic, early_stop]` / `[adaptive, early_stop]`: the allocation decides what to sample, the
    rule aborts decided groups inside it; the books balance and fewer tokens are generated than without the rule."""
    from types import SimpleNamespace

    from rollwise.control import make_controller

    lens = [2, 2, 30]
    tasks = [task(i, p, length=lens) for i, p in enumerate([1.0, 0.0, 0.5, 1.0, 0.0, 0.5, 0.0, 1.0])]
    # direct_above 0.5 and a budget that allows it: an unseen prompt (0.61 under the prior) gets its full group at
    # once, so the rule can stop it (a pilot of 2 is never stopped: min_finished is 3)
    base = dict(select="all", oversample=1.5, max_rounds=2, pilot_samples=2, budget_factor=3.0, direct_above=0.5,
                confidence=0.6, min_finished=3, over_provision=0.5, prior_a=0.5, prior_b=0.5, decay=0.95,
                skip_above=0.6, explore=0.1, refill=True)
    for alloc in ("dynamic", "adaptive"):
        spent = {}
        for names in ([alloc], [alloc, "early_stop"]):
            ctl = make_controller(SimpleNamespace(policy=names, **base), FakeEnv(), FakeTokenizer())
            ctl.score_workers = 2
            eng = FakeEngine(tasks)
            res = ctl.run_step(eng, TaskStream(tasks), SP, step=1, batch_groups=2)
            check_books(res, eng)
            assert res.accounting.generated_tokens == eng.produced
            spent[len(names)] = res.accounting.generated_tokens
            aborted = [r for g in res.groups for r in g.rollouts if r.status == "aborted"]
            if len(names) == 1:
                assert not aborted
            else:  # only groups decided zero-variance lose samples; a group's finished rewards all agree
                assert aborted
                for g in res.groups:
                    if any(r.status == "aborted" for r in g.rollouts):
                        assert len({r.reward for r in g.rollouts if r.status != "aborted"}) == 1
        assert spent[2] < spent[1], (alloc, spent)


def test_adaptive_pilots_under_early_stop_only_wait_for_the_samples_they_asked_for():
    """A pilot of 2 out of K=8 leaves six slots never requested: the rule must not count them as still running
    (it would then wait on, or abort, samples that do not exist)."""
    from rollwise.control import EarlyStop

    tasks = [task(0, 1.0, length=2), task(1, 0.0, length=2)]
    eng = FakeEngine(tasks)
    ctl = controller(AdaptiveGroupPolicy(pilot=2, max_rounds=1, oversample=1.0),
                     stop=EarlyStop(confidence=0.6, min_finished=2))
    res = ctl.run_step(eng, TaskStream(tasks), SP, step=1, batch_groups=2)
    check_books(res, eng)
    assert [len(g.rollouts) for g in res.groups] == [2, 2] and eng.added == 4
    assert {r.status for g in res.groups for r in g.rollouts} == {"filtered"}


def test_config_composes_policies_and_refuses_what_does_not_compose():
    from rollwise.config import ControlConfig

    assert ControlConfig(policy=["dynamic", "early_stop"]).policies == ("dynamic", "early_stop")
    assert ControlConfig(policy="adaptive").policies == ("adaptive",)
    for bad, msg in ((["adaptive", "dynamic"], "one allocation"), (["early_stop", "early_stop"], "each once"),
                     ([], "one allocation"), (["partial", "early_stop"], "partial rollouts drive")):
        with pytest.raises(ValueError, match=msg):
            ControlConfig(policy=bad)


def test_a_custom_scorer_gets_each_completion_as_task_text_and_token_ids():
    """`Scorer` items are `ScoreItem`s: (task, text, token ids), the ids a batch reward passes on as completion_ids."""
    from rollwise.types import Score

    seen = []

    def scorer(items):
        seen.extend(items)
        return [Score(1.0) for _ in items]

    tasks = [task(0, 1.0)]
    res = controller(UniformPolicy(), scorer=scorer).run_step(FakeEngine(tasks), TaskStream(tasks), SP, step=1,
                                                              batch_groups=1)
    rolls = res.groups[0].rollouts
    assert len(seen) == len(rolls) == SP.n
    assert all(len(it) == 3 and it[0].id == tasks[0].id and isinstance(it[1], str) for it in seen)
    assert sorted(list(it[2]) for it in seen) == sorted(list(r.completion_token_ids) for r in rolls)
