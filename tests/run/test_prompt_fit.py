"""A prompt the model's context cannot hold fails before the first step, naming its row."""

from __future__ import annotations

import pytest

from rollwise.run.prompt_fit import check_prompts_fit, engine_context
from rollwise.types import Task


class CountingEncoder:
    """One id per character plus two template ids; counts how many prompts it was asked to encode."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, task: Task) -> list[int]:
        self.calls += 1
        text = task.prompt if isinstance(task.prompt, str) else "".join(m["content"] for m in task.prompt)
        return [1] * (len(text) + 2)


def test_first_prompt_that_does_not_fit_is_named_with_the_count():
    tasks = [Task(f"dataset/train/d.jsonl:{i}", "x" * n, None) for i, n in enumerate([10, 200, 30, 500], 1)]
    with pytest.raises(ValueError) as e:
        check_prompts_fit(tasks, CountingEncoder(), 128)
    msg = str(e.value)
    assert msg.startswith("prompt of task dataset/train/d.jsonl:2 is 202 tokens") and "context of 128 tokens" in msg
    assert msg.endswith("; 1 more prompt does not fit either") and "\n" not in msg


def test_exactly_the_context_is_refused_one_less_fits():
    # the engine needs room for one generated token: len(prompt) >= max_model_len is refused
    enc = CountingEncoder()
    check_prompts_fit([Task("a", "x" * 97, None)], enc, 100)  # 99 tokens
    with pytest.raises(ValueError, match="is 100 tokens"):
        check_prompts_fit([Task("a", "x" * 98, None)], enc, 100)


def test_short_prompts_are_not_encoded():
    enc = CountingEncoder()
    tasks = [Task(str(i), "1+1=", None) for i in range(1000)] + [Task("chat", [{"role": "user", "content": "hi"}], None)]
    check_prompts_fit(tasks, enc, 4096)
    assert enc.calls == 1  # the template probe only: the byte bound clears every prompt


def test_unknown_context_checks_nothing():
    enc = CountingEncoder()
    check_prompts_fit([Task("a", "x" * 10_000, None)], enc, None)
    assert enc.calls == 0

    class Remote:  # says nothing about its context
        pass

    class Engine:
        max_model_len = 64

    class Wrapper:
        engine = Engine()

    assert engine_context(Remote()) is None and engine_context(Wrapper()) == 64 and engine_context(Engine()) == 64
