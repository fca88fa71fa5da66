from __future__ import annotations

import pytest

from rollwise.store.replay import ReplayBuffer, ReplayConfig, rollout_version
from rollwise.types import RolloutGroup


def test_add_admits_only_scored_allowed_statuses(rollout_factory):
    buf = ReplayBuffer()
    n = buf.add(
        [
            rollout_factory(sample=0),
            rollout_factory(sample=1, status="filtered"),
            rollout_factory(sample=2, status="errored"),
            rollout_factory(sample=3, reward=None),
            rollout_factory(sample=4, status="aborted"),
        ],
        version=0,
    )
    assert n == 2 and len(buf) == 2


def test_re_adding_same_rollout_replaces(rollout_factory):
    buf = ReplayBuffer()
    buf.add([rollout_factory(sample=0)], version=0)
    buf.add([rollout_factory(sample=0, reward=0.25)], version=1)
    assert len(buf) == 1
    (s,) = buf.sample(5, current_version=1)
    assert s.rollout.reward == 0.25 and s.version == 1


def test_capacity_drops_oldest(rollout_factory):
    buf = ReplayBuffer(ReplayConfig(capacity=3))
    buf.add([rollout_factory(group=g) for g in range(5)], version=0)
    assert len(buf) == 3
    assert {s.rollout.prompt_id for s in buf.sample(10, 0)} == {"p2", "p3", "p4"}


def test_version_defaults_to_oldest_generated_token(rollout_factory):
    r = rollout_factory(n_tokens=4, weight_versions=[0, 3, 2, 5], loss_mask=[0, 1, 1, 1])
    assert rollout_version(r) == 2  # the env token of version 0 does not count
    buf = ReplayBuffer()
    buf.add([r])
    (s,) = buf.sample(1, current_version=6)
    assert s.version == 2 and s.age == 4


def test_age_bound(rollout_factory):
    buf = ReplayBuffer(ReplayConfig(max_age=2))
    buf.add([rollout_factory(group=0)], version=1)
    buf.add([rollout_factory(group=1)], version=3)
    assert {s.rollout.prompt_id for s in buf.successes("p0", 3, k=5) + buf.successes("p1", 3, k=5)} == set()  # reward 0
    samples = buf.sample(10, current_version=4)  # version 1 is 3 old: gone
    assert [s.rollout.prompt_id for s in samples] == ["p1"] and samples[0].age == 1
    assert buf.evict_stale(current_version=6) == 1 and len(buf) == 0


def test_reuse_limit_and_distinct_samples(rollout_factory):
    buf = ReplayBuffer(ReplayConfig(max_reuse=2, seed=1))
    buf.add([rollout_factory(group=g, sample=s) for g in range(3) for s in range(2)], version=0)
    first = buf.sample(4, 0)
    assert len({(s.rollout.group_id, s.rollout.sample_index) for s in first}) == 4  # distinct within a call
    assert all(s.uses == 1 for s in first)
    uses: dict[tuple[str, int], int] = {}
    for s in first:
        uses[(s.rollout.group_id, s.rollout.sample_index)] = 1
    for _ in range(20):
        for s in buf.sample(4, 0):
            key = (s.rollout.group_id, s.rollout.sample_index)
            uses[key] = uses.get(key, 0) + 1
            assert s.uses == uses[key]
    assert len(buf) == 0  # every rollout used up
    assert sorted(uses.values()) == [2] * 6  # each handed out exactly max_reuse times


def test_sample_returns_behaviour_logprobs_and_versions(rollout_factory):
    r = rollout_factory(n_tokens=3, logprobs=[-0.5, -1.0, -2.0], weight_versions=[4, 4, 5])
    buf = ReplayBuffer()
    buf.add([r])
    (s,) = buf.sample(1, current_version=6)
    assert s.behaviour_logprobs == [-0.5, -1.0, -2.0] and s.weight_versions == [4, 4, 5]
    assert s.version == 4 and s.age == 2


def test_sampling_is_seeded(rollout_factory):
    def run():
        buf = ReplayBuffer(ReplayConfig(seed=7))
        buf.add([rollout_factory(group=g) for g in range(20)], version=0)
        return [s.rollout.prompt_id for s in buf.sample(5, 0)]

    assert run() == run()


def test_rescue_all_failed_groups(rollout_factory):
    buf = ReplayBuffer(ReplayConfig(max_age=3))
    # Past successes for prompt p0 at versions 1 and 2, one failure; only a failure for p1.
    buf.add([rollout_factory(group=0, sample=1, step=1, group_id="old-a")], version=1)  # reward 1.0
    buf.add([rollout_factory(group=0, sample=3, step=2, group_id="old-b")], version=2)  # reward 1.0
    buf.add([rollout_factory(group=0, sample=0, group_id="old-c")], version=2)  # reward 0.0
    buf.add([rollout_factory(group=1, sample=0, group_id="old-d")], version=2)  # reward 0.0

    failed_p0 = RolloutGroup("p0", "now-0", [rollout_factory(group=0, sample=s, reward=0.0, group_id="now-0") for s in range(4)])
    failed_p1 = RolloutGroup("p1", "now-1", [rollout_factory(group=1, sample=s, reward=0.0, group_id="now-1") for s in range(4)])
    mixed = RolloutGroup("p0", "now-2", [rollout_factory(group=0, sample=s, group_id="now-2") for s in range(4)])

    out = buf.rescue([failed_p0, failed_p1, mixed], current_version=4, k=2)
    assert list(out) == ["now-0"]  # p1 has no success to offer; the mixed group needs no rescue
    assert [s.rollout.group_id for s in out["now-0"]] == ["old-b", "old-a"]  # newest first
    assert [s.age for s in out["now-0"]] == [2, 3]
    # Rescue does not use up the rollouts, and the age bound applies.
    assert len(buf.rescue([failed_p0], current_version=4)["now-0"]) == 1
    assert [s.rollout.group_id for s in buf.rescue([failed_p0], current_version=5, k=2)["now-0"]] == ["old-b"]


def test_all_failed_ignores_errored_and_needs_a_score(rollout_factory):
    buf = ReplayBuffer()
    errored_success = rollout_factory(sample=1, status="errored")  # reward 1.0 but errored: does not count
    g = RolloutGroup("p0", "g", [rollout_factory(sample=0), errored_success])
    assert buf.all_failed(g)
    assert not buf.all_failed(RolloutGroup("p0", "g", [rollout_factory(sample=0, status="errored")]))
    assert not buf.all_failed(RolloutGroup("p0", "g", [rollout_factory(sample=1)]))


def test_stats(rollout_factory):
    buf = ReplayBuffer()
    assert buf.stats(0) == {"replay_size": 0.0, "replay_age_mean": 0.0, "replay_age_max": 0.0}
    buf.add([rollout_factory(group=0)], version=1)
    buf.add([rollout_factory(group=1)], version=3)
    assert buf.stats(3) == {"replay_size": 2.0, "replay_age_mean": 1.0, "replay_age_max": 2.0}


@pytest.mark.parametrize(
    "kw, msg", [(dict(capacity=0), "capacity"), (dict(max_age=-1), "max_age"), (dict(max_reuse=0), "max_reuse"), (dict(statuses=("ok",)), "statuses")]
)
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        ReplayConfig(**kw)


def test_rollout_without_versions_needs_explicit_version(rollout_factory):
    r = rollout_factory(n_tokens=0)
    with pytest.raises(ValueError, match="no weight versions"):
        ReplayBuffer().add([r])
    assert ReplayBuffer().add([r], version=3) == 1
