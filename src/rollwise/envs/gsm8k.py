"""GSM8K: grade-school math word problems (JSONL with `question` and `answer` ending in `#### N`).

The gold answer is the number after `####`; scoring is the math verifier (`rewards.math.verify_math`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from rollwise.envs.base import Task
from rollwise.envs.data import dataset_file
from rollwise.rewards.math import gold_of, verify_math
from rollwise.types import Score

DEFAULT_TEMPLATE = "{question}\nSolve step by step, then give the final answer on its own line as '#### <number>'.\n"


@dataclass
class GSM8KEnv:
    """`path`: a GSM8K JSONL file or the data root holding gsm8k/{split}.jsonl (default: shared/data)."""

    path: str | None = None
    template: str = DEFAULT_TEMPLATE
    name: str = "gsm8k"

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
        f = dataset_file(f"gsm8k/{split}.jsonl", self.path)
        with open(f) as fh:
            tasks = [self.task_from_record(json.loads(line), f"{split}/{i}") for i, line in enumerate(fh) if line.strip()]
        if n is not None:
            rng = random.Random(seed)
            tasks = rng.sample(tasks, min(n, len(tasks)))
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        return verify_math(completion, task.answer)
