"""The rollout store keeps tree rollouts: parent links, fork positions and per-token advantages, exactly; old shards
without those columns still read; rows whose links cannot be a tree are refused at write, naming the rollout."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollwise.store.replay import ReplayBuffer, ReplayConfig, rescue_groups, reuse_rollouts
from rollwise.store.schema import ADDED_COLUMNS, ROLLOUT_SCHEMA, rollout_to_row, rows_to_table
from rollwise.store.writer import RolloutStore
from rollwise.types import Rollout, RolloutGroup


def tree_group(rollout_factory, step: int = 0, group: int = 0) -> list[Rollout]:
    """A binary tree of 4 leaves (TreeSpec(fanout=2).parents(4) == [None, 0, 0, 1]): sample 1 forks from the root at
    token 8, sample 2 at 16, and sample 3 is a copy of sample 1, which ended (12 tokens) before 3's branch point."""
    lengths, parents, forks = [20, 12, 22, 12], [None, 0, 0, 1], [0, 8, 16, 12]
    out = []
    for i, (n, p, f) in enumerate(zip(lengths, parents, forks)):
        r = rollout_factory(step=step, group=group, sample=i, n_tokens=n, tree_parent=p, tree_fork=f,
                            token_advantages=[0.5 - 0.25 * (i % 3)] * n)  # float32-exact values
        out.append(r)
    # A child shares its parent's tokens before its fork (the factory gives every sample the same tokens already).
    assert out[1].completion_token_ids[:8] == out[0].completion_token_ids[:8]
    return out


def test_a_tree_group_round_trips_through_a_shard(tmp_path, rollout_factory):
    store = RolloutStore(tmp_path)
    rs = tree_group(rollout_factory) + [rollout_factory(group=1, sample=s) for s in range(2)]  # plus a plain group
    path = store.write_step(0, rs)
    assert store.read() == rs
    schema = pq.read_schema(path)
    assert schema.field("tree_parent").type == pa.int32() and schema.field("tree_fork").type == pa.int32()
    assert schema.field("token_advantages").type == pa.list_(pa.float32())
    back = {(r.group_id, r.sample_index): r for r in store.read()}
    assert [back[("s0-g0", i)].tree_parent for i in range(4)] == [None, 0, 0, 1]
    assert [back[("s0-g0", i)].tree_fork for i in range(4)] == [0, 8, 16, 12]
    assert back[("s0-g1", 0)].tree_parent is None and back[("s0-g1", 0)].token_advantages is None
    # The columns are plain Parquet: a tree is one query away.
    t = store.read_table(columns=["group_id", "sample_index", "tree_parent"])
    assert t.filter(pa.compute.is_valid(t["tree_parent"])).num_rows == 3


def test_token_advantages_are_stored_as_float32(tmp_path, rollout_factory):
    store = RolloutStore(tmp_path)
    store.write_step(0, [rollout_factory(n_tokens=3, token_advantages=[0.1, -1 / 3, 2.0])])
    (back,) = store.read()
    assert back.token_advantages == pytest.approx([0.1, -1 / 3, 2.0], rel=1e-7)
    assert back.token_advantages[2] == 2.0 and back.token_advantages[0] != 0.1  # float32 rounding, as documented


def _strip_tree_columns(path) -> None:
    """Rewrite a shard as a rollwise from before the tree columns wrote it (same schema version, fewer columns)."""
    t = pq.read_table(path)
    old = t.drop_columns(list(ADDED_COLUMNS))
    pq.write_table(old.replace_schema_metadata(t.schema.metadata), path, write_page_checksum=True)


def test_an_old_shard_without_the_tree_columns_still_reads(tmp_path, rollouts_for, rollout_factory):
    store = RolloutStore(tmp_path)
    old = rollouts_for(0)
    _strip_tree_columns(store.write_step(0, old))
    assert not set(ADDED_COLUMNS) & set(pq.read_schema(store.shard_path(0)).names)
    store.write_step(1, tree_group(rollout_factory, step=1))  # a resumed run, now with trees
    assert store.verify() == []
    back = store.read()
    assert back[: len(old)] == old and all(r.tree_parent is None and r.tree_fork is None and r.token_advantages is None
                                           for r in back[: len(old)])
    assert [r.tree_parent for r in back[len(old):]] == [None, 0, 0, 1]
    t = store.read_table(steps=[0], columns=["tree_fork", "step"])
    assert t.schema.field("tree_fork").type == pa.int32() and t.column("tree_fork").null_count == len(old)
    assert store.counts_by_status()["total"] == len(old) + 4


def test_a_shard_missing_an_original_column_is_still_refused(tmp_path, rollouts_for):
    store = RolloutStore(tmp_path)
    p = store.write_step(0, rollouts_for(0))
    t = pq.read_table(p)
    pq.write_table(t.drop_columns(["logprobs"]).replace_schema_metadata(t.schema.metadata), p)
    with pytest.raises(Exception, match=r"missing column\(s\) \['logprobs'\]"):
        store.read()


@pytest.mark.parametrize(
    "sample, change, message",
    [
        (3, dict(tree_parent=7), "rollout s0-g0/3: tree_parent 7 is not a sample index of its group (it has 0, 1, 2, 3)"),
        (2, dict(tree_parent=2), "rollout s0-g0/2: tree_parent 2 is its own sample_index"),
        (0, dict(tree_parent=3, tree_fork=0), "rollout s0-g0/0: its tree_parent links form a cycle"),
        (2, dict(tree_fork=23), "rollout s0-g0/2: tree_fork 23 is outside [0, 22] (its completion length)"),
        (1, dict(tree_fork=-1), "rollout s0-g0/1: tree_fork -1 is outside [0, 12]"),
        (1, dict(tree_fork=2.5), "rollout s0-g0/1: tree_fork must be a completion position (an integer) or None"),
        (1, dict(tree_fork=None), "rollout s0-g0/1: tree_parent 0 without a tree_fork"),
        (0, dict(tree_fork=4), "rollout s0-g0/0: tree_fork 4 without a tree_parent"),
        (1, dict(tree_parent="0"), "rollout s0-g0/1: tree_parent must be a sample index"),
        (2, dict(token_advantages=[0.0]), "rollout s0-g0/2: token_advantages has 1 entries for 22 completion tokens"),
    ],
)
def test_rows_that_cannot_be_a_tree_are_refused_at_write(tmp_path, rollout_factory, sample, change, message):
    store = RolloutStore(tmp_path)
    store.write_step(0, [rollout_factory(sample=9)])
    before = store.shard_path(0).read_bytes()
    rs = tree_group(rollout_factory)
    for k, v in change.items():
        setattr(rs[sample], k, v)
    with pytest.raises(ValueError) as e:
        store.write_step(0, rs)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert store.shard_path(0).read_bytes() == before  # nothing was written over the old shard


def test_a_parent_in_another_group_is_not_a_parent(rollout_factory):
    """Sample 5 exists, but in group 1: a link never crosses groups."""
    rs = tree_group(rollout_factory) + [rollout_factory(group=1, sample=5)]
    rs[1].tree_parent = 5
    with pytest.raises(ValueError, match=r"rollout s0-g0/1: tree_parent 5 is not a sample index of its group"):
        rows_to_table([rollout_to_row(r, run="r") for r in rs])


def test_numpy_tree_fields_are_accepted(tmp_path, rollout_factory):
    np = pytest.importorskip("numpy")
    rs = tree_group(rollout_factory)
    for r in rs:
        r.tree_fork = np.int64(r.tree_fork)
        r.tree_parent = None if r.tree_parent is None else np.int32(r.tree_parent)
        r.token_advantages = list(np.asarray(r.token_advantages, dtype=np.float32))
    store = RolloutStore(tmp_path)
    store.write_step(0, rs)
    assert [(r.tree_parent, r.tree_fork) for r in store.read()] == [(None, 0), (0, 8), (0, 16), (1, 12)]
    assert ROLLOUT_SCHEMA.field("tree_parent").nullable


def test_replayed_copies_leave_their_tree(rollout_factory):
    """A copy trains away from its tree: a rescued one joins another group (its old parent index would name a
    stranger there) and gets a new advantage; a reused one keeps its advantages but not its links."""
    old = tree_group(rollout_factory, step=0, group=0)
    for r in old:
        r.reward = 1.0
    buf = ReplayBuffer(ReplayConfig(max_age=10, max_reuse=5, seed=0))
    buf.add(old, version=0)
    failed = RolloutGroup("p0", "s1-g0", [rollout_factory(step=1, group=0, sample=i, reward=0.0) for i in range(2)])
    (copy,) = rescue_groups(buf, [failed], version=1, k=1)
    assert copy.group_id == "s1-g0" and copy.sample_index == 2
    assert copy.tree_parent is None and copy.tree_fork is None and copy.token_advantages is None
    reused = reuse_rollouts(buf, 4, version=1)
    assert reused and all(r.tree_parent is None and r.tree_fork is None for r in reused)
    by_index = {r.sample_index: r for r in old}
    assert all(r.token_advantages == by_index[r.sample_index].token_advantages for r in reused)
    assert [r.tree_parent for r in old] == [None, 0, 0, 1]  # the buffer's own rollouts are untouched
