"""HumanEval-style code tasks: prompt (signature + docstring), entry point, tests; scored in the sandbox.

Loads HumanEval.jsonl(.gz) records (`task_id`, `prompt`, `canonical_solution`, `test`, `entry_point`);
`answer` is the canonical solution. Scoring (`rewards.code`) loads `prompt + completion` alone in the
sandbox and runs the task's `check(candidate)` in a separate trusted process against a proxy of it; the
Score's info carries `result` in HumanEval's evaluator's words. `isolation` (None: $ROLLWISE_SANDBOX, else
'required') is the explicit switch to run without the full jail ('auto' / 'off', with a loud warning).
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass

from rollwise.envs.base import Task
from rollwise.envs.data import dataset_file
from rollwise.rewards.code import CodeTests
from rollwise.types import Score

_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def read_problems(path: str | None = None) -> dict[str, dict]:
    """task_id -> problem record, from a .jsonl or .jsonl.gz file (or the data root)."""
    f = dataset_file("humaneval/HumanEval.jsonl.gz", path)
    opener = gzip.open if str(f).endswith(".gz") else open
    problems = {}
    with opener(f, "rt") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            missing = [k for k in _FIELDS if k not in rec]
            if missing:
                raise ValueError(f"{f}:{i}: problem lacks {', '.join(missing)}")
            problems[rec["task_id"]] = rec
    return problems


@dataclass
class HumanEvalEnv:
    """`path`: the problems file or the data root (default: shared/data/humaneval/HumanEval.jsonl.gz)."""

    path: str | None = None
    tests: CodeTests | None = None
    name: str = "humaneval"
    isolation: str | None = None

    def __post_init__(self) -> None:
        if self.tests is None:
            self.tests = CodeTests(isolation=self.isolation)

    @staticmethod
    def task_from_problem(p: dict) -> Task:
        return Task(
            id=p["task_id"], prompt=p["prompt"], answer=p["canonical_solution"],
            metadata={"prompt": p["prompt"], "test": p["test"], "entry_point": p["entry_point"]},
        )

    def load(self, split: str = "test", n: int | None = None, seed: int = 0) -> list[Task]:
        """HumanEval has one split, 'test' (the 164 problems)."""
        if split != "test":
            raise ValueError(f"humaneval has only a 'test' split, got {split!r}")
        tasks = [self.task_from_problem(p) for p in read_problems(self.path).values()]
        if n is not None:
            tasks = random.Random(seed).sample(tasks, min(n, len(tasks)))
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        assert self.tests is not None
        return self.tests(task, completion)

    def isolation_info(self) -> dict:
        """The sandbox isolation used for scoring (mode, isolated, seccomp, how, warning)."""
        assert self.tests is not None
        return self.tests.isolation_info()
