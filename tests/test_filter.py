"""The Filter room (rollwise/filter.py): one place decides every status after scoring.

Attacks: a policy that makes the scorer fail must not escape a wrong answer's penalty (errored rollouts count
and train as wrong answers by default); a status rule written in a second place would let the loop and the
controller disagree about which groups carry signal (the grep-style test keeps the literal status tuples and
status assignments in the room)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollwise import filter as room
from rollwise.control import DynamicSamplingPolicy, RolloutController
from rollwise.filter import FilterRules, advantage_values, informative, mark, select, trainable, zero_variance
from rollwise.train.advantages import assign_advantages
from rollwise.types import ROLLOUT_STATUSES, Rollout, RolloutGroup

SRC = Path(__file__).resolve().parents[1] / "src" / "rollwise"
ROOMS = {"filter.py", "types.py"}  # types.py defines the vocabulary (ROLLOUT_STATUSES) and the first status


def _ro(k, reward, status="kept", finish="stop", gid="g"):
    return Rollout(prompt_id="p", group_id=gid, sample_index=k, prompt_token_ids=[1], completion_token_ids=[2, 3],
                   logprobs=[-0.1, -0.1], weight_versions=[0, 0], loss_mask=[1, 1], finish_reason=finish,
                   reward=reward, status=status, status_reason="" if status == "kept" else "why")


def test_a_policy_gains_nothing_by_making_the_scorer_fail():
    """Before: the errored sample got advantage 0 and no gradient, better than the -0.58 of a wrong answer."""
    g = RolloutGroup("p", "g", [_ro(0, 1.0), _ro(1, 0.0), _ro(2, 0.0), _ro(3, None, "errored")])
    assign_advantages([g], "grpo")
    right, wrong1, wrong2, errored = (r.advantage for r in g.rollouts)
    assert errored == pytest.approx(wrong1) and errored < 0 < right  # exactly a wrong answer's advantage
    sel = select([g], FilterRules())
    assert g.rollouts[3] in sel.trainable and g.rollouts[3].status == "errored"  # trained, and still shown errored
    # The opt-out leaves it out of advantages and the loss (and says so in advantage_values).
    assign_advantages([g], "grpo", rules=FilterRules(errored_reward=None))
    assert g.rollouts[3].advantage == 0.0 and advantage_values(g, FilterRules(errored_reward=None))[3] is None
    assert g.rollouts[3] not in trainable([g], FilterRules(errored_reward=None))


def test_errored_is_never_worth_more_than_the_worst_answer_of_its_group():
    """With a user reward scaled to [-1, 1], errored_reward 0.0 would beat a -1 answer: the group minimum wins."""
    g = RolloutGroup("p", "g", [_ro(0, 1.0), _ro(1, -1.0), _ro(2, None, "errored")])
    assert advantage_values(g, FilterRules(errored_reward=0.0)) == [1.0, -1.0, -1.0]
    assert advantage_values(g, FilterRules(errored_reward=-5.0)) == [1.0, -1.0, -5.0]


def test_an_errored_rollout_whose_generation_did_not_finish_never_trains():
    g = RolloutGroup("p", "g", [_ro(0, 1.0), _ro(1, 0.0), _ro(2, None, "errored", finish="abort"),
                                _ro(3, None, "aborted", finish="abort")])
    assert advantage_values(g) == [1.0, 0.0, None, None]
    assign_advantages([g], "grpo")
    assert [r.sample_index for r in select([g]).trainable] == [0, 1]


def test_a_dropped_group_trains_nothing_not_even_its_errored_rollouts():
    g = RolloutGroup("p", "g", [_ro(0, 0.0), _ro(1, 0.0), _ro(2, None, "errored")])  # all wrong: no signal
    assert zero_variance(g) and not informative(g)
    assign_advantages([g], "grpo")
    sel = select([g], FilterRules(skip_zero_variance=True))
    assert sel.zero_variance_groups == 1 and sel.trainable == [] and g.dropped
    assert [r.status for r in g.rollouts] == ["filtered", "filtered", "errored"]  # errored stays shown
    with pytest.raises(ValueError, match="unknown rollout status"):
        mark(g, "discarded", "nope")


def test_a_right_answer_next_to_an_errored_one_is_a_signal_for_control_and_loop_alike():
    """The controller's dynamic sampling and the loop ask the same room with the same rules."""
    g = RolloutGroup("p", "g", [_ro(0, 1.0), _ro(1, 1.0), _ro(2, None, "errored")])
    assert informative(g) and not informative(g, FilterRules(errored_reward=None))
    ctl = RolloutController(DynamicSamplingPolicy(), env=None, tokenizer=None, encode=lambda t: [1],
                            rules=FilterRules(errored_reward=None))
    assert ctl.rules.errored_reward is None


def test_overlong_filtering_keeps_the_baseline_and_drops_the_tokens():
    g = RolloutGroup("p", "g", [_ro(0, 1.0), _ro(1, 0.0, "truncated", "length"), _ro(2, 0.0)])
    assign_advantages([g], "grpo")
    rules = FilterRules(overlong_filter=True, max_tokens=16)
    sel = select([g], rules)
    assert [r.sample_index for r in sel.trainable] == [0, 2]
    assert g.rollouts[1].status == "filtered" and "max_tokens=16" in g.rollouts[1].status_reason
    assert g.rollouts[1].advantage != 0.0


def test_rules_come_from_the_algo_section():
    from rollwise.config import AlgoConfig

    assert FilterRules.from_config(AlgoConfig()).errored_reward == 0.0
    r = FilterRules.from_config(AlgoConfig(errored_reward=None, skip_zero_variance=False), overlong_filter=True)
    assert r.errored_reward is None and not r.skip_zero_variance and r.overlong_filter


# ------------------------------------------------------------------------------------------- one room


def status_rule_sites(root: Path) -> list[str]:
    """Places outside the room that spell a status rule: a literal tuple/list/set of two or more statuses, a
    `status=` keyword or `.status` assignment with a status literal, or an assignment to `.status_reason`."""
    statuses = set(ROLLOUT_STATUSES)
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() in ROOMS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                lits = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if sum(v in statuses for v in lits) >= 2:
                    found.append(f"{where} literal statuses {lits}")
            elif isinstance(node, ast.keyword) and node.arg == "status" and \
                    isinstance(node.value, ast.Constant) and node.value.value in statuses:
                found.append(f"{where} status={node.value.value!r}")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for a in ast.walk(t):
                        if isinstance(a, ast.Attribute) and a.attr == "status_reason":
                            found.append(f"{where} assigns .status_reason")
                        elif isinstance(a, ast.Attribute) and a.attr == "status" and \
                                isinstance(node.value, ast.Constant) and node.value.value in statuses:
                            found.append(f"{where} assigns .status = {node.value.value!r}")
    return found


def test_status_rules_live_only_in_the_filter_room():
    sites = status_rule_sites(SRC)
    assert not sites, "status rules outside rollwise/filter.py (call the room instead):\n" + "\n".join(sites)


def test_the_grep_sees_a_planted_status_rule(tmp_path):
    pkg = tmp_path / "rollwise"
    (pkg / "run").mkdir(parents=True)
    (pkg / "filter.py").write_text('TRAINED = ("kept", "truncated")\n')
    (pkg / "run" / "loop.py").write_text(
        'def f(groups):\n'
        '    return [r for g in groups for r in g.rollouts if r.status in ("kept", "truncated")]\n'
        'def g(r):\n    r.status, r.status_reason = "filtered", "mine"\n'
        'def h(r):\n    return dict(status="kept")\n')
    sites = status_rule_sites(pkg)
    assert len(sites) == 3 and all(s.startswith("run/loop.py") for s in sites), sites


def test_the_room_is_what_everyone_imports():
    """control, train and the loop reach the rules through the room, not copies of them."""
    from rollwise.control import context
    from rollwise.train import overlong

    assert context.mark is room.mark
    replayed_truncation = _ro(0, 0.0, "kept", "length")  # a replayed copy of a truncated sample is 'kept'
    assert overlong.is_overlong(replayed_truncation) and room.is_overlong(replayed_truncation)
    loop = (SRC / "run" / "loop.py").read_text()
    assert "select(groups, self.rules)" in loop and "def assign_advantages" not in loop and "def _mark" not in loop


def test_generation_time_decisions_see_errored_samples_as_the_loop_will():
    """Adaptive pilots and early stop decide on raw Scores: the room gives them the values training will use."""
    from rollwise.filter import differ, score_values
    from rollwise.types import Score

    scores = [Score(1.0), Score(0.0, error="fn raised"), None]
    assert score_values(scores) == [1.0, 0.0] and differ(score_values(scores))
    assert score_values(scores, FilterRules(errored_reward=None)) == [1.0]
    assert not differ(score_values(scores, FilterRules(errored_reward=None)))


def test_no_signal_says_why_a_step_trained_nothing():
    def step(groups, rules=room.DEFAULT_RULES):
        assign_advantages(groups, "grpo", rules=rules)
        return room.no_signal(groups, select(groups, rules).trainable, rules)

    mixed = RolloutGroup("p", "m", [_ro(0, 1.0, gid="m"), _ro(1, 0.0, gid="m")])
    assert step([mixed, RolloutGroup("p", "e", [_ro(0, 1.0, gid="e"), _ro(1, 1.0, gid="e")])]) is None
    equal = [RolloutGroup("p", f"g{i}", [_ro(0, 1.0, gid=f"g{i}"), _ro(1, 1.0, gid=f"g{i}")]) for i in range(3)]
    assert step(equal) == "3/3 groups had equal rewards"
    broken = [RolloutGroup("p", "b", [_ro(k, None, "errored", gid="b") for k in range(4)])]
    assert step(broken) == "every sample's reward errored (4/4)"
    # An informative group whose rollouts all left the loss (DAPO's overlong filter), beside an equal one.
    long = RolloutGroup("p", "t", [_ro(0, 1.0, "truncated", "length", gid="t"), _ro(1, 0.0, "truncated", "length", gid="t")])
    same = RolloutGroup("p", "s", [_ro(0, 0.0, gid="s"), _ro(1, 0.0, gid="s")])
    why = step([long, same], FilterRules(overlong_filter=True, max_tokens=6))
    assert why == ("1/2 groups had equal rewards; the other groups' 2 rollouts: 2 filtered "
                   "(overlong filtering: hit max_tokens=6)")


def test_a_critic_baseline_trains_groups_of_equal_rewards():
    """`algo.advantage: gae`: every token's advantage is its return minus the critic's value, so an all-correct group
    still teaches; it is counted as zero-variance but not dropped, and the step is not reported as signal-free.
    The scalar advantage left on each rollout is its return (the reward its advantages see), errored ones as wrong."""
    from rollwise.config import AlgoConfig
    from rollwise.filter import no_signal

    rules = FilterRules.from_config(AlgoConfig(advantage="gae"))
    assert rules.critic_baseline and not FilterRules.from_config(AlgoConfig()).critic_baseline
    same = RolloutGroup("p", "g", [_ro(0, 1.0), _ro(1, 1.0)])
    mixed = RolloutGroup("q", "h", [_ro(0, 1.0, gid="h"), _ro(1, 0.0, gid="h"), _ro(2, None, "errored", gid="h")])
    assign_advantages([same, mixed], "gae", rules=rules)
    assert [r.advantage for r in same.rollouts + mixed.rollouts] == [1.0, 1.0, 1.0, 0.0, 0.0]
    sel = select([same, mixed], rules)
    assert sel.zero_variance_groups == 1 and set(map(id, sel.trainable)) == set(map(id, same.rollouts + mixed.rollouts))
    zeros = RolloutGroup("z", "z", [_ro(0, 0.0, gid="z"), _ro(1, 0.0, gid="z")])
    assign_advantages([zeros], "gae", rules=rules)
    assert no_signal([zeros], select([zeros], rules).trainable, rules) is None
    # the group baseline drops the same equal group
    assign_advantages([same], "grpo")
    assert select([same], FilterRules()).trainable == []
