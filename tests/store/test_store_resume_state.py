"""What a resume reads back from the store: a shard's write-ahead log record, quarantined (not deleted) shards, and
the replay buffer rebuilt from stored rollouts."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rollwise.store.replay import ReplayBuffer, ReplayConfig
from rollwise.store.writer import RolloutStore, ShardError


def test_journal_travels_with_its_shard_and_readers_ignore_it(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    rec = {"step": 3, "trained": [["s3-g0", 1, -0.5]], "metrics": {"loss": 0.25, "nan": float("nan")}}
    store.write_step(3, rollouts_for(3), journal=rec)
    store.write_step(4, rollouts_for(4))
    got = store.read_journal(3)
    assert got["trained"] == rec["trained"] and got["metrics"]["loss"] == 0.25
    assert store.read_journal(4) is None
    assert store.read(steps=[3]) == rollouts_for(3)  # the rows are unchanged by the record
    assert pq.read_table(store.shard_path(3)).num_rows == 6


def test_unreadable_journal_is_a_shard_error(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    store.write_step(1, rollouts_for(1), journal={"a": 1})
    p = store.shard_path(1)
    p.write_bytes(p.read_bytes()[:-20])
    with pytest.raises(ShardError, match="step-000001.parquet"):
        store.read_journal(1)


def test_quarantine_moves_later_shards_aside_byte_for_byte(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    for s in (1, 2, 3):
        store.write_step(s, rollouts_for(s))
    data = {s: store.shard_path(s).read_bytes() for s in (2, 3)}
    dest = tmp_path / "quarantine" / "x"
    assert store.quarantine_after(1, dest) == [2, 3]
    assert store.steps() == [1]
    assert {s: (dest / f"step-{s:06d}.parquet").read_bytes() for s in (2, 3)} == data


def test_replay_buffer_state_round_trips_through_the_store(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    buf = ReplayBuffer(ReplayConfig(capacity=8, max_age=10, max_reuse=3, seed=5))
    for s in (1, 2):
        rs = rollouts_for(s)
        store.write_step(s, rs)
        buf.add(rs)
    buf.sample(3, 2)  # uses counted, RNG advanced
    state = buf.state_dict()
    rows = {(r.step, r.group_id, r.sample_index): r for r in store.read()}
    other = ReplayBuffer(ReplayConfig(capacity=8, max_age=10, max_reuse=3, seed=99))
    other.load_state_dict(state, lambda step, gid, idx: rows[(step, gid, idx)])
    assert other.state_dict() == state
    a = [(s.rollout.group_id, s.rollout.sample_index, s.uses) for s in buf.sample(4, 2)]
    b = [(s.rollout.group_id, s.rollout.sample_index, s.uses) for s in other.sample(4, 2)]
    assert a == b
