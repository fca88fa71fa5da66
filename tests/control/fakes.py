"""A fake step-level engine, tokenizer and environment: policies are tested on decisions, not on a model.

Each sample's outcome is a pure function of its prompt and seed: it is correct with the task's pass rate
`metadata["p"]` and has `metadata["len"]` tokens (an int, or a list to draw from by seed). The engine advances
every in-flight sample by one token per step, counts every token it produces, and supports abort and resume
(`partial=`) with a weight version per token, like `EngineCore`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rollwise.envs.base import Task
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Score


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
class _Req:
    rid: str
    task: Task
    params: SamplingParams
    target: int
    correct: bool
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str | None = None


class FakeEngine:
    def __init__(self, tasks: list[Task], max_num_seqs: int = 10_000) -> None:
        tok = FakeTokenizer()
        self.by_prompt = {tuple(tok.encode(t.prompt)): t for t in tasks}
        self.max_num_seqs = max_num_seqs
        self.weight_version = 0
        self.requests: dict[str, _Req] = {}
        self.produced = 0
        self.steps = 0

    def add_request(self, request_id, prompt_token_ids, params, partial=None) -> None:
        assert params.n == 1 and request_id not in self.requests
        t = self.by_prompt[tuple(prompt_token_ids)]
        rng = random.Random(params.seed)
        correct = rng.random() < t.metadata["p"]
        ln = t.metadata["len"]
        target = min(ln if isinstance(ln, int) else rng.choice(ln), params.max_tokens)
        r = _Req(request_id, t, params, target, correct)
        if partial is not None:
            (prev,) = partial
            r.tokens, r.logprobs, r.versions = list(prev.token_ids), list(prev.logprobs), list(prev.weight_versions)
        self.requests[request_id] = r

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        done = []
        for r in list(self.requests.values())[: self.max_num_seqs]:
            r.tokens.append(5)
            r.logprobs.append(-0.5)
            r.versions.append(self.weight_version)
            self.produced += 1
            if len(r.tokens) >= r.target:
                r.finish = "length" if r.target >= r.params.max_tokens else "stop"
                done.append(self._out(self.requests.pop(r.rid)))
        return done

    def abort(self, request_id):
        r = self.requests.pop(request_id, None)
        if r is None:
            return None
        r.finish = "abort"
        return self._out(r)

    def load_weights(self, *_a) -> None:
        self.weight_version += 1

    def _out(self, r: _Req) -> RequestOutput:
        text = ("1" if r.correct else "0") if r.finish != "abort" else ""
        o = CompletionOutput(0, list(r.tokens), list(r.logprobs), r.finish, text, list(r.versions))
        return RequestOutput(r.rid, FakeTokenizer().encode(r.task.prompt), [o])


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
