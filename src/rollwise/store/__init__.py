"""rollwise.store: keep every rollout (Parquet shards per step), reuse them (replay), account for them (card).

Names are imported lazily: `RolloutStore` and the schema need pyarrow, while the replay buffer and the
card are pure Python, and importing `rollwise.store.replay` should not pull pyarrow in.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ROLLOUT_SCHEMA": "rollwise.store.schema",
    "SCHEMA_VERSION": "rollwise.store.schema",
    "rollout_to_row": "rollwise.store.schema",
    "row_to_rollout": "rollwise.store.schema",
    "RolloutStore": "rollwise.store.writer",
    "ShardError": "rollwise.store.writer",
    "StoreScan": "rollwise.store.writer",
    "ReplayBuffer": "rollwise.store.replay",
    "ReplayConfig": "rollwise.store.replay",
    "ReplaySample": "rollwise.store.replay",
    "build_rollout_card": "rollwise.store.card",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'rollwise.store' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
