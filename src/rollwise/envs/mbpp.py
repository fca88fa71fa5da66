"""MBPP (sanitized): write a Python function from one sentence; scored by the task's asserts in the sandbox.

The prompt is the usual MBPP wording: the sentence plus the asserts the code must pass. A completion may
wrap its code in a ```python fence; the fence is removed. The completion (followed by the test imports,
which MBPP's harness makes visible to it) is loaded alone in the sandbox; the asserts run in a separate
trusted process and call its functions through proxies (`rewards.code`). The result vocabulary is
HumanEval's (`passed` / `failed: ...` / `timed out`). `isolation` as for HumanEval (default 'required').
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from rollwise.envs.base import Task
from rollwise.envs.data import dataset_file
from rollwise.rewards.code import DEFAULT_CALL_TIMEOUT_S, DEFAULT_CODE_LIMITS, code_sandbox, code_score, mbpp_test, run_tests
from rollwise.rewards.text import fenced_code
from rollwise.sandbox import Sandbox, SandboxLimits
from rollwise.types import Score

def strip_fence(completion: str) -> str:
    """The code inside the first ```python fence, or the completion itself when there is none (linear time:
    the regex this replaces, ```(?:python|py)?\\s*\\n(.*?)```, was quadratic on a fence followed by newlines)."""
    code = fenced_code(completion)
    return code if code is not None else completion


@dataclass
class MBPPEnv:
    """`path`: sanitized-mbpp.json or the data root (default: shared/data/mbpp/sanitized-mbpp.json)."""

    path: str | None = None
    limits: SandboxLimits = field(default_factory=lambda: DEFAULT_CODE_LIMITS)
    name: str = "mbpp"
    isolation: str | None = None
    sandbox: Sandbox | None = None

    def __post_init__(self) -> None:
        if self.sandbox is None:  # checked now: a machine without the jail is reported at start-up
            self.sandbox = code_sandbox(self.isolation)

    def isolation_info(self) -> dict:
        """The sandbox isolation used for scoring (mode, isolated, seccomp, how, warning)."""
        assert self.sandbox is not None
        return self.sandbox.describe()

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
        candidate = "\n".join([strip_fence(completion), *md["test_imports"]]) + "\n"
        result = run_tests(candidate, mbpp_test(md["test_imports"], md["test_list"], str(task.answer or "")), self.sandbox, self.limits,
                           DEFAULT_CALL_TIMEOUT_S)
        return code_score(result)
