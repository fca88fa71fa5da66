"""Shape rewards: does the completion follow a format, and how long is it. Useful as weighted parts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rollwise.types import Score, Task


@dataclass
class RegexFormat:
    """1.0 when `pattern` matches the completion (`mode`: "search", "match" or "fullmatch"), else 0.0."""

    pattern: str
    mode: str = "search"
    flags: int = re.DOTALL
    name: str = "format"
    _rx: re.Pattern = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in ("search", "match", "fullmatch"):
            raise ValueError(f"RegexFormat.mode must be search, match or fullmatch, got {self.mode!r}")
        try:
            self._rx = re.compile(self.pattern, self.flags)
        except re.error as e:
            raise ValueError(f"RegexFormat: bad pattern {self.pattern!r}: {e}") from None

    def __call__(self, task: Task, completion: str) -> Score:
        ok = getattr(self._rx, self.mode)(completion) is not None
        return Score(float(ok), parts={self.name: float(ok)})


@dataclass(frozen=True)
class LengthPenalty:
    """0 up to `target` characters, falling linearly to -1 at `limit` and staying there.

    Characters rather than tokens because a reward function sees text; pass `length=len_in_tokens` to count
    something else.
    """

    target: int
    limit: int
    name: str = "length_penalty"

    def __post_init__(self) -> None:
        if not 0 <= self.target < self.limit:
            raise ValueError(f"LengthPenalty needs 0 <= target < limit, got target={self.target}, limit={self.limit}")

    def __call__(self, task: Task, completion: str) -> Score:
        n = len(completion)
        v = -min(1.0, max(0, n - self.target) / (self.limit - self.target))
        return Score(v, parts={self.name: v}, info={"length": n})
