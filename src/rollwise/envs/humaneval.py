"""HumanEval-style code tasks: prompt (signature + docstring), entry point, tests; scored in the sandbox.

Loads HumanEval.jsonl(.gz) records (`task_id`, `prompt`, `canonical_solution`, `test`, `entry_point`);
`answer` is the canonical solution. Scoring runs the HumanEval check program (`rewards.code`), and the
Score's info carries `result` exactly as HumanEval's evaluator writes it.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field

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
    tests: CodeTests = field(default_factory=CodeTests)
    name: str = "humaneval"

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
        return self.tests(task, completion)
