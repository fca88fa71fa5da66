"""Synthetic arithmetic: the embedded default's task, sized for a tiny character-level model.

Prompts are bare expressions ending in "=" ("23+45="), the expected completion is the integer ("68"),
then EOS. Difficulty is (digits per operand, operators, number of operands); `level=1..6` are presets.
Problems are sampled deterministically from `seed`; each problem's train/test split is fixed by hashing
its text, so the splits are disjoint whatever the seed. Scoring parses the completion's leading integer.

Deliberately left out: any natural-language wording (the tiny model's vocabulary is `charset`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rollwise.envs.base import Task, split_of
from rollwise.rewards.base import wrong
from rollwise.rewards.match import MAX_INT_DIGITS, leading_int, leading_int_text
from rollwise.types import Score

LEVELS: dict[int, tuple[int, str, int]] = {
    # level: (digits, operators, operands)
    1: (1, "+", 2),
    2: (2, "+", 2),
    3: (2, "+-", 2),
    4: (3, "+-", 2),
    5: (2, "+-*", 2),
    6: (2, "+-*", 3),
}


@dataclass
class ArithmeticEnv:
    """Integer arithmetic problems "a+b=" -> "c"; `charset` is every character prompts and answers use."""

    digits: int = 2
    ops: str = "+"
    operands: int = 2
    level: int | None = None
    """A preset from LEVELS; overrides digits/ops/operands when set."""
    test_fraction: float = 0.1
    name: str = "arithmetic"
    charset: str = field(default="0123456789+-*= \n", init=False)
    """NOTE: the char-level tokenizer of the default model is built from this; keep prompts inside it."""

    def __post_init__(self) -> None:
        if self.level is not None:
            if self.level not in LEVELS:
                raise ValueError(f"arithmetic level must be one of {sorted(LEVELS)}, got {self.level!r}")
            self.digits, self.ops, self.operands = LEVELS[self.level]
        if not 1 <= self.digits <= 9:
            raise ValueError(f"arithmetic digits must be in 1..9, got {self.digits!r}")
        if not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(f"arithmetic ops must be drawn from '+-*', got {self.ops!r}")
        if not 2 <= self.operands <= 5:
            raise ValueError(f"arithmetic operands must be in 2..5, got {self.operands!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"arithmetic test_fraction must be in (0, 1), got {self.test_fraction!r}")

    @property
    def space_size(self) -> int:
        return (10**self.digits) ** self.operands * len(self.ops) ** (self.operands - 1)

    def make_task(self, expr: str) -> Task:
        value = eval(expr, {"__builtins__": {}}, {})  # noqa: S307 - expr is built here from digits and + - *
        return Task(id=f"arithmetic/{expr}", prompt=f"{expr}=", answer=int(value), metadata={"expr": expr})

    def _sample_expr(self, rng: random.Random) -> str:
        hi = 10**self.digits - 1
        terms = [str(rng.randint(0, hi)) for _ in range(self.operands)]
        ops = [rng.choice(self.ops) for _ in range(self.operands - 1)]
        return "".join(t + o for t, o in zip(terms, ops)) + terms[-1]

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        """`n` distinct problems of `split` (default 1000, fewer only when the split has fewer)."""
        if split not in ("train", "test"):
            raise ValueError(f"arithmetic has splits 'train' and 'test', got {split!r}")
        want = 1000 if n is None else n
        rng = random.Random(f"arithmetic/{seed}/{split}")
        seen: set[str] = set()
        tasks: list[Task] = []
        attempts = 0
        max_attempts = max(50 * want, 10 * self.space_size)
        while len(tasks) < want and attempts < max_attempts and len(seen) < self.space_size:
            attempts += 1
            expr = self._sample_expr(rng)
            if expr in seen:
                continue
            seen.add(expr)
            if split_of(expr, self.test_fraction) == split:
                tasks.append(self.make_task(expr))
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        """1.0 when the completion's leading integer is the answer (trailing text is ignored)."""
        digits = leading_int_text(completion)
        if digits is not None and len(digits.lstrip("-")) > MAX_INT_DIGITS:  # int() would refuse past 4,300 digits
            n = len(digits.lstrip("-"))
            return wrong(f"answer has {n} digits (limit {MAX_INT_DIGITS})", parts={"correct": 0.0}, parsed=None)
        got = leading_int(completion)
        ok = got is not None and got == int(task.answer)
        return Score(float(ok), parts={"correct": float(ok)}, info={"parsed": got})
