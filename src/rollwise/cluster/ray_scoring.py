"""Scoring on Ray actors: verifiers and sandboxes run in `ScoringWorker` actors, not in the driver.

Each actor holds the environment (pickled once at launch) and scores its chunk with the same concurrent,
timeout-guarded `score_many` the local path uses, so a reward function that raises or hangs still yields an
errored Score. A dead actor is restarted and its chunk re-run (scoring is a pure function of task and
completion); every wait has a timeout.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from rollwise.envs.base import Environment
from rollwise.types import Score, ScoreItem


class ScoringWorker:
    def __init__(self, env: Environment, max_workers: int, timeout_s: float | None) -> None:
        self.env = env
        self.max_workers = max_workers
        self.timeout_s = timeout_s

    def pid(self) -> int:
        return os.getpid()

    def score(self, items: list[ScoreItem]) -> list[Score]:
        from rollwise.rewards.concurrent import score_many

        return score_many(self.env, items, max_workers=self.max_workers, timeout_s=self.timeout_s)


class RayScorer:
    """`scorer(items) -> scores` (input order) over `n` ScoringWorker actors."""

    def __init__(self, env: Environment, n: int = 2, *, max_workers: int = 8, score_timeout_s: float | None = 30.0,
                 timeout_s: float = 600.0, num_cpus_per_worker: float = 0.5) -> None:
        import ray

        if n < 1:
            raise ValueError(f"run.num_scorers must be >= 1, got {n}")
        self._ray = ray
        self.timeout_s = timeout_s
        self.restarts = 0
        remote = ray.remote(max_restarts=-1, max_task_retries=0)(ScoringWorker)
        # NOTE: actor handles are typed Any: their methods are called through `.remote`, which Ray's annotations
        # do not describe for a class wrapped at run time.
        self.actors: list[Any] = [remote.options(num_cpus=num_cpus_per_worker).remote(env, max_workers, score_timeout_s)
                       for _ in range(n)]
        try:
            self.pids = ray.get([a.pid.remote() for a in self.actors], timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"Ray scoring actors did not start within {timeout_s:.0f}s") from None

    def __call__(self, items: Sequence[ScoreItem]) -> list[Score]:
        n = len(self.actors)
        size = -(-len(items) // n) if items else 0
        chunks = [(i, list(items[i * size : (i + 1) * size])) for i in range(n)]
        chunks = [(i, c) for i, c in chunks if c]
        pending = {i: self.actors[i].score.remote(c) for i, c in chunks}
        results: dict[int, list[Score]] = {}
        deadline = time.monotonic() + self.timeout_s
        while pending:
            ready, _ = self._ray.wait(list(pending.values()), num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise RuntimeError(f"Ray scoring actors did not finish within {self.timeout_s:.0f}s")
            i = next(k for k, v in pending.items() if v == ready[0])
            try:
                results[i] = self._ray.get(ready[0])
                del pending[i]
            except self._ray.exceptions.RayActorError:
                self.restarts += 1  # re-run the chunk on the restarted actor
                time.sleep(0.2)
                pending[i] = self.actors[i].score.remote(dict(chunks)[i])
        return [s for i, _ in chunks for s in results[i]]

    def shutdown(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
