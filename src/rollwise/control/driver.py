"""The `Driver`: runs a step's requests on an engine and keeps the books (engine time, generated tokens, idle
batch capacity, and the tail: when each sample left the engine, `control/tail.py`).

Two engine shapes are supported:
- step-level (`add_request` / `step` / `abort`, i.e. `EngineCore` or `llm.engine`): the samples of a group go
  in one request (n = K, one prefill of the prompt, a seed derived from the step, the group and the first
  sample's index), or one request per sample where a policy must see, score or abort each on its own
  (early_stop) or where per-sample params are set; the driver measures how much of the engine's batch sits
  empty while the long tail finishes;
- batch (`generate`: `RemoteEngine`, `MultiEngine`, `RayEngines`): whole batches. Remote engines also offer the
  step-level interface over streaming requests (`stepwise()`), opened only when a policy submits (early_stop,
  partial); Ray engine actors do not, and the config refuses those two policies there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

from rollwise.control.ledger import own_tokens
from rollwise.control.tail import WaveClock
from rollwise.engine.protocol import Engine, StepEngine, step_engine
from rollwise.engine.speculative import DraftSpec
from rollwise.envs.multiturn import BatchGenerator
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams, Tokenizer


@runtime_checkable
class _Batch(BatchGenerator, Protocol):
    """A batch engine's `generate` (what `run` and multi-turn episodes call when there is no step-level core)."""


class _Submits(Protocol):
    """`add_request` as the in-process `EngineCore` takes it, and as the driver calls it: a resumed request's
    `partial` may hold None for a sample that starts fresh, and `drafts` is a `DraftSpec`.
    NOTE: `engine.protocol.StepEngine.add_request` types both narrower (`list[CompletionOutput]`, past
    continuations as `list[list[int]]`) than the engines that take them; `Driver.submit` reads the step engine
    through this protocol until that one says the same."""

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    partial: list[CompletionOutput | None] | None = None, drafts: DraftSpec | None = None) -> None: ...


@runtime_checkable
class _LeafReports(Protocol):
    """What a tree engine offers beyond `StepEngine`: which samples of a request have ended, and their outputs."""

    def finished_slots(self, request_id: str) -> list[int]: ...

    def snapshot(self, request_id: str, slots: list[int]) -> RequestOutput | None: ...


@dataclass
class SampleRequest:
    """Samples start .. start+count-1 of one group as one engine request (they share the prompt's prefill)."""

    group_id: str
    start: int
    count: int
    prompt_token_ids: list[int]
    params: SamplingParams
    """n == count; a seed of its own (see `sample_params`)."""
    partial: list[CompletionOutput | None] | None = None
    """Resume these aborted samples instead of starting fresh (partial rollouts); None: that sample starts fresh."""
    submitted_at: float = 0.0
    """perf_counter() when the request went to the engine (for the rollouts' `timings`)."""
    drafts: DraftSpec | None = None
    """Speculative rollouts: the drafts for the engine to verify (step-level engines only)."""

    @property
    def request_id(self) -> str:
        return f"{self.group_id}/{self.start}"


class Driver:
    """Runs requests on an engine and keeps the books: engine time, generated tokens, idle batch capacity, tail.

    NOTE on the tail: a sample's end is seen as a drop in the engine's count of unfinished samples across an engine
    step or an abort, booked at the generate clock (`gen_s`) then; a wave closes when nothing is in flight. With tree
    rollouts a child born in the step where another sample ends hides that end (the count does not see unborn
    children), so a tree step's tail is an estimate. Batch engines report no ends: `tail_s` is None there."""

    def __init__(self, engine: Engine | StepEngine) -> None:
        self.engine = engine
        self.core = step_engine(engine)
        # A batch engine that can also stream (RemoteEngine, MultiEngine of them) offers its step-level interface
        # through `stepwise()`; it is opened only when a policy submits (batch policies keep batched generate).
        self._stepwise_factory: Callable[[], StepEngine] | None = (getattr(engine, "stepwise", None)
                                                                   if self.core is None else None)
        if self.core is None and not callable(getattr(engine, "generate", None)):
            raise ValueError(f"{type(engine).__name__} is not an engine: it has neither add_request/step/abort nor generate")
        self.inflight: dict[str, tuple[SampleRequest, int]] = {}  # request id -> (request, tokens at submit)
        self.reset()

    def reset(self) -> None:
        self.gen_s = 0.0
        self.idle_s = 0.0
        self.generated_tokens = 0
        self._peak = 0
        self._waves = WaveClock()
        self._spec0 = self._spec_counts()

    def _spec_counts(self) -> tuple[float, ...] | None:
        sp = getattr(getattr(self.core, "stats", None), "spec", None)
        if sp is None:
            return None
        return (sp.accepted_tokens, sp.tested_tokens, sp.decode_emitted, sp.decode_seq_steps, sp.saved_s_est)

    def spec_books(self) -> tuple[float, float, float, float] | None:
        """(acceptance, tokens per forward, seconds saved, draft tokens tested) of the drafts verified since `reset`;
        None if none were."""
        now, before = self._spec_counts(), self._spec0
        if now is None or before is None:
            return None
        acc, tested, emitted, seq_steps, saved = (a - b for a, b in zip(now, before))
        if not tested:
            return None
        return acc / tested, emitted / max(seq_steps, 1), saved, tested

    @property
    def stepwise(self) -> bool:
        return self.core is not None or callable(self._stepwise_factory)

    @property
    def speculative(self) -> bool:
        """Drafts can be verified: the in-process step engine only."""
        return self.core is not None and self._stepwise_factory is None

    @property
    def weight_version(self) -> int:
        src = self.core if self.core is not None else self.engine
        return int(getattr(src, "weight_version", 0))

    @property
    def tail_s(self) -> float | None:
        """Generate seconds spent after 90% of each wave's samples had ended (`control/tail.py`); None when no sample's
        end was observed (batch engines)."""
        return self._waves.total(self.gen_s)

    def _ended(self, live_before: int) -> None:
        """Book the samples that left the engine since `live_before` was counted; close the wave when none is left."""
        self._waves.ended(live_before - self._live_samples(), self.gen_s)
        if not self.inflight:
            self._waves.close_wave(self.gen_s)

    def _live_samples(self) -> int:
        """Samples still generating: the engine's own count when it has one, else the in-flight requests' sizes."""
        for src in (getattr(self.core, "scheduler", None), self.core):
            n = getattr(src, "num_unfinished_seqs", None)
            if isinstance(n, int):
                return n
        return sum(r.count for r, _ in self.inflight.values())

    def _stepper(self) -> StepEngine:
        """The step-level engine requests are in flight on (`submit` opened it)."""
        if self.core is None:
            raise RuntimeError("submit needs a step-level engine (add_request/step/abort)")
        return self.core

    def _batch(self) -> BatchGenerator:
        """The engine's batch `generate`: `__init__` refused an engine with neither interface, so an engine without
        a step-level core of its own has one."""
        if not isinstance(self.engine, _Batch):
            raise RuntimeError(f"{type(self.engine).__name__} has no batch generate")
        return self.engine

    def submit(self, req: SampleRequest) -> None:
        if self.core is None and callable(self._stepwise_factory):
            self.core = self._stepwise_factory()
        core = cast(_Submits, self._stepper())  # see `_Submits`
        req.submitted_at = time.perf_counter()
        if req.drafts is not None:
            core.add_request(req.request_id, req.prompt_token_ids, req.params, partial=req.partial,
                             drafts=req.drafts)
        else:
            core.add_request(req.request_id, req.prompt_token_ids, req.params, partial=req.partial)
        self.inflight[req.request_id] = (req, sum(len(o.token_ids) for o in req.partial or [] if o is not None))
        self._peak = max(self._peak, self._live_samples())

    def step(self) -> list[tuple[SampleRequest, list[CompletionOutput]]]:
        """One engine step; the requests that finished in it (all their samples)."""
        n_before = len(self.inflight)
        live = self._live_samples()
        core = self._stepper()
        t0 = time.perf_counter()
        outs = core.step()
        dt = time.perf_counter() - t0
        self.gen_s += dt
        if self._peak:
            self.idle_s += dt * (1.0 - min(live, self._peak) / self._peak)
        done = [self._close(o) for o in outs]
        self._ended(live)
        if not outs and n_before and not core.has_unfinished():
            raise RuntimeError(f"engine went idle with {n_before} requests in flight")
        return done

    def abort(self, request_id: str) -> tuple[SampleRequest, list[CompletionOutput]] | None:
        """Stop a request now; its partial outputs (unfinished samples: finish_reason 'abort'), or None when it
        was not in flight."""
        if request_id not in self.inflight:
            return None
        live = self._live_samples()
        out = self._stepper().abort(request_id)
        if out is None:
            raise RuntimeError(f"engine lost request {request_id!r}")
        closed = self._close(out)
        self._ended(live)
        return closed

    def ended_early(self, request_id: str, pending: set[int]) -> tuple[list[int], list[CompletionOutput]]:
        """Samples at positions `pending` of an in-flight request that have ended (a tree's leaves end one by one):
        their positions in the request and their outputs. Nothing on an engine that reports samples only with their
        whole request."""
        finished = getattr(self.core, "finished_slots", None)
        if request_id not in self.inflight or not callable(finished):
            return [], []
        new = [j for j in finished(request_id) if j in pending]
        if not new:
            return [], []
        core = self.core
        snap = core.snapshot(request_id, new) if isinstance(core, _LeafReports) else None
        if snap is None:
            raise RuntimeError(f"engine reports ended samples of {request_id!r} but no snapshot of them")
        return new, list(snap.outputs)

    def _close(self, out: RequestOutput) -> tuple[SampleRequest, list[CompletionOutput]]:
        req, before = self.inflight.pop(out.request_id)
        self.generated_tokens += own_tokens(out.outputs) - before
        if not self.inflight:
            self._peak = 0  # the next wave of submissions sets its own capacity
        return req, list(out.outputs)

    def counting_engine(self) -> _Counting:
        """The engine's batch `generate`, with the time and tokens booked here (multi-turn episodes call it)."""
        return _Counting(self)

    def run(self, reqs: Sequence[SampleRequest]) -> list[list[CompletionOutput]]:
        """Generate every request to completion; outputs in the order of `reqs`."""
        if not reqs:
            return []
        if self.core is None or self._stepwise_factory is not None:  # batch engines: one batched call
            t0 = time.perf_counter()
            for r in reqs:
                r.submitted_at = t0
            outs = self._batch().generate([r.prompt_token_ids for r in reqs], [r.params for r in reqs])
            self.gen_s += time.perf_counter() - t0
            got = [list(o.outputs) for o in outs]
            self.generated_tokens += sum(own_tokens(os_) for os_ in got)
            return got
        for r in reqs:
            self.submit(r)
        done: dict[str, list[CompletionOutput]] = {}
        while len(done) < len(reqs):
            for req, samples in self.step():
                done[req.request_id] = samples
        return [done[r.request_id] for r in reqs]


class _Counting:
    """A driver's engine as multi-turn episodes see it: its batch `generate`, booked on the driver."""

    def __init__(self, drv: Driver) -> None:
        self.drv = drv
        self.tokenizer: Tokenizer | None = getattr(drv.engine, "tokenizer", None)

    def generate(self, prompts: Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams]) -> list[RequestOutput]:
        drv = self.drv
        t0 = time.perf_counter()
        outs = drv._batch().generate(prompts, sampling_params)
        drv.gen_s += time.perf_counter() - t0
        drv.generated_tokens += sum(own_tokens(r.outputs) for r in outs)
        return outs
