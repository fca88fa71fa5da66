"""One model call per distinct judged input: a content-keyed score cache for rewards computed by a model.

A group of samples often holds the same completion several times (a converged policy, short answers), and a
held-out evaluation repeats the greedy answers of the step before. A judge or reward model (`rewards.model_rewards`)
asks its cache first: a hit costs nothing, and copies of one input in the same batch, or in batches scored at once
by other threads, wait for the one call that computes it.

NOTE on the key (`input_key`): the sha256 of the canonical JSON of every field the model reads (the task's prompt,
answer and columns, and the completion). JSON quotes and escapes each string, so no completion can spell another
input's key by writing a field's boundary into its text; the digest keeps the cache's memory independent of the
texts' length.

Each Score that comes back carries `info["judge_calls"]` (1 when this sample's input was computed, else 0) and
`info["judge_cache_hits"]` (the opposite): summed over a step they are the `judge_calls` / `judge_cache_hits`
metrics (`COUNT_KEYS`, `judge_metrics`), and composite rewards add them up across parts (`add_counts`).
Errored scores (the engine failed) are handed to the samples waiting on them but never kept: the next call tries
again.

Deliberately left out: a cache kept across runs (verdicts belong to one judge and one template) and eviction by
age; the cache holds at most `max_entries` scores, dropping the oldest first.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rollwise.types import Score

COUNT_KEYS = ("judge_calls", "judge_cache_hits")
"""Per-sample counts in `Score.info` that add up across the parts of a composite reward and over a step."""


def input_key(fields: Mapping[str, Any]) -> str:
    """The cache key of one judged input: sha256 of its fields as canonical JSON (see the module's NOTE)."""
    blob = json.dumps(fields, sort_keys=True, ensure_ascii=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def add_counts(into: dict[str, Any], info: Mapping[str, Any]) -> None:
    """Add `info`'s per-sample counts (`COUNT_KEYS`) into `into` (a composite score's info)."""
    for k in COUNT_KEYS:
        v = info.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            into[k] = int(into.get(k, 0)) + v


def judge_metrics(infos: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """`judge_calls`, `judge_cache_hits` and `judge_cache_hit_rate` over samples' infos (a step's rollouts'
    env_info); empty when no sample was judged."""
    calls = hits = 0
    seen = False
    for info in infos:
        c, h = info.get("judge_calls"), info.get("judge_cache_hits")
        if isinstance(c, int) or isinstance(h, int):
            seen = True
            calls += int(c or 0)
            hits += int(h or 0)
    if not seen:
        return {}
    total = calls + hits
    return {"judge_calls": float(calls), "judge_cache_hits": float(hits),
            "judge_cache_hit_rate": hits / total if total else 0.0}


def _counted(score: Score, call: bool) -> Score:
    return replace(score, info={**score.info, "judge_calls": int(call), "judge_cache_hits": int(not call)})


@dataclass
class _Pending:
    """An input being computed by some call; others wait for `done`."""

    done: threading.Event = field(default_factory=threading.Event)
    score: Score | None = None


@dataclass
class ScoreCache:
    """Scores by `input_key`, shared by every thread that scores with the same reward."""

    max_entries: int = 200_000
    """Most scores kept; the oldest go first."""
    _scores: OrderedDict[str, Score] = field(default_factory=OrderedDict)
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self._scores)

    def scores(self, keys: Sequence[str], compute: Callable[[list[int]], list[Score]]) -> list[Score]:
        """The score of each key, in order: cached ones as they are, the rest from one `compute(indices)` call on
        the indices of the first occurrence of each new key (it returns their scores, in order, and must not
        raise). Every score is marked with its sample's call / hit count (`COUNT_KEYS`)."""
        out: list[Score | None] = [None] * len(keys)
        mine: dict[str, tuple[int, _Pending]] = {}  # new keys this call computes -> (first index, slot)
        copies: list[tuple[int, str]] = []  # repeats of a key this call computes
        waits: list[tuple[int, _Pending]] = []  # keys another call is computing
        with self._lock:
            for i, k in enumerate(keys):
                if k in self._scores:
                    self._scores.move_to_end(k)
                    out[i] = _counted(self._scores[k], False)
                elif k in mine:
                    copies.append((i, k))
                elif k in self._pending:
                    waits.append((i, self._pending[k]))
                else:
                    slot = _Pending()
                    self._pending[k] = slot
                    mine[k] = (i, slot)
        try:
            todo = [i for i, _ in mine.values()]
            got = compute(todo) if todo else []
            if len(got) != len(todo):
                raise RuntimeError(f"a model reward returned {len(got)} scores for {len(todo)} inputs")
        except BaseException as e:
            got = [Score(0.0, error=f"{type(e).__name__}: {e}") for _ in todo]
            if not isinstance(e, Exception):
                self._release(mine, got)
                raise
        self._release(mine, got)
        for (k, (i, _)), s in zip(mine.items(), got):
            out[i] = _counted(s, True)
        for i, k in copies:
            out[i] = _counted(mine[k][1].score or Score(0.0, error="not scored"), False)
        for i, slot in waits:
            slot.done.wait()
            out[i] = _counted(slot.score or Score(0.0, error="not scored"), False)
        return [s if s is not None else Score(0.0, error="not scored") for s in out]

    def _release(self, mine: dict[str, tuple[int, _Pending]], got: list[Score]) -> None:
        """Keep the computed scores (not the errored ones), and wake whoever waits on them."""
        with self._lock:
            for (k, (_, slot)), s in zip(mine.items(), got):
                slot.score = s
                self._pending.pop(k, None)
                if s.error is None:
                    self._scores[k] = s
                    while len(self._scores) > self.max_entries:
                        self._scores.popitem(last=False)
            for k, (_, slot) in mine.items():  # keys compute never answered (it raised): still woken
                self._pending.pop(k, None)
        for _, slot in mine.values():
            slot.done.set()


__all__ = ["COUNT_KEYS", "ScoreCache", "add_counts", "input_key", "judge_metrics"]
