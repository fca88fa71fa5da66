"""What a resume reads back from the store: a shard's write-ahead log record, quarantined (not deleted) shards, and
the replay buffer rebuilt from stored rollouts."""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rollwise.store.replay import ReplayBuffer, ReplayConfig
from rollwise.store.writer import JournalMismatch, RolloutStore, ShardError


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


def _rewrite(path, edit_record=None, edit_table=None):
    """Rewrite a shard as an editing tool would: rows and metadata carried over, the seal left as it was."""
    t = pq.read_table(path)
    meta = dict(t.schema.metadata)
    if edit_record is not None:
        rec = json.loads(meta[b"rollwise.journal"])
        edit_record(rec)
        meta[b"rollwise.journal"] = json.dumps(rec).encode()
    if edit_table is not None:
        t = edit_table(t)
    pq.write_table(t.replace_schema_metadata(meta), path)


def _negate(t):
    i = t.schema.get_field_index("advantage")
    return t.set_column(i, "advantage", pc.negate(t.column("advantage")))


def _halve_logprobs(t):
    i = t.schema.get_field_index("logprobs")
    rows = t.column("logprobs").to_pylist()
    rows[-1] = [v / 2 for v in rows[-1]]
    return t.set_column(i, t.schema.field("logprobs"), pa.array(rows, type=t.schema.field("logprobs").type))


@pytest.mark.parametrize("attack, reason", [
    ("copy", "it holds step 1's rows and record, not step 2's"),
    ("halve log-probs", "its rows do not match the sha256 sealed with its write-ahead log record"),
    ("negate record", "its write-ahead log record does not match the sha256 sealed with it"),
    ("drop trained", "its write-ahead log record does not match the sha256 sealed with it"),
    ("negate rows", "its rows do not match the sha256 sealed with its write-ahead log record"),
    ("drop record", "its write-ahead log record was removed"),
])
def test_a_record_is_sealed_to_its_shard_by_step_and_hash(tmp_path, rollouts_for, attack, reason):
    """A shard copied over another step's name, a record or rows edited after they were written, a record taken
    out: each used to be read back as if it were that step's; now each is a JournalMismatch naming the file."""
    store = RolloutStore(tmp_path)
    for s in (1, 2):
        store.write_step(s, rollouts_for(s), journal={"step": s, "trained": [[f"s{s}-g0", 1, -0.5]]})
    assert store.read_step_journal(2).sealed and store.read_step_journal(2).record["trained"] == [["s2-g0", 1, -0.5]]
    p = store.shard_path(2)
    if attack == "copy":
        shutil.copyfile(store.shard_path(1), p)
    elif attack == "negate record":
        _rewrite(p, edit_record=lambda rec: rec["trained"][0].__setitem__(2, 0.5))
    elif attack == "drop trained":
        _rewrite(p, edit_record=lambda rec: rec.pop("trained"))
    elif attack == "negate rows":
        _rewrite(p, edit_table=_negate)
    elif attack == "halve log-probs":
        _rewrite(p, edit_table=_halve_logprobs)
    else:
        t = pq.read_table(p)
        pq.write_table(t.replace_schema_metadata({k: v for k, v in t.schema.metadata.items()
                                                   if k != b"rollwise.journal"}), p)
    with pytest.raises(JournalMismatch) as info:
        store.read_step_journal(2)
    assert str(info.value).startswith(f"{p}: ") and reason in str(info.value) and "\n" not in str(info.value)


def test_a_record_without_a_seal_is_returned_unsealed(tmp_path, rollouts_for):
    """A record written before seals existed reads back marked unsealed (the resume re-generates its step)."""
    store = RolloutStore(tmp_path)
    store.write_step(1, rollouts_for(1), journal={"step": 1})
    t = pq.read_table(store.shard_path(1))
    pq.write_table(t.replace_schema_metadata({k: v for k, v in t.schema.metadata.items()
                                               if k != b"rollwise.journal_seal"}), store.shard_path(1))
    got = store.read_step_journal(1)
    assert got is not None and not got.sealed and got.record == {"step": 1}


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
