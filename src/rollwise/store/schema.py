"""The Arrow schema of one stored rollout, and exact conversion between `Rollout` and a row.

One row is one sampled completion. Token-level fields are Arrow lists of the same length as
`completion_token_ids` (the Rollout's own invariant); dict-valued fields (`reward_parts`, `timings`,
`env_info`) are JSON text, not Arrow maps, because HF `datasets` cannot load Arrow map columns and
DuckDB reads JSON text with `->>`/`json_extract` just as well.

Two columns exist only in the store, never on `Rollout`: `prompt_text` and `token_texts` (the decoded
prompt and one decoded string per completion token). They are filled when the writer is given a decoder,
so the report can shade tokens by log-prob without a tokenizer; token ids stay the source of truth.

The schema version is written into each shard's Parquet key-value metadata (`rollwise.schema_version`).
Readers reject a shard from a newer schema instead of guessing; add columns, never repurpose one, and bump
the version when a reader would need to know.

Tree rollouts (docs/tree.md) added three nullable columns without a version bump: `tree_parent` and `tree_fork`
(the sample a row branched from, and the completion position where its own tokens start) and `token_advantages`
(list<float32>). They are `ADDED_COLUMNS`: a shard written before them reads back with them null (the Rollout's
fields None), and an older rollwise reading a newer shard ignores them (it cannot run trees either). The tree
links are checked where the other fields are: a row's fork must lie in [0, its completion length] (per row, in
`rollout_to_row`) and its parent must be another sample of its own group, without cycles (per shard, in
`rows_to_table`, which sees the whole group). To query a run whose shards span the change with DuckDB, read
them with `union_by_name=true`.

Agent episodes (docs/agents.md) added one more nullable column the same way: `segments`, a list of structs (the
`types.RolloutSegment` fields: prompt and completion ids, log-probs, weight versions, loss mask, and the reason the
segment started), null for a rollout that is one sequence. Each segment's per-token lists are checked against its
completion ids like the row's own; `num_generated` counts the policy tokens of every segment.

Deliberately left out: tensors (rows are plain lists), and a column for the prompt's dataset record (the
environment owns that; `env_info` carries what an audit needs).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from rollwise.types import ROLLOUT_STATUSES, Rollout, RolloutSegment

SCHEMA_VERSION = 1
SCHEMA_VERSION_KEY = b"rollwise.schema_version"

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_token_ids", pa.list_(pa.int32()), nullable=False),
        # float64, not float32: the engine's float32 log-probs fit exactly, and Python floats round-trip.
        pa.field("logprobs", pa.list_(pa.float64()), nullable=False),
        pa.field("weight_versions", pa.list_(pa.int64()), nullable=False),
        pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("finish_reason", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("reward_parts", pa.string(), nullable=False),  # JSON object {name: float}
        pa.field("advantage", pa.float64()),
        pa.field("status", pa.string(), nullable=False),  # one of ROLLOUT_STATUSES
        pa.field("status_reason", pa.string(), nullable=False),
        pa.field("timings", pa.string(), nullable=False),  # JSON object {stage: seconds}
        pa.field("env_info", pa.string(), nullable=False),  # JSON object (turns, tool calls, ...)
        pa.field("seed", pa.int64()),
        pa.field("num_generated", pa.int32(), nullable=False),  # sum(loss_mask): handy in SQL
        pa.field("prompt_text", pa.string()),  # store-only: decoded prompt, when a decoder was given
        pa.field("token_texts", pa.list_(pa.string())),  # store-only: one string per completion token
        pa.field("tree_parent", pa.int32()),  # sample_index of the sample this one branched from (None: root/plain)
        pa.field("tree_fork", pa.int32()),  # completion position where its own tokens start (None: not a tree)
        # float32: what the trainer computes the loss in; a round trip is exact for float32 values.
        pa.field("token_advantages", pa.list_(pa.float32())),  # [len(completion_token_ids)] or None
        pa.field("segments", pa.list_(pa.struct([  # an agent episode's further sequences (types.RolloutSegment)
            pa.field("prompt_token_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("completion_token_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("logprobs", pa.list_(pa.float64()), nullable=False),
            pa.field("weight_versions", pa.list_(pa.int64()), nullable=False),
            pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
            pa.field("reason", pa.string(), nullable=False),
        ]))),
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

COLUMNS: tuple[str, ...] = tuple(ROLLOUT_SCHEMA.names)
ADDED_COLUMNS: tuple[str, ...] = ("tree_parent", "tree_fork", "token_advantages", "segments")
"""Nullable columns added after schema version 1 shipped: a shard without them reads them as null."""
_JSON_COLUMNS = ("reward_parts", "timings", "env_info")


def _dumps(value: Mapping[str, Any], what: str, r: Rollout) -> str:
    try:
        return json.dumps(dict(value), sort_keys=False, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise ValueError(f"rollout {r.group_id}/{r.sample_index}: {what} is not JSON-serialisable ({e})") from None


def _check_lengths(r: Rollout) -> None:
    n = len(r.completion_token_ids)
    for name in ("logprobs", "weight_versions", "loss_mask"):
        if len(getattr(r, name)) != n:
            raise ValueError(
                f"rollout {r.group_id}/{r.sample_index}: {name} has {len(getattr(r, name))} entries for "
                f"{n} completion tokens; every per-token list must match completion_token_ids"
            )
    if r.token_advantages is not None and len(r.token_advantages) != n:
        raise ValueError(
            f"rollout {r.group_id}/{r.sample_index}: token_advantages has {len(r.token_advantages)} entries for "
            f"{n} completion tokens; every per-token list must match completion_token_ids"
        )
    for k, seg in enumerate(r.segments or ()):
        m = len(seg.completion_token_ids)
        for name in ("logprobs", "weight_versions", "loss_mask"):
            if len(getattr(seg, name)) != m:
                raise ValueError(f"rollout {r.group_id}/{r.sample_index}: segment {k} has {len(getattr(seg, name))} "
                                 f"{name} for {m} completion tokens; every per-token list must match its ids")
        if not seg.prompt_token_ids:
            raise ValueError(f"rollout {r.group_id}/{r.sample_index}: segment {k} has an empty prompt")
    if r.status not in ROLLOUT_STATUSES:
        raise ValueError(f"rollout {r.group_id}/{r.sample_index}: status {r.status!r} is not one of {ROLLOUT_STATUSES}")
    _check_tree_fields(r, n)


def _is_index(v: object) -> bool:
    """An int or a numpy integer, never a bool or a float."""
    if isinstance(v, bool):
        return False
    try:
        operator.index(v)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def _check_tree_fields(r: Rollout, n: int) -> None:
    """The per-row half of the tree check (the group half is `_check_tree_links`)."""
    where = f"rollout {r.group_id}/{r.sample_index}"
    parent, fork = r.tree_parent, r.tree_fork
    if parent is not None and not _is_index(parent):
        raise ValueError(f"{where}: tree_parent must be a sample index (an integer) or None, got {parent!r}")
    if fork is None:
        if parent is not None:
            raise ValueError(f"{where}: tree_parent {parent} without a tree_fork (where its own tokens start)")
        return
    if not _is_index(fork):
        raise ValueError(f"{where}: tree_fork must be a completion position (an integer) or None, got {fork!r}")
    if not 0 <= fork <= n:
        raise ValueError(f"{where}: tree_fork {fork} is outside [0, {n}] (its completion length)")
    if parent is None and fork != 0:
        raise ValueError(f"{where}: tree_fork {fork} without a tree_parent (a root's own tokens start at 0)")


def rollout_to_row(
    r: Rollout,
    *,
    run: str,
    step: int | None = None,
    prompt_text: str | None = None,
    token_texts: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One `Rollout` as a plain dict with exactly the schema's columns. `step` defaults to `r.step`."""
    _check_lengths(r)
    if token_texts is not None and len(token_texts) != len(r.completion_token_ids):
        raise ValueError(
            f"rollout {r.group_id}/{r.sample_index}: {len(token_texts)} token texts for "
            f"{len(r.completion_token_ids)} completion tokens"
        )
    return {
        "run": run,
        "step": int(r.step if step is None else step),
        "prompt_id": str(r.prompt_id),
        "group_id": str(r.group_id),
        "sample_index": int(r.sample_index),
        # Lists are copied as they are: Arrow checks and converts element types when the table is built.
        "prompt_token_ids": list(r.prompt_token_ids),
        "completion_token_ids": list(r.completion_token_ids),
        "logprobs": list(r.logprobs),
        "weight_versions": list(r.weight_versions),
        "loss_mask": list(r.loss_mask),
        "text": r.text,
        "finish_reason": r.finish_reason,
        "reward": None if r.reward is None else float(r.reward),
        "reward_parts": _dumps(r.reward_parts, "reward_parts", r),
        "advantage": None if r.advantage is None else float(r.advantage),
        "status": r.status,
        "status_reason": r.status_reason,
        "timings": _dumps(r.timings, "timings", r),
        "env_info": _dumps(r.env_info, "env_info", r),
        "seed": None if r.seed is None else int(r.seed),
        "num_generated": r.num_generated,
        "prompt_text": prompt_text,
        "token_texts": None if token_texts is None else list(token_texts),
        "tree_parent": None if r.tree_parent is None else int(r.tree_parent),
        "tree_fork": None if r.tree_fork is None else int(r.tree_fork),
        "token_advantages": None if r.token_advantages is None else list(r.token_advantages),
        "segments": None if not r.segments else [
            {"prompt_token_ids": list(s.prompt_token_ids), "completion_token_ids": list(s.completion_token_ids),
             "logprobs": list(s.logprobs), "weight_versions": list(s.weight_versions), "loss_mask": list(s.loss_mask),
             "reason": str(s.reason)} for s in r.segments],
    }


def row_to_rollout(row: Mapping[str, Any]) -> Rollout:
    """The inverse of `rollout_to_row` (store-only columns are dropped)."""
    return Rollout(
        prompt_id=row["prompt_id"],
        group_id=row["group_id"],
        sample_index=int(row["sample_index"]),
        prompt_token_ids=list(row["prompt_token_ids"]),
        completion_token_ids=list(row["completion_token_ids"]),
        logprobs=list(row["logprobs"]),
        weight_versions=list(row["weight_versions"]),
        loss_mask=list(row["loss_mask"]),
        text=row["text"],
        finish_reason=row["finish_reason"],
        reward=row["reward"],
        reward_parts=json.loads(row["reward_parts"]),
        advantage=row["advantage"],
        status=row["status"],
        status_reason=row["status_reason"],
        timings=json.loads(row["timings"]),
        env_info=json.loads(row["env_info"]),
        seed=row["seed"],
        step=int(row["step"]),
        # .get: rows from a shard written before the tree columns existed (`ADDED_COLUMNS`) have none.
        tree_parent=row.get("tree_parent"),
        tree_fork=row.get("tree_fork"),
        token_advantages=None if row.get("token_advantages") is None else list(row["token_advantages"]),
        segments=None if not row.get("segments") else [
            RolloutSegment(list(s["prompt_token_ids"]), list(s["completion_token_ids"]), list(s["logprobs"]),
                           list(s["weight_versions"]), list(s["loss_mask"]), s["reason"]) for s in row["segments"]],
    )


def _check_tree_links(rows: Sequence[Mapping[str, Any]]) -> None:
    """The group half of the tree check: each tree_parent names another sample of the row's own group (in the same
    shard: a group is written once, whole), and following parents never comes back to where it started."""
    groups: dict[str, dict[int, int | None]] = {}
    for row in rows:
        groups.setdefault(row["group_id"], {})[row["sample_index"]] = row.get("tree_parent")
    for gid, parents in groups.items():
        if all(p is None for p in parents.values()):
            continue
        for idx, parent in parents.items():
            if parent is None:
                continue
            if parent == idx:
                raise ValueError(f"rollout {gid}/{idx}: tree_parent {parent} is its own sample_index")
            if parent not in parents:
                raise ValueError(
                    f"rollout {gid}/{idx}: tree_parent {parent} is not a sample index of its group "
                    f"(it has {', '.join(map(str, sorted(parents)[:8]))}{', ...' if len(parents) > 8 else ''})"
                )
        for idx in parents:
            seen, cur = {idx}, parents[idx]
            while cur is not None:
                if cur in seen:
                    raise ValueError(f"rollout {gid}/{idx}: its tree_parent links form a cycle (back to sample {cur})")
                seen.add(cur)
                cur = parents[cur]


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (from `rollout_to_row`) as a table with the rollout schema, version metadata included.

    A value of the wrong type (a float token id, a string log-prob), or a tree_parent that is not another sample
    of the row's group, is a one-line ValueError.
    """
    _check_tree_links(rows)
    try:
        return pa.Table.from_pylist(list(rows), schema=ROLLOUT_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"rollouts do not fit the rollout schema: {' '.join(str(e).split())}") from None


def table_to_rollouts(table: pa.Table) -> list[Rollout]:
    return [row_to_rollout(row) for row in table.to_pylist()]


def shard_schema_version(schema: pa.Schema) -> int | None:
    """The schema version a shard declares, or None if it has no rollwise metadata."""
    raw = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if raw is None:
        return None
    try:
        return int(raw.decode())
    except ValueError:
        return None
