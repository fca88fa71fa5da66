"""Concurrent scoring with a timeout per call.

Python cannot kill a thread, so a call that overruns its timeout is *abandoned*: its slot is freed at
once, its Score says `timed out after Ns`, and its daemon thread is left to finish and be ignored. That
keeps throughput when a reward function hangs; functions that may spin forever on CPU belong in the
sandbox (whose own wall limit ends them), which is what the code verifier does.

Batch scorers: an environment or reward with `score_batch(tasks, completions, completion_ids=None)` (a
TRL-style user reward, `rewards.user`) is called once for all the items instead, and bounds its own time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from rollwise.rewards.base import call_reward, describe_at
from rollwise.types import Score, Task


def _score_batch(scorer: Any, items: Sequence[tuple]) -> list[Score]:
    """One `score_batch` call for all items; a raise or a wrong-length answer gives errored scores."""
    tasks = [it[0] for it in items]
    completions = [it[1] for it in items]
    ids = [it[2] if len(it) > 2 else None for it in items]
    try:
        out = list(scorer.score_batch(tasks, completions, None if any(i is None for i in ids) else ids))
    except Exception as e:  # noqa: BLE001 - turning failures into data is this function's job
        return [Score(0.0, error=describe_at(e)) for _ in items]
    if len(out) != len(items):
        return [Score(0.0, error=f"score_batch returned {len(out)} scores for {len(items)} completions") for _ in items]
    return out


def score_many(
    env_or_fn: Any,
    items: Sequence[tuple[Task, str]] | Sequence[tuple[Task, str, list[int]]],
    max_workers: int = 8,
    timeout_s: float | None = 30.0,
) -> list[Score]:
    """Score `(task, completion)` pairs with an environment or reward function; results in input order.

    Items may carry the completion's token ids as a third element (`(task, text, ids)`): batch scorers pass
    them on as TRL's `completion_ids`. A scorer with `score_batch` gets one call for all the items (the
    caller decides the batch: a step's items, or one group's); otherwise each item is one call, run
    `max_workers` at a time, each bounded by `timeout_s`.
    Every item gets a Score: raising or timing out gives `value=0.0` with `error` saying why.
    """
    if max_workers < 1:
        raise ValueError(f"score_many: max_workers must be >= 1, got {max_workers}")
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"score_many: timeout_s must be positive or None, got {timeout_s}")
    if not items:
        return []
    if callable(getattr(env_or_fn, "score_batch", None)):
        return _score_batch(env_or_fn, items)
    n = len(items)
    results: list[Score | None] = [None] * n
    cond = threading.Condition()
    started: dict[int, tuple[float, int]] = {}  # item -> (start time, worker id)
    abandoned: set[int] = set()  # worker ids whose item timed out: they exit when their call returns
    state = {"next": 0, "done": 0, "workers": 0}

    # NOTE: workers pull items themselves and only wake the main thread when everything is done, so the
    # per-item cost is one lock round-trip, not a thread hand-off.
    def worker(wid: int) -> None:
        while True:
            with cond:
                if wid in abandoned or state["next"] >= n:
                    return
                i = state["next"]
                state["next"] += 1
                started[i] = (time.monotonic(), wid)
            task, completion = items[i][0], items[i][1]
            s = call_reward(env_or_fn, task, completion)
            with cond:
                if results[i] is None:
                    results[i] = s
                    state["done"] += 1
                started.pop(i, None)
                if state["done"] == n:
                    cond.notify_all()

    def spawn() -> None:
        state["workers"] += 1
        threading.Thread(target=worker, args=(state["workers"],), daemon=True, name=f"score-{state['workers']}").start()

    with cond:
        for _ in range(min(max_workers, n)):
            spawn()
        while state["done"] < n:
            if timeout_s is None:
                cond.wait()
                continue
            now = time.monotonic()
            for i, (t0, wid) in list(started.items()):
                if now - t0 >= timeout_s and results[i] is None:
                    results[i] = Score(0.0, error=f"timed out after {timeout_s:g}s")
                    state["done"] += 1
                    del started[i]
                    abandoned.add(wid)
                    if state["next"] < n:
                        spawn()  # replace the stuck worker so throughput holds
            oldest = min((t0 for t0, _ in started.values()), default=now)
            cond.wait(timeout=max(0.005, min(oldest + timeout_s - now, timeout_s)))
    return [r if r is not None else Score(0.0, error="not scored") for r in results]
