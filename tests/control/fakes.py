"""A fake step-level engine, tokenizer and environment: policies are tested on decisions, not on a model.

Each sample's outcome is a pure function of its prompt and seed: it is correct with the task's pass rate
`metadata["p"]` and has `metadata["len"]` tokens (an int, or a list to draw from by seed). The engine advances
every in-flight sample by one token per step, returns a request once all its n samples are done, counts every
token it produces, and supports abort and resume (`partial=`) with a weight version per token, like `EngineCore`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rollwise.engine.core import sample_seed
from rollwise.envs.base import Task
from rollwise.types import ROLLOUT_STATUSES, CompletionOutput, RequestOutput, Score


class FakeTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [3 + (ord(c) % 90) for c in text]


@dataclass
class FakeEnv:
    name: str = "fake"

    def score(self, task: Task, completion: str) -> Score:
        if task.metadata.get("broken"):
            raise RuntimeError("verifier crashed")
        ok = completion.startswith("1")
        return Score(float(ok), parts={"correct": float(ok)})


def task(i: int, p: float, length=3, **meta) -> Task:
    return Task(id=f"t{i}", prompt=f"q{i}=", answer=None, metadata={"p": p, "len": length, **meta})


class TaskStream:
    """The loop's data order in miniature: cycles through the tasks, counts what was taken."""

    def __init__(self, tasks: list[Task]) -> None:
        self.tasks, self.pos = tasks, 0

    def __call__(self, k: int) -> list[Task]:
        out = [self.tasks[(self.pos + i) % len(self.tasks)] for i in range(k)]
        self.pos += k
        return out


@dataclass
class _Seq:
    target: int
    correct: bool
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None


@dataclass
class _Req:
    rid: str
    task: Task
    seqs: list[_Seq]


class FakeEngine:
    def __init__(self, tasks: list[Task], max_num_seqs: int = 10_000) -> None:
        tok = FakeTokenizer()
        self.by_prompt = {tuple(tok.encode(t.prompt)): t for t in tasks}
        self.max_num_seqs = max_num_seqs
        self.weight_version = 0
        self.requests: dict[str, _Req] = {}
        self.produced = 0
        self.steps = 0
        self.added = 0

    def add_request(self, request_id, prompt_token_ids, params, partial=None) -> None:
        assert request_id not in self.requests and (partial is None or len(partial) == params.n)
        self.added += 1
        t = self.by_prompt[tuple(prompt_token_ids)]
        seqs = []
        for j in range(params.n):
            rng = random.Random(sample_seed(params.seed, j))
            correct = rng.random() < t.metadata["p"]
            ln = t.metadata["len"]
            s = _Seq(min(ln if isinstance(ln, int) else rng.choice(ln), params.max_tokens), correct, params.max_tokens)
            prev = partial[j] if partial is not None else None
            if prev is not None:
                s.tokens, s.logprobs, s.versions = list(prev.token_ids), list(prev.logprobs), list(prev.weight_versions)
                if prev.finish_reason in ("stop", "length"):
                    s.finish = prev.finish_reason
            seqs.append(s)
        self.requests[request_id] = _Req(request_id, t, seqs)

    @property
    def num_unfinished_seqs(self) -> int:
        return sum(s.finish is None for r in self.requests.values() for s in r.seqs)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        budget = self.max_num_seqs
        for r in self.requests.values():
            for s in r.seqs:
                if s.finish is None and budget > 0:
                    budget -= 1
                    s.tokens.append(5)
                    s.logprobs.append(-0.5)
                    s.versions.append(self.weight_version)
                    self.produced += 1
                    if len(s.tokens) >= s.target:
                        s.finish = "length" if s.target >= s.max_tokens else "stop"
        done = [rid for rid, r in self.requests.items() if all(s.finish for s in r.seqs)]
        return [self._out(self.requests.pop(rid)) for rid in done]

    def abort(self, request_id):
        r = self.requests.pop(request_id, None)
        if r is None:
            return None
        for s in r.seqs:
            s.finish = s.finish or "abort"
        return self._out(r)

    def load_weights(self, *_a) -> None:
        self.weight_version += 1

    def _out(self, r: _Req) -> RequestOutput:
        outs = [CompletionOutput(j, list(s.tokens), list(s.logprobs), s.finish,
                                 ("1" if s.correct else "0") if s.finish != "abort" else "", list(s.versions))
                for j, s in enumerate(r.seqs)]
        return RequestOutput(r.rid, FakeTokenizer().encode(r.task.prompt), outs)


class BatchOnlyEngine:
    """An engine with `generate` only (like a remote server): no per-sample control."""

    def __init__(self, tasks: list[Task]) -> None:
        self.inner = FakeEngine(tasks)

    def generate(self, prompts, params):
        for i, (p, sp) in enumerate(zip(prompts, params)):
            self.inner.add_request(f"b{i}", p, sp)
        got = {}
        while self.inner.requests:
            got.update((o.request_id, o) for o in self.inner.step())
        return [got[f"b{i}"] for i in range(len(prompts))]


def check_books(res, engine=None, statuses=None):
    """Every rollout has one known status, the counts add up, and the token ledger balances."""
    acc = res.accounting
    rolls = [r for g in res.groups for r in g.rollouts]
    assert acc.total_rollouts == len(rolls)
    assert acc.rollouts == {s: sum(r.status == s for r in rolls) for s in ROLLOUT_STATUSES}
    assert all(r.status_reason for r in rolls if r.status != "kept")
    assert acc.rollout_tokens == sum(len(r.completion_token_ids) for r in rolls)
    assert acc.aborted_tokens == sum(len(r.completion_token_ids) for r in rolls if r.status == "aborted")
    assert acc.generated_tokens == acc.rollout_tokens + acc.carried_out_tokens - acc.carried_in_tokens
    assert acc.zero_variance_groups == sum(len({r.reward for r in g.rollouts if r.reward is not None}) <= 1
                                           for g in res.groups)
    if statuses is not None:
        assert {r.status for r in rolls} <= set(statuses)
