"""The rollout card: what a reader needs to audit a run's numbers, as one JSON-ready dict.

Published RL results rarely say how many rollouts errored, were filtered or truncated, or how accuracy
treated them. The card states it: counts by status, the accuracy definition in words, seeds, config hash,
library versions and the sha256 of every checkpoint's safetensors files.

Its top-level keys are chosen not to clash with the rest of `summary.json` (`eval_before`, `eval_after`,
`steps`, `wall_s`), so the loop can write `{**card, "eval_before": …}` and get the `rollouts` counts the
run-directory contract asks for at the top level.

Deliberately left out: anything measured (accuracy values, timings: the loop owns those) and hashing
non-safetensors files (tokenizer and config files are small and readable as they are).
"""

from __future__ import annotations

import hashlib
import os
import platform
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from rollwise.types import ROLLOUT_STATUSES

ACCURACY_METHOD_DEFAULT = (
    "accuracy = correct / evaluated prompts, one greedy completion per held-out prompt, correct when the "
    "environment's verifier gives reward >= 1; a completion whose scoring errored or timed out counts as "
    "incorrect (it is never dropped from the denominator); a truncated completion is scored as it stands."
)
"""A definition the loop may pass as `accuracy_method` when it computes accuracy exactly this way."""

PACKAGES: tuple[str, ...] = ("rollwise", "torch", "transformers", "safetensors", "pyarrow", "numpy")


def normalise_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """Counts with every status present and `total` checked against their sum (one-line error if off)."""
    unknown = [k for k in counts if k != "total" and k not in ROLLOUT_STATUSES]
    if unknown:
        raise ValueError(f"rollout counts have unknown status(es) {unknown}; known: {', '.join(ROLLOUT_STATUSES)}")
    out = {s: int(counts.get(s, 0)) for s in ROLLOUT_STATUSES}
    total = sum(out.values())
    if "total" in counts and int(counts["total"]) != total:
        raise ValueError(f"rollout counts say total={counts['total']} but the statuses add up to {total}")
    if any(v < 0 for v in out.values()):
        raise ValueError(f"rollout counts must be non-negative, got {out}")
    return {"total": total, **out}


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions from package metadata (nothing is imported; None when not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def checkpoint_hashes(path: str | os.PathLike[str]) -> dict[str, str]:
    """{file name: sha256} for the `*.safetensors` files of a checkpoint directory (or one such file)."""
    p = Path(path)
    if p.is_file():
        return {p.name: sha256_file(p)}
    if not p.is_dir():
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise ValueError(f"checkpoint directory {p} has no *.safetensors files to hash")
    return {f.name: sha256_file(f) for f in files}


def build_rollout_card(
    counts: Mapping[str, int],
    *,
    config_hash: str,
    seeds: Mapping[str, int | None] | Sequence[int],
    accuracy_method: str,
    checkpoints: Mapping[str, str | os.PathLike[str]] | Sequence[str | os.PathLike[str]] = (),
    packages: Sequence[str] = PACKAGES,
) -> dict[str, Any]:
    """The card as a JSON-serialisable dict.

    config_hash: the run config's hash, e.g. `rollwise.config.config_hash(cfg)`.
    counts: rollouts by status, e.g. `RolloutStore.counts_by_status()`.
    seeds: the run's seeds, named ({"run": 0, "sampling": 1}) or as a list.
    accuracy_method: how the reported accuracy is computed, in words (see ACCURACY_METHOD_DEFAULT).
    checkpoints: {label: checkpoint dir} or a list of dirs (labelled by directory name).
    """
    from rollwise.store.schema import SCHEMA_VERSION

    if not accuracy_method.strip():
        raise ValueError("accuracy_method must say how accuracy is computed; it is the point of the card")
    if isinstance(checkpoints, Mapping):
        labelled = {str(k): v for k, v in checkpoints.items()}
    else:
        labelled = {}
        for c in checkpoints:
            label = Path(c).name
            labelled[label if label not in labelled else str(c)] = c
    return {
        "rollouts": normalise_counts(counts),
        "accuracy_method": accuracy_method,
        "seeds": dict(seeds) if isinstance(seeds, Mapping) else [int(s) for s in seeds],
        "config_hash": config_hash,
        "versions": package_versions(packages),
        "checkpoints": {label: checkpoint_hashes(p) for label, p in labelled.items()},
        "rollout_schema_version": SCHEMA_VERSION,
    }
