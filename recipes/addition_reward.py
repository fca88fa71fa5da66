"""Reward of the SmolLM2 addition recipe, in TRL's reward-function convention (it runs unchanged under TRL).

1.0 when the last integer in the completion equals the sum, else 0.0. `answer` is the dataset's column of that
name; TRL and rollwise pass every dataset column to the reward by name.
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?\d[\d,]*")


def _text(completion) -> str:
    # TRL hands conversational completions as [{"role": "assistant", "content": ...}]
    if isinstance(completion, list):
        return " ".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return completion


def sum_correct(completions, answer, **kwargs) -> list[float]:
    out = []
    for c, a in zip(completions, answer):
        nums = _INT.findall(_text(c))
        out.append(1.0 if nums and int(nums[-1].replace(",", "")) == int(a) else 0.0)
    return out
