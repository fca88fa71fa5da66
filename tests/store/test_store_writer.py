from __future__ import annotations

import os
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollwise.store.writer import RolloutStore, ShardError, shard_name


def test_write_and_read_back(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path / "run")
    written = {s: rollouts_for(s) for s in (0, 1, 2)}
    for s, rs in written.items():
        path = store.write_step(s, rs)
        assert path.name == f"step-{s:06d}.parquet" and path.is_file()
    assert store.steps() == [0, 1, 2]
    assert store.read() == [r for s in (0, 1, 2) for r in written[s]]
    assert store.read(steps=[1]) == written[1]
    table = store.read_table()
    assert table.num_rows == 18 and set(table.column("run").to_pylist()) == {"run"}


def test_rewriting_a_step_replaces_it(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    store.write_step(4, rollouts_for(4, groups=3))
    store.write_step(4, rollouts_for(4, groups=1))
    assert store.read_table().num_rows == 3 and store.steps() == [4]


def test_empty_step_records_completion(tmp_path):
    store = RolloutStore(tmp_path)
    store.write_step(0, [])
    assert store.steps() == [0] and store.read() == []


def test_truncate_after_drops_later_steps(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    for s in range(5):
        store.write_step(s, rollouts_for(s, groups=1, samples=1))
    assert store.truncate_after(2) == [3, 4]
    assert store.steps() == [0, 1, 2]


def test_decoder_fills_prompt_and_token_texts(tmp_path, rollout_factory):
    calls = []

    def decode(ids):
        calls.append(list(ids))
        return "".join(chr(ord("a") + i % 26) for i in ids)

    store = RolloutStore(tmp_path, run="named", decode=decode)
    store.write_step(0, [rollout_factory(sample=i) for i in range(4)])
    # one decode per distinct completion token id (5), not one per token occurrence (20)
    assert sum(1 for c in calls if len(c) == 1) == 5
    t = store.read_table(columns=["run", "prompt_text", "token_texts"])
    assert t.column("run").to_pylist() == ["named"] * 4
    assert t.column("prompt_text").to_pylist()[0] == decode([1, 2, 3])
    assert t.column("token_texts").to_pylist()[0] == [decode([i]) for i in range(10, 15)]


@pytest.mark.parametrize("step", [-1, 1.0, "3"])
def test_bad_step_argument(tmp_path, step):
    with pytest.raises(ValueError, match="non-negative integer"):
        RolloutStore(tmp_path).write_step(step, [])


def test_numpy_step_is_accepted(tmp_path):
    np = pytest.importorskip("numpy")
    assert RolloutStore(tmp_path).write_step(np.int64(3), []).name == "step-000003.parquet"


def test_crash_leftover_temp_file_is_ignored_and_cleaned(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    store.write_step(0, rollouts_for(0))
    # A writer killed mid-write leaves a partial temp file next to the shards.
    leftover = store.dir / f".{shard_name(1)}.99999.tmp"
    leftover.write_bytes(b"PAR1 half a parquet file")
    assert store.steps() == [0]
    assert store.read_table().num_rows == 6  # readers never see temp files
    fresh = RolloutStore(tmp_path)
    fresh.write_step(1, rollouts_for(1))
    assert not leftover.exists()
    assert fresh.steps() == [0, 1]


def test_failed_write_leaves_old_shard_intact(tmp_path, rollouts_for, monkeypatch):
    store = RolloutStore(tmp_path)
    store.write_step(0, rollouts_for(0))
    before = store.shard_path(0).read_bytes()

    def killed(*a, **k):
        raise KeyboardInterrupt  # stands in for a kill between the temp write and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        store.write_step(0, rollouts_for(0, groups=5))
    monkeypatch.undo()
    assert store.shard_path(0).read_bytes() == before
    assert [p.name for p in store.dir.iterdir()] == [shard_name(0)]


def _corrupt(store: RolloutStore, step: int, how: str) -> None:
    p = store.shard_path(step)
    data = p.read_bytes()
    if how == "truncated":
        p.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        p.write_bytes(b"not parquet at all")
    elif how == "empty":
        p.write_bytes(b"")
    elif how == "foreign":
        pq.write_table(pa.table({"x": [1, 2]}), p)
    elif how == "newer":
        t = pq.read_table(p)
        pq.write_table(t.replace_schema_metadata({b"rollwise.schema_version": b"999"}), p)
    elif how == "bitflip":
        # Keep header and footer, scramble the column data in the middle.
        mid = len(data) // 2
        p.write_bytes(data[:200] + bytes(b ^ 0xFF for b in data[200:mid]) + data[mid:])


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "foreign", "newer", "bitflip"])
def test_bad_shard_names_the_file_and_others_load(tmp_path, rollouts_for, how):
    store = RolloutStore(tmp_path)
    for s in range(3):
        store.write_step(s, rollouts_for(s))
    _corrupt(store, 1, how)
    bad = store.shard_path(1)

    with pytest.raises(ShardError) as e:
        store.read()
    msg = str(e.value)
    assert str(bad) in msg and "\n" not in msg and e.value.path == bad

    scan = store.scan()
    assert [err.path for err in scan.errors] == [bad]
    assert scan.shards == [store.shard_path(0), store.shard_path(2)]
    assert scan.table.num_rows == 12

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rs = store.read(strict=False)
    assert [r.step for r in rs] == [0] * 6 + [2] * 6
    assert len(w) == 1 and str(bad) in str(w[0].message)


def test_counts_by_status(tmp_path, rollout_factory):
    store = RolloutStore(tmp_path)
    store.write_step(0, [rollout_factory(sample=0), rollout_factory(sample=1, status="errored", status_reason="timeout")])
    store.write_step(1, [rollout_factory(step=1, status="truncated"), rollout_factory(step=1, sample=1, status="filtered")])
    assert store.counts_by_status() == {"total": 4, "kept": 1, "filtered": 1, "errored": 1, "truncated": 1, "aborted": 0}
    assert RolloutStore(tmp_path / "none").counts_by_status()["total"] == 0


def test_unknown_column_is_a_user_error(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    store.write_step(0, rollouts_for(0))
    with pytest.raises(ValueError, match="unknown rollout column"):
        store.read_table(columns=["nope"])
