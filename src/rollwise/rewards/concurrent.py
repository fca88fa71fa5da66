"""Concurrent scoring with a timeout per call.

Python cannot kill a thread, so a call that overruns its timeout is *abandoned*: its slot is freed at
once, its Score says `timed out after Ns`, and its daemon thread is left to finish and be ignored. That
keeps throughput when a reward function hangs; functions that may spin forever on CPU belong in the
sandbox (whose own wall limit ends them), which is what the code verifier does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from rollwise.envs.base import Task
from rollwise.rewards.base import call_reward
from rollwise.types import Score


def score_many(
    env_or_fn: Any,
    items: Sequence[tuple[Task, str]],
    max_workers: int = 8,
    timeout_s: float | None = 30.0,
) -> list[Score]:
    """Score `(task, completion)` pairs with an environment or reward function; results in input order.

    Every item gets a Score: raising or timing out gives `value=0.0` with `error` saying why.
    """
    if max_workers < 1:
        raise ValueError(f"score_many: max_workers must be >= 1, got {max_workers}")
    n = len(items)
    results: list[Score | None] = [None] * n
    started: dict[int, float] = {}
    cond = threading.Condition()
    running = 0
    next_i = 0

    def work(i: int) -> None:
        nonlocal running
        task, completion = items[i]
        s = call_reward(env_or_fn, task, completion)
        with cond:
            if results[i] is None:  # not already given up on
                results[i] = s
                running -= 1
                started.pop(i, None)
            cond.notify_all()

    with cond:
        while True:
            while running < max_workers and next_i < n:
                started[next_i] = time.monotonic()
                running += 1
                threading.Thread(target=work, args=(next_i,), daemon=True, name=f"score-{next_i}").start()
                next_i += 1
            if next_i >= n and running == 0:
                break
            now = time.monotonic()
            if timeout_s is not None:
                for i, t0 in list(started.items()):
                    if now - t0 >= timeout_s:
                        results[i] = Score(0.0, error=f"timed out after {timeout_s:g}s")
                        running -= 1
                        del started[i]
                oldest = min(started.values(), default=now)
                cond.wait(timeout=max(0.01, oldest + timeout_s - now) if started else None)
            else:
                cond.wait()
    return [r if r is not None else Score(0.0, error="not scored") for r in results]
