"""Where a step's generation time went: the tail, and the useful / filtered / tail split of the generate phase.

NOTE on the definitions (docs/outputs.md states them for users; everything here is pure, tested on hand-made
inputs):
- The clock is the generate phase's: the engine seconds a step spent generating (`time_generate_s`, the driver's
  `gen_s`), so scoring between engine steps (early_stop) is not counted as waiting.
- A *wave* is a stretch of generation from the moment the engine gets requests with nothing in flight to the moment
  it has none left (a plain step is one wave; adaptive's pilot and its extension are two). A sample *ends* when it
  leaves the engine in that wave: finished, aborted by the controller, or stopped to be carried to the next step.
- The *tail* of a wave is its time after `TAIL_QUANTILE` (90%) of its samples had ended: the engine then works for
  the last 10%. A step's `tail_s` sums its waves' tails; `tail_frac` = tail_s / gen_s.
- The rest of the generate phase (gen_s - tail_s) is split by token shares: `useful_s` = rest x useful tokens /
  generated tokens (capped at 1: carried-in tokens can make the ratio exceed it), `filtered_s` = rest - useful_s.
  Useful tokens are trained tokens with a non-zero advantage (`Accounting.useful_tokens`); the others are those of
  zero-variance groups, errored, aborted, filtered-as-overlong and carried-out samples.

Deliberately left out: splitting the tail itself by token shares (it is waiting, whatever it produces), and any
estimate on batch engines, where the time a sample ends is not observed (`tail_s` is then None, and the split is
not logged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TAIL_QUANTILE = 0.9
"""The tail starts when this share of a wave's samples has ended."""


def tail_time(ends: Sequence[float], end: float, quantile: float = TAIL_QUANTILE) -> float:
    """Seconds from the moment `quantile` of the samples had ended to `end` (the wave's end), on one clock.

    ends: when each sample ended. The moment is the ceil(quantile x n)-th earliest end (nearest rank), so with 10
    samples at 0.9 it is the 9th end; 0.0 without samples, never negative."""
    if not 0 < quantile <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {quantile}")
    if not ends:
        return 0.0
    k = max(1, math.ceil(quantile * len(ends) - 1e-9))
    return max(0.0, end - sorted(ends)[k - 1])


@dataclass(frozen=True)
class GenerateSplit:
    """A step's generate phase in three parts that add up to it (seconds)."""

    useful_s: float
    """Generating tokens that trained with a non-zero advantage."""
    filtered_s: float
    """Generating tokens that did not: zero-variance groups, errored, aborted, overlong-filtered, carried out."""
    tail_s: float
    """Waiting on the last 10% of the samples (`tail_time`)."""

    @property
    def total_s(self) -> float:
        return self.useful_s + self.filtered_s + self.tail_s


def split_generate(gen_s: float, tail_s: float, generated_tokens: int, useful_tokens: int) -> GenerateSplit:
    """The generate phase split into useful, filtered and tail seconds (module NOTE); the parts add up to gen_s."""
    tail = min(max(tail_s, 0.0), max(gen_s, 0.0))
    rest = max(gen_s, 0.0) - tail
    share = min(1.0, useful_tokens / generated_tokens) if generated_tokens > 0 else 0.0
    useful = rest * share
    return GenerateSplit(useful, rest - useful, tail)


class WaveClock:
    """Sample ends per wave on the generate clock, and the tails of the waves closed so far (the driver feeds it)."""

    def __init__(self, quantile: float = TAIL_QUANTILE) -> None:
        self.quantile = quantile
        self.tail_s = 0.0
        self.observed = False
        """Some sample's end was seen (False on a batch engine: no tail to report)."""
        self._ends: list[float] = []

    def ended(self, count: int, at: float) -> None:
        """`count` samples left the engine at `at`."""
        if count > 0:
            self._ends.extend([at] * count)
            self.observed = True

    def close_wave(self, at: float) -> None:
        """The engine has nothing in flight at `at`: the wave's tail is booked."""
        if self._ends:
            self.tail_s += tail_time(self._ends, at, self.quantile)
            self._ends = []

    def total(self, at: float) -> float | None:
        """Tail seconds of the step so far (an open wave counted up to `at`); None when no end was observed."""
        if not self.observed:
            return None
        return self.tail_s + (tail_time(self._ends, at, self.quantile) if self._ends else 0.0)
