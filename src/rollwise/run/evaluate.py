"""Held-out evaluation of a policy: accuracy sampled at the training temperature, and greedy.

Used before, during (`run.eval_every`) and after training, and by `rollwise eval`. Any engine of
`engine.protocol` works; prompts are encoded by the same `encode` the loop samples with.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from rollwise.rewards.concurrent import score_many
from rollwise.types import SamplingParams, Score, Task

ACCURACY_METHOD = (
    "accuracy = correct samples / all samples on held-out problems; 'accuracy' samples at the training "
    "temperature (4 samples per problem), 'accuracy_greedy' takes one greedy completion; a "
    "sample is correct when the verifier's 'correct' part (or, without one, its reward) is >= 1; errored or "
    "timed-out scoring counts as incorrect and stays in the denominator; truncated samples are scored as they stand."
)


def is_correct(score: Score) -> bool:
    if score.error is not None:
        return False
    v = score.parts.get("correct", score.value)
    return v >= 1.0 - 1e-9


def per_prompt_params(sp: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt with its own seed (sp.seed * 1_000_003 + index), as the loop seeds its groups
    (`control.base.sample_params`)."""
    if sp.seed is None:
        return [sp] * n
    return [dataclasses.replace(sp, seed=sp.seed * 1_000_003 + i) for i in range(n)]


def evaluate(engine: Any, encode: Callable[[Task], list[int]], env: Any, tasks: Sequence[Task], *, temperature: float,
             samples: int, max_tokens: int, seed: int, score_workers: int = 8,
             scorer: Callable[[list[tuple[Task, str]]], list[Score]] | None = None) -> dict[str, float]:
    """Held-out accuracy sampled at `temperature` (and greedy), as ACCURACY_METHOD describes."""
    prompts = [encode(t) for t in tasks]
    res: dict[str, float] = {"n": float(len(tasks))}
    modes = [("accuracy", SamplingParams(n=samples, temperature=temperature, max_tokens=max_tokens, seed=seed)),
             ("accuracy_greedy", SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, seed=seed))]
    for key, sp in modes:
        outs = engine.generate(prompts, per_prompt_params(sp, len(prompts)))
        items = [(t, o.text) for t, r in zip(tasks, outs) for o in r.outputs]
        scores = scorer(items) if scorer is not None else score_many(env, items, max_workers=score_workers)
        res[key] = sum(is_correct(s) for s in scores) / max(len(scores), 1)
        res[key.replace("accuracy", "errored")] = float(sum(s.error is not None for s in scores))
    return res
