"""MBPP (sanitized): write a Python function from one sentence; scored by the task's asserts in the sandbox.

The prompt is the usual MBPP wording: the sentence plus the asserts the code must pass. A completion may
wrap its code in a ```python fence; the fence is removed. The program run is the completion, the test
imports, then the asserts; the result vocabulary is HumanEval's (`passed` / `failed: ...` / `timed out`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field

from rollwise.envs.base import Task
from rollwise.envs.data import dataset_file
from rollwise.rewards.code import DEFAULT_CODE_LIMITS, run_tests
from rollwise.sandbox import SandboxLimits
from rollwise.types import Score

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def strip_fence(completion: str) -> str:
    """The code inside the first ```python fence, or the completion itself when there is none."""
    m = _FENCE.search(completion)
    return m.group(1) if m else completion


@dataclass
class MBPPEnv:
    """`path`: sanitized-mbpp.json or the data root (default: shared/data/mbpp/sanitized-mbpp.json)."""

    path: str | None = None
    limits: SandboxLimits = field(default_factory=lambda: DEFAULT_CODE_LIMITS)
    name: str = "mbpp"

    @staticmethod
    def task_from_record(rec: dict, index: int | str = 0) -> Task:
        for key in ("task_id", "prompt", "test_list"):
            if key not in rec:
                raise ValueError(f"MBPP record lacks {key!r}")
        tests = "\n".join(rec["test_list"])
        prompt = f"{rec['prompt']}\nYour code should pass these tests:\n{tests}\n"
        return Task(id=f"mbpp/{rec['task_id']}", prompt=prompt, answer=rec.get("code", ""),
                    metadata={"test_imports": list(rec.get("test_imports", [])), "test_list": list(rec["test_list"])})

    def load(self, split: str = "test", n: int | None = None, seed: int = 0) -> list[Task]:
        """The sanitized set as one 'test' split (427 problems)."""
        if split != "test":
            raise ValueError(f"mbpp (sanitized) is used as one 'test' split, got {split!r}")
        with open(dataset_file("mbpp/sanitized-mbpp.json", self.path)) as fh:
            tasks = [self.task_from_record(r) for r in json.load(fh)]
        if n is not None:
            tasks = random.Random(seed).sample(tasks, min(n, len(tasks)))
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        md = task.metadata
        program = "\n".join([strip_fence(completion), *md["test_imports"], *md["test_list"]]) + "\n"
        result = run_tests(program, limits=self.limits)
        ok = float(result == "passed")
        return Score(ok, parts={"code_tests": ok}, info={"result": result, "passed": result == "passed"})
