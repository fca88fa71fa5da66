"""Partial rollouts: never wait for the long tail; carry unfinished samples into the next step.

Each step keeps ceil(batch_groups x (1 + over_provision)) groups in flight (groups carried from the last step
first, then fresh prompts), drives the engine until `batch_groups` groups have all K samples finished, then
aborts every sample still running and keeps its partial output. At the next step - after the trainer's update
reached the engine - those samples are resubmitted with `add_request(partial=...)`: their earlier tokens keep
their log-probs and weight versions, new tokens get the new version, so every token records which policy
sampled it and the loop measures staleness (trained version - sampling version) of what it trains on. The loss
corrects for it through TIS / decoupled PPO (algo.tis_cap, algo.decoupled).

NOTE: carried groups are resubmitted before fresh ones, so the engine's FIFO scheduler finishes the oldest
first and staleness stays bounded in practice; `control.staleness_max` in the metrics shows the worst case.
Carried samples live in this object; `state_dict()` / `load_state_dict()` turn them into JSON-able data and back,
so a checkpoint and each step's write-ahead log record (run/resume.py) carry them across a resume: the resumed
run continues them exactly where the interrupted one would have.

Deliberately left out: a hard staleness cap that drops old samples (prefer TIS over throwing tokens away).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollwise.control.context import PendingGroup, StepContext, build_group
from rollwise.types import CompletionOutput, RolloutGroup, Score, Task


@dataclass
class PartialRolloutPolicy:
    over_provision: float = 0.5
    """Extra groups kept in flight, as a fraction of batch_groups."""
    carry: list[PendingGroup] = field(default_factory=list)
    """Groups with unfinished samples carried into the next step (finish_reason 'abort' = resume me)."""

    def __post_init__(self) -> None:
        if self.over_provision < 0:
            raise ValueError(f"partial rollouts need over_provision >= 0, got {self.over_provision}")

    def run(self, ctx: StepContext) -> list[RolloutGroup]:
        drv = ctx.driver
        if ctx.episodes is not None:
            raise ValueError("control.policy=partial works on single-turn environments only: episodes of a multi-turn "
                             "environment are not aborted or carried mid-way")
        if not drv.stepwise:
            raise ValueError("control.policy=partial needs a step-level engine (the in-process engine or a remote server)")
        ctx.acc.carried_in_tokens = _tokens(self.carry)
        want = math.ceil(ctx.batch_groups * (1.0 + self.over_provision))
        groups = self.carry + [ctx.new_group(t, ctx.group_size) for t in ctx.take(max(0, want - len(self.carry)))]
        self.carry = []
        by_id = {g.group_id: g for g in groups}
        for g in groups:
            part = g.outputs if any(o is not None for o in g.outputs) else None  # None: fresh, samples share a prefill
            if ctx.params_fn is None:  # one request per group; finished samples are handed back by the engine
                reqs = ctx.requests(g, range(g.size), partial=part)
            else:  # one request per sample: resubmit only the unfinished ones
                reqs = ctx.requests(g, [j for j, o in enumerate(g.outputs) if not _done(o)], partial=part)
            for req in reqs:
                drv.submit(req)
        ctx.acc.rounds = 1
        complete: list[PendingGroup] = []
        # A selector that does not refill (control.refill false) may hand over fewer prompts than asked: the step
        # then waits for the same share of what is in flight, so the over-provision still cuts the tail.
        target = min(ctx.batch_groups, max(1, math.floor(len(groups) / (1.0 + self.over_provision) + 1e-9)))
        while len(complete) < target and drv.inflight:
            for req, outs in drv.step():
                g = by_id[req.group_id]
                ctx.place(g, req, outs)
                if _complete(g):
                    complete.append(g)
        for rid in list(drv.inflight):
            got = drv.abort(rid)
            if got is not None:
                ctx.place(by_id[got[0].group_id], *got)
        # NOTE: a streaming (remote) engine may finish a request between the last step and its abort; such a group
        # is complete now and is returned with this step rather than carried with nothing left to generate.
        done_ids = {g.group_id for g in complete}
        complete += [g for g in groups if g.group_id not in done_ids and _complete(g)]
        done_ids = {g.group_id for g in complete}
        self.carry = [g for g in groups if g.group_id not in done_ids]
        ctx.acc.carried_out_tokens = _tokens(self.carry)
        ctx.score([(g, j) for g in complete for j in range(g.size)])
        return [build_group(g, ctx.step, ctx.params.max_tokens) for g in complete]


    def state_dict(self) -> dict[str, Any]:
        """The carried groups as JSON-able data (tasks by id: they come back from the training set)."""
        return {"carry": [_group_state(g) for g in self.carry]}

    def load_state_dict(self, state: Mapping[str, Any], tasks: Mapping[str, Task]) -> None:
        """Carry what `state_dict` saved; `tasks`: the training tasks by id. A carried task that is not among
        them (a different data set) is a one-line ValueError."""
        carry = []
        for d in state.get("carry", []):
            task = tasks.get(d["task_id"])
            if task is None:
                raise ValueError(f"partial rollouts: a carried group's task {d['task_id']!r} is not in the training "
                                 "set of this run (was env changed?)")
            carry.append(PendingGroup(
                task, d["group_id"], list(d["prompt_token_ids"]),
                [None if o is None else CompletionOutput(o["index"], list(o["token_ids"]), list(o["logprobs"]),
                                                         o["finish_reason"], o["text"], list(o["weight_versions"]))
                 for o in d["outputs"]],
                [None if c is None else Score(c["value"], dict(c["parts"]), c["error"], dict(c["info"]))
                 for c in d["scores"]],
                d["seed"], d["index"], list(d["gen_s"]), list(d["score_s"]),
                {int(k): list(v) for k, v in d["loss_masks"].items()}))
        self.carry = carry


def _group_state(g: PendingGroup) -> dict[str, Any]:
    return {
        "task_id": g.task.id, "group_id": g.group_id, "prompt_token_ids": list(g.prompt_token_ids),
        "outputs": [None if o is None else {"index": o.index, "token_ids": list(o.token_ids),
                                            "logprobs": list(o.logprobs), "finish_reason": o.finish_reason,
                                            "text": o.text, "weight_versions": list(o.weight_versions)}
                    for o in g.outputs],
        "scores": [None if c is None else {"value": c.value, "parts": dict(c.parts), "error": c.error,
                                           "info": dict(c.info)} for c in g.scores],
        "seed": g.seed, "index": g.index, "gen_s": list(g.gen_s), "score_s": list(g.score_s),
        "loss_masks": {str(k): list(v) for k, v in g.loss_masks.items()},
    }


def _done(o: CompletionOutput | None) -> bool:
    return o is not None and o.finish_reason in ("stop", "length")


def _complete(g: PendingGroup) -> bool:
    return all(_done(o) for o in g.outputs)


def _tokens(groups: list[PendingGroup]) -> int:
    return sum(len(o.token_ids) for g in groups for o in g.outputs if o is not None)
