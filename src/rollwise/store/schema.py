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

Deliberately left out: tensors (rows are plain lists), and a column for the prompt's dataset record (the
environment owns that; `env_info` carries what an audit needs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from rollwise.types import ROLLOUT_STATUSES, Rollout

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
    ],
    metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()},
)

COLUMNS: tuple[str, ...] = tuple(ROLLOUT_SCHEMA.names)
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
    if r.status not in ROLLOUT_STATUSES:
        raise ValueError(f"rollout {r.group_id}/{r.sample_index}: status {r.status!r} is not one of {ROLLOUT_STATUSES}")


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
        "num_generated": int(sum(r.loss_mask)),
        "prompt_text": prompt_text,
        "token_texts": None if token_texts is None else list(token_texts),
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
    )


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (from `rollout_to_row`) as a table with the rollout schema, version metadata included.

    A value of the wrong type (a float token id, a string log-prob) is a one-line ValueError.
    """
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
