"""Countdown: reach a target from given numbers with + - * /, each number used exactly once.

Tasks are generated solvable (a random expression tree over the numbers defines the target). A completion
is verified by evaluating its equation with the safe evaluator (`envs.calc`), never `eval`: it must use
exactly the given numbers, each once, and equal the target. The equation is read from
`<answer>...</answer>` if present, else from the last line that has digits; a trailing `= target` is allowed.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from fractions import Fraction

from rollwise.envs.base import Task, split_of
from rollwise.envs.calc import CalcError, evaluate
from rollwise.rewards.text import tag_contents
from rollwise.types import Score

def extract_equation(completion: str) -> str | None:
    """The equation in the last <answer></answer>, else the last line with a digit (linear time)."""
    tags = tag_contents(completion, "<answer>", "</answer>")
    if tags:
        text = tags[-1]
    else:
        lines = [ln for ln in completion.strip().splitlines() if re.search(r"\d", ln)]
        if not lines:
            return None
        text = lines[-1]
    text = text.strip()
    if "=" in text:  # "3*4+1 = 13" -> left side; "13 = 3*4+1" -> right side
        left, right = text.split("=", 1)
        text = left if re.search(r"[-+*/]", left) else right
    return text.strip() or None


@dataclass
class CountdownEnv:
    """Countdown with `count` numbers in [1, max_number] and a positive integer target <= max_target."""

    count: int = 4
    max_number: int = 99
    max_target: int = 999
    test_fraction: float = 0.1
    name: str = "countdown"

    def __post_init__(self) -> None:
        if not 2 <= self.count <= 6:
            raise ValueError(f"countdown count must be in 2..6, got {self.count!r}")
        if self.max_number < 2 or self.max_target < 1:
            raise ValueError("countdown max_number must be >= 2 and max_target >= 1")

    def _generate(self, rng: random.Random) -> tuple[list[int], int]:
        while True:
            nums = [rng.randint(1, self.max_number) for _ in range(self.count)]
            vals: list[Fraction] = [Fraction(x) for x in nums]
            while len(vals) > 1:
                a = vals.pop(rng.randrange(len(vals)))
                b = vals.pop(rng.randrange(len(vals)))
                op = rng.choice("+-*/")
                if op == "/" and b == 0:
                    op = "+"
                vals.append({"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op])
            t = vals[0]
            if t.denominator == 1 and 1 <= t <= self.max_target:
                return nums, int(t)

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"countdown has splits 'train' and 'test', got {split!r}")
        want = 1000 if n is None else n
        rng = random.Random(f"countdown/{seed}/{split}")
        tasks: list[Task] = []
        seen: set[str] = set()
        for _ in range(100 * want + 100):
            if len(tasks) >= want:
                break
            nums, target = self._generate(rng)
            key = f"{sorted(nums)}->{target}"
            if key in seen or split_of(key, self.test_fraction) != split:
                continue
            seen.add(key)
            prompt = (f"Using the numbers {nums}, create an equation that equals {target}. Use + - * / and each "
                      f"number exactly once. Put the equation in <answer></answer>.")
            tasks.append(Task(id=f"countdown/{key}", prompt=prompt, answer=target, metadata={"numbers": nums}))
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        """1.0 for a correct equation; parts keep `format` (an equation was found and parsed)."""
        eq = extract_equation(completion)
        if eq is None:
            return Score(0.0, parts={"format": 0.0, "correct": 0.0}, info={"reason": "no equation"})
        try:
            value, used = evaluate(eq)
        except CalcError as e:
            return Score(0.0, parts={"format": 0.0, "correct": 0.0}, info={"reason": str(e), "equation": eq})
        numbers = sorted(Fraction(x) for x in task.metadata["numbers"])
        if sorted(used) != numbers:
            reason = f"uses {sorted(int(u) if u.denominator == 1 else float(u) for u in used)}, must use each of {sorted(task.metadata['numbers'])} once"
            return Score(0.0, parts={"format": 1.0, "correct": 0.0}, info={"reason": reason, "equation": eq})
        ok = value == task.answer
        return Score(float(ok), parts={"format": 1.0, "correct": float(ok)}, info={"equation": eq, "value": str(value)})
