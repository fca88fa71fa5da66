"""GSM8K: grade-school math word problems (JSONL with `question` and `answer` ending in `#### N`).

The gold answer is the number after `####`; scoring is the math verifier (`rewards.math.verify_math`).
Splits never share a problem: a data root gives GSM8K's own train.jsonl / test.jsonl; a single file is split
by hashing each question (`test_fraction` held out), unless `test_path` names the held-out file.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rollwise.envs.base import Task, split_of
from rollwise.envs.data import dataset_file
from rollwise.rewards.math import gold_of, verify_math
from rollwise.types import Score

DEFAULT_TEMPLATE = "{question}\nSolve step by step, then give the final answer on its own line as '#### <number>'.\n"


@dataclass
class GSM8KEnv:
    """`path`: a GSM8K JSONL file or the data root holding gsm8k/{split}.jsonl (default: shared/data)."""

    path: str | None = None
    test_path: str | None = None
    """A held-out JSONL file for the 'test' split (instead of gsm8k/test.jsonl, or of a hashed part of `path`)."""
    test_fraction: float = 0.1
    """When `path` is a single file and there is no `test_path`: the share of its questions held out as 'test'."""
    template: str = DEFAULT_TEMPLATE
    name: str = "gsm8k"

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"gsm8k test_fraction must be in (0, 1), got {self.test_fraction!r}")

    def task_from_record(self, record: dict, index: int | str) -> Task:
        for key in ("question", "answer"):
            if key not in record:
                raise ValueError(f"GSM8K record lacks {key!r}")
            if not isinstance(record[key], str):
                raise ValueError(f"GSM8K record field {key!r} must be a string, got {type(record[key]).__name__}")
        if "####" not in record["answer"]:
            raise ValueError("GSM8K record 'answer' has no '#### N' final answer")
        return Task(
            id=f"gsm8k/{index}",
            prompt=self.template.format(question=record["question"]),
            answer=gold_of(record["answer"]),
            metadata={"question": record["question"], "solution": record["answer"]},
        )

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        """All of `split`, or `n` of them in a seed-determined order."""
        if split not in ("train", "test"):
            raise ValueError(f"gsm8k has splits 'train' and 'test', got {split!r}")
        single = self.path is not None and Path(self.path).is_file()
        hashed = single and self.test_path is None
        if split == "test" and self.test_path is not None:
            f = Path(self.test_path)
            if not f.is_file():
                raise FileNotFoundError(f"gsm8k test_path {self.test_path!r} is not a file")
        elif single:
            f = Path(self.path)  # type: ignore[arg-type]
        else:
            f = dataset_file(f"gsm8k/{split}.jsonl", self.path)
        with open(f) as fh:
            tasks = []
            for i, line in enumerate(fh):
                if not line.strip():
                    continue
                task = self.task_from_record(json.loads(line), f"{split}/{i}")
                # NOTE: one file serves both splits only through this hash, so no row is trained and evaluated on.
                if hashed and split_of(task.metadata["question"], self.test_fraction) != split:
                    continue
                tasks.append(task)
        if n is not None:
            rng = random.Random(seed)
            tasks = rng.sample(tasks, min(n, len(tasks)))
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        return verify_math(completion, task.answer)
