"""Held-out evaluation of a policy: accuracy sampled at the training temperature, and greedy.

Used before, during (`run.eval_every`) and after training, and by `rollwise eval`. Any engine of
`engine.protocol` works; prompts are encoded by the same `encode` the loop samples with.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

from rollwise.rewards.base import is_correct
from rollwise.rewards.concurrent import score_many
from rollwise.types import SamplingParams, Score, Task

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.control.episodes import EpisodeSource
    from rollwise.engine.protocol import Engine
    from rollwise.envs.base import Environment

ACCURACY_METHOD = (
    "accuracy = correct samples / all samples on held-out problems; 'accuracy' samples at the training "
    "temperature (4 samples per problem), 'accuracy_greedy' takes one greedy completion; a "
    "sample is correct when its reward is >= env.pass_threshold (default 1.0: a verifier's right answer); errored "
    "or timed-out scoring counts as incorrect and stays in the denominator; truncated samples are scored as they "
    "stand. reward_mean / reward_mean_greedy average the rewards of the samples that have one."
)


def per_prompt_params(sp: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt with its own seed (sp.seed * 1_000_003 + index), as the loop seeds its groups
    (`control.context.sample_params`)."""
    if sp.seed is None:
        return [sp] * n
    return [dataclasses.replace(sp, seed=sp.seed * 1_000_003 + i) for i in range(n)]


def evaluate(engine: Engine, encode: Callable[[Task], list[int]], env: Environment, tasks: Sequence[Task], *, temperature: float,
             samples: int, max_tokens: int, seed: int, score_workers: int = 8,
             scorer: Callable[[list[Any]], list[Score]] | None = None, stop_token_ids: list[int] | None = None,
             pass_threshold: float = 1.0, episodes: EpisodeSource | None = None) -> dict[str, float]:
    """Held-out accuracy (pass rate) and mean reward, sampled at `temperature` and greedy, as ACCURACY_METHOD
    describes. `episodes`: a multi-turn runner (`control.episodes.EpisodeRunner`) for multi-turn environments."""
    return evaluate_detailed(engine, encode, env, tasks, temperature=temperature, samples=samples, max_tokens=max_tokens,
                             seed=seed, score_workers=score_workers, scorer=scorer, stop_token_ids=stop_token_ids,
                             pass_threshold=pass_threshold, episodes=episodes).metrics


@dataclasses.dataclass
class EvalResult:
    """`evaluate`'s metrics, and what errored: enough for `rollwise eval` to say why, not just how many."""

    metrics: dict[str, float]
    """n, accuracy, reward_mean, errored (a count of samples), and the same with the suffix _greedy."""
    samples: dict[str, int]
    """Samples scored per mode ('' sampled, '_greedy')."""
    errors: dict[str, list[tuple[str, str]]]
    """Per mode: (task id, error) of each errored sample, in task order."""


def evaluate_detailed(engine: Engine, encode: Callable[[Task], list[int]], env: Environment, tasks: Sequence[Task], *,
                      temperature: float, samples: int, max_tokens: int, seed: int, score_workers: int = 8,
                      scorer: Callable[[list[Any]], list[Score]] | None = None,
                      stop_token_ids: list[int] | None = None, pass_threshold: float = 1.0,
                      episodes: EpisodeSource | None = None) -> EvalResult:
    """`evaluate`, also returning the errored samples' task ids and errors."""
    res: dict[str, float] = {"n": float(len(tasks))}
    counts: dict[str, int] = {}
    errors: dict[str, list[tuple[str, str]]] = {}
    modes = [("", SamplingParams(n=samples, temperature=temperature, max_tokens=max_tokens, seed=seed,
                                 stop_token_ids=stop_token_ids or None)),
             ("_greedy", SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, seed=seed,
                                        stop_token_ids=stop_token_ids or None))]
    for suffix, sp in modes:
        plist = per_prompt_params(sp, len(tasks))
        if episodes is not None:
            eps = episodes.run(engine, list(tasks), plist)
            scores = [ep.score or Score(0.0, error="episode was not scored") for ep in eps]  # as in training
            ids = [t.id for t in tasks]
        else:
            outs = engine.generate([encode(t) for t in tasks], plist)
            items = [(t, o.text, list(o.token_ids)) for t, r in zip(tasks, outs) for o in r.outputs]
            scores = scorer(items) if scorer is not None else score_many(env, items, max_workers=score_workers)
            ids = [t.id for t, _, _ in items]
        n = max(len(scores), 1)
        valued = [s.value for s in scores if s.error is None]
        res["accuracy" + suffix] = sum(is_correct(s, pass_threshold) for s in scores) / n
        res["reward_mean" + suffix] = sum(valued) / len(valued) if valued else 0.0
        res["errored" + suffix] = float(sum(s.error is not None for s in scores))
        counts[suffix] = len(scores)
        errors[suffix] = [(tid, str(s.error)) for tid, s in zip(ids, scores) if s.error is not None]
    return EvalResult(res, counts, errors)
