"""Generate and score one step's groups; evaluate a policy on held-out tasks.

Shared by the synchronous loop, `rollwise eval` and `rollwise generate`. Every sample becomes a `Rollout`
with a status (kept / filtered / errored / truncated / aborted) and a reason, so nothing is silently
dropped: the counts of a step always add up to prompts x samples.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from rollwise.envs.base import Task
from rollwise.rewards.concurrent import score_many
from rollwise.types import RequestOutput, Rollout, RolloutGroup, SamplingParams, Score

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


@dataclass
class StepRollouts:
    groups: list[RolloutGroup]
    outputs: list[RequestOutput]
    scores: list[list[Score]]
    gen_s: float
    score_s: float
    gen_tokens: int
    extra: dict[str, float] = field(default_factory=dict)


def per_prompt_params(sp: SamplingParams, n: int) -> list[SamplingParams]:
    """One SamplingParams per prompt with its own seed (sp.seed + index).

    NOTE: a single seed shared by every prompt of a call (vLLM's semantics too) makes sample j of every prompt
    draw the same uniform numbers; fine for one request, a needless correlation across the groups of an RL batch.
    """
    if sp.seed is None:
        return [sp] * n
    return [dataclasses.replace(sp, seed=sp.seed * 1_000_003 + i) for i in range(n)]


def encode_prompts(tokenizer: Any, tasks: Sequence[Task]) -> list[list[int]]:
    if tokenizer is None:
        raise ValueError("the model has no tokenizer: text tasks need one next to the weights (model.tokenizer)")
    out = []
    for t in tasks:
        ids = tokenizer.encode(t.prompt, add_special_tokens=False)
        if not ids:
            raise ValueError(f"task {t.id!r} has an empty prompt after tokenization")
        out.append(list(ids))
    return out


def generate_and_score(engine: Any, tokenizer: Any, env: Any, tasks: Sequence[Task], sp: SamplingParams, *,
                       step: int, score_workers: int = 8, score_timeout_s: float | None = 30.0,
                       scorer: Any = None) -> StepRollouts:
    """Sample `sp.n` completions per task, score them all concurrently, and lay them out as groups.

    scorer: `scorer(items) -> scores` in input order (e.g. `run.ray_scoring.RayScorer`); default: `score_many`
    in this process."""
    prompts = encode_prompts(tokenizer, tasks)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, per_prompt_params(sp, len(prompts)))
    gen_s = time.perf_counter() - t0
    items = [(task, o.text) for task, r in zip(tasks, outs) for o in r.outputs]
    t1 = time.perf_counter()
    if scorer is not None:
        flat = scorer(items)
    else:
        flat = score_many(env, items, max_workers=score_workers, timeout_s=score_timeout_s)
    score_s = time.perf_counter() - t1
    scores: list[list[Score]] = []
    groups: list[RolloutGroup] = []
    k = 0
    gen_tokens = 0
    for gi, (task, r, prompt) in enumerate(zip(tasks, outs, prompts)):
        group_scores = flat[k : k + len(r.outputs)]
        k += len(r.outputs)
        scores.append(group_scores)
        gid = f"s{step}-g{gi}"
        rollouts = []
        for o, sc in zip(r.outputs, group_scores):
            gen_tokens += len(o.token_ids)
            status, reason = "kept", ""
            if sc.error is not None:
                status, reason = "errored", sc.error
            elif o.finish_reason == "abort":
                status, reason = "aborted", "generation aborted"
            elif o.finish_reason == "length":
                status, reason = "truncated", f"hit max_tokens={sp.max_tokens}"
            rollouts.append(Rollout(
                prompt_id=task.id, group_id=gid, sample_index=o.index, prompt_token_ids=list(prompt),
                completion_token_ids=list(o.token_ids), logprobs=list(o.logprobs),
                weight_versions=list(o.weight_versions) or [0] * len(o.token_ids),
                loss_mask=[1] * len(o.token_ids), text=o.text, finish_reason=o.finish_reason,
                reward=None if sc.error is not None else float(sc.value), reward_parts=dict(sc.parts),
                status=status, status_reason=reason, seed=sp.seed, step=step,
                env_info={k2: v for k2, v in sc.info.items() if isinstance(v, (int, float, str, bool))},
            ))
        groups.append(RolloutGroup(task.id, gid, rollouts))
    return StepRollouts(groups, outs, scores, gen_s, score_s, gen_tokens)


def evaluate(engine: Any, tokenizer: Any, env: Any, tasks: Sequence[Task], *, temperature: float, samples: int,
             max_tokens: int, seed: int, score_workers: int = 8) -> dict[str, float]:
    """Held-out accuracy sampled at `temperature` (and greedy), as ACCURACY_METHOD describes."""
    prompts = encode_prompts(tokenizer, tasks)
    res: dict[str, float] = {"n": float(len(tasks))}
    modes = [("accuracy", SamplingParams(n=samples, temperature=temperature, max_tokens=max_tokens, seed=seed))]
    modes.append(("accuracy_greedy", SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens, seed=seed)))
    for key, sp in modes:
        outs = engine.generate(prompts, per_prompt_params(sp, len(prompts)))
        items = [(t, o.text) for t, r in zip(tasks, outs) for o in r.outputs]
        scores = score_many(env, items, max_workers=score_workers)
        res[key] = sum(is_correct(s) for s in scores) / max(len(scores), 1)
        res[key.replace("accuracy", "errored")] = float(sum(s.error is not None for s in scores))
    return res
