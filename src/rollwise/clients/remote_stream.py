"""The step-level engine interface (`engine.protocol.StepEngine`) over a remote server's streaming completions.

The early_stop and partial policies need to see samples finish one by one and to stop the rest mid-way. Over
HTTP that is: every request is a streaming /v1/completions call read by a thread of its own; `step()` waits
until at least one request has all its samples finished and returns those; `abort(rid)` hangs up the request's
streams (vLLM and `rollwise serve` abort a request whose client disconnects) and returns what was streamed so
far, finish_reason 'abort' for the samples that had not finished.

Resuming a partial sample (`add_request(partial=...)`) sends its prompt plus the tokens it already has as the new
prompt, for the tokens it has left: its earlier tokens keep their log-probs and weight versions, and the new ones
get the version now loaded. A resumed sample's draws come from a seed derived from the request's seed, the sample
and its length, so a resume is reproducible, though not the same draws as an uninterrupted sample.

NOTE on weight versions: a streamed token records the version this client had loaded when its request started.
The loop loads weights only between steps, after the policy has finished or aborted every request, so no request
streams across a load (its tokens' versions could then not be told apart).

Deliberately left out: speculative drafts (`drafts=` is refused: the HTTP API cannot verify them).
"""

from __future__ import annotations

import dataclasses
import threading
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from rollwise.clients.http_client import HttpClient, Stream
from rollwise.clients.remote_check import (ChoiceLimits, RemoteEngineError, TextTally, check_length, check_vocab,
                                           chunk_tokens, versions_of)
from rollwise.types import CompletionOutput, FinishReason, RequestOutput, SamplingParams, Tokenizer

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.engine.protocol import StepEngine


class StreamingServer(Protocol):
    """What the step engine asks of the `RemoteEngine` it streams from (named here, not imported: remote.py
    imports this module)."""

    http: HttpClient
    base_url: str
    timeout_s: float
    texts: TextTally
    tokenizer: Tokenizer | None

    @property
    def weight_version(self) -> int: ...

    def completion_request(self, prompt: str | list[int], sp: SamplingParams,
                           stream: bool = False) -> dict[str, Any]: ...

    def limits(self, sp: SamplingParams, version_floor: int) -> ChoiceLimits: ...

    def decode(self, ids: list[int], stop: Sequence[str] | None = None) -> str: ...


@dataclass
class _Sample:
    """One sample being streamed (or already done, when it came in finished as a partial)."""

    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    said: list[str] = field(default_factory=list)
    """The text the server streamed for this request's tokens (compared with the ids' text, never used)."""


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    samples: list[_Sample]
    streams: list[Stream] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    running: int = 0
    error: BaseException | None = None
    aborted: bool = False


def resume_seed(seed: int | None, sample: int, have: int) -> int | None:
    """The seed of sample `sample` resumed after `have` tokens (None stays None: unseeded)."""
    if seed is None:
        return None
    return (seed * 1_000_003 + zlib.crc32(f"{sample}/{have}".encode())) % (1 << 62)


class RemoteStepEngine:
    """add_request / step / abort / has_unfinished over a `RemoteEngine`'s streaming completions."""

    def __init__(self, remote: StreamingServer, poll_s: float = 0.5, cond: threading.Condition | None = None) -> None:
        """cond: a condition shared with other step engines (`MultiStepEngine` waits on it for any of them)."""
        self.remote = remote
        self.poll_s = poll_s
        self._reqs: dict[str, _Req] = {}
        self._cond = cond if cond is not None else threading.Condition()
        self._done: list[str] = []

    # ------------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self.remote.weight_version

    @property
    def num_unfinished_seqs(self) -> int:
        with self._cond:
            return sum(1 for r in self._reqs.values() for s in r.samples if s.finish is None)

    def has_unfinished(self) -> bool:
        with self._cond:
            return bool(self._reqs)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    partial: list[CompletionOutput] | None = None, drafts: object = None) -> None:
        if drafts is not None:
            raise ValueError("speculative drafts need the in-process engine (a remote server cannot verify them)")
        with self._cond:
            if request_id in self._reqs:
                raise ValueError(f"request {request_id!r} is already in flight")
        samples = [_Sample() for _ in range(params.n)]
        if partial is not None:
            if len(partial) != params.n:
                raise ValueError(f"partial has {len(partial)} samples for n={params.n}")
            for s, p in zip(samples, partial):
                if p is None:
                    continue
                s.ids, s.lps, s.versions = list(p.token_ids), list(p.logprobs), list(p.weight_versions)
                s.finish = p.finish_reason if p.finish_reason in ("stop", "length") else None
                if s.finish is None and len(s.ids) >= params.max_tokens:
                    s.finish = "length"
        req = _Req(request_id, list(prompt_token_ids), params, samples)
        todo = [j for j, s in enumerate(samples) if s.finish is None]
        with self._cond:
            self._reqs[request_id] = req
        if not todo:
            self._finish_one(req)
            return
        fresh = all(not samples[j].ids for j in todo) and len(todo) == params.n
        if fresh:  # one stream for all n samples: they share the prompt's prefill on the server
            self._start(req, list(range(params.n)), list(prompt_token_ids), params)
        else:
            for j in todo:
                have = samples[j].ids
                sp = dataclasses.replace(params, n=1, max_tokens=params.max_tokens - len(have),
                                         seed=resume_seed(params.seed, j, len(have)))
                self._start(req, [j], list(prompt_token_ids) + have, sp)

    def step(self, wait: bool = True) -> list[RequestOutput]:
        """The requests that finished since the last call; waits (up to `poll_s`) for one when none has."""
        with self._cond:
            if wait and not self._done and self._reqs:
                self._cond.wait_for(lambda: bool(self._done), timeout=self.poll_s)
            done, self._done = self._done, []
            outs = []
            for rid in done:
                req = self._reqs.pop(rid, None)
                if req is None:
                    continue
                if req.error is not None:
                    self._cancel(req)
                    raise req.error
                outs.append(self._output(req))
        return outs

    def abort(self, request_id: str) -> RequestOutput | None:
        """Hang up the request's streams; its output so far (unfinished samples: finish_reason 'abort')."""
        with self._cond:
            req = self._reqs.get(request_id)
            if req is None:
                return None
            req.aborted = True
        self._cancel(req)
        for t in req.threads:
            t.join(timeout=self.remote.timeout_s)
        with self._cond:
            self._reqs.pop(request_id, None)
            if request_id in self._done:
                self._done.remove(request_id)
            out = self._output(req)
        for o in out.outputs:
            if o.finish_reason is None:
                o.finish_reason = "abort"
        return out

    # ------------------------------------------------------------------ streams
    def _start(self, req: _Req, sample_ids: list[int], prompt: list[int], sp: SamplingParams) -> None:
        body = self.remote.completion_request(prompt, sp, stream=True)
        floor = self.remote.weight_version
        stream = self.remote.http.stream("/v1/completions", body, deadline_s=self.remote.timeout_s,
                                         headers={"X-Request-Id": f"{req.rid}-{sample_ids[0]}"})
        t = threading.Thread(target=self._read, args=(req, sample_ids, stream, sp, floor), daemon=True,
                             name=f"rollwise-stream-{req.rid}")
        with self._cond:
            req.streams.append(stream)
            req.threads.append(t)
            req.running += 1
        t.start()

    def _read(self, req: _Req, sample_ids: list[int], stream: Stream, sp: SamplingParams, floor: int) -> None:
        limits = self.remote.limits(sp, floor)
        got = {j: 0 for j in sample_ids}
        try:
            for ev in stream.events():
                if not isinstance(ev, dict) or not isinstance(ev.get("choices"), list):
                    if isinstance(ev, dict) and ev.get("error"):
                        raise RemoteEngineError(f"the server sent an error: {str(ev['error'])[:200]}")
                    continue
                for ch in ev["choices"]:
                    k = ch.get("index") if isinstance(ch, dict) else None
                    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < len(sample_ids):
                        raise RemoteEngineError(f"a stream chunk for choice index {k!r:.20} of {len(sample_ids)}")
                    j = sample_ids[k]
                    field = f"choices[{k}]"
                    ids, lps = chunk_tokens(ch, field)
                    got[j] += len(ids)
                    check_length(got[j], limits, field)  # over the whole stream: a server that never stops is cut
                    check_vocab(ids, limits, field)
                    vs = versions_of(ch, ev.get("weight_version"), len(ids), limits, field)
                    reason = ch.get("finish_reason")
                    if reason not in (None, "stop", "length", "abort"):
                        raise RemoteEngineError(f"{field}.finish_reason is {reason!r:.40}")
                    with self._cond:
                        s = req.samples[j]
                        s.ids += ids
                        s.lps += lps
                        s.versions += vs
                        if isinstance(ch.get("text"), str):
                            s.said.append(ch["text"])
                        if reason is not None:
                            s.finish = reason
            with self._cond:
                if not req.aborted and any(req.samples[j].finish is None for j in sample_ids):
                    raise RemoteEngineError("the stream ended before every sample finished")
                streamed = [(req.samples[j], len(req.samples[j].ids) - got[j]) for j in sample_ids]
            if self.remote.tokenizer is not None:  # what this stream sent (a resumed sample's start came before)
                self.remote.texts.add([("".join(s.said), self.remote.decode(s.ids[have:], req.params.stop))
                                       for s, have in streamed])
        except BaseException as e:  # noqa: BLE001 - handed to step(), which raises it in the caller's thread
            if not req.aborted:
                with self._cond:
                    req.error = RemoteEngineError(f"{self.remote.base_url}/v1/completions (stream): {e}") \
                        if isinstance(e, RemoteEngineError) else e
                    self._cancel(req)
        finally:
            with self._cond:
                req.running -= 1
                if req.running == 0 and not req.aborted:
                    self._finish_one(req)

    def _finish_one(self, req: _Req) -> None:
        """Mark `req` done for `step` (callers hold or do not need the lock: list append is atomic)."""
        with self._cond:
            self._done.append(req.rid)
            self._cond.notify_all()

    @staticmethod
    def _cancel(req: _Req) -> None:
        for s in req.streams:
            s.cancel()

    def _output(self, req: _Req) -> RequestOutput:
        outs = []
        for j, s in enumerate(req.samples):
            outs.append(CompletionOutput(j, list(s.ids), list(s.lps), s.finish, self.remote.decode(s.ids, req.params.stop),
                                         list(s.versions)))
        return RequestOutput(req.rid, list(req.prompt), outs)

    def close(self) -> None:
        with self._cond:
            reqs = list(self._reqs.values())
            for r in reqs:
                r.aborted = True
        for r in reqs:
            self._cancel(r)


class MultiStepEngine:
    """The step-level interface over several remote engines: each request goes to the one with the fewest
    samples in flight; `step` returns what finished on any of them."""

    def __init__(self, engines: Sequence[StreamingServer], poll_s: float = 0.5) -> None:
        self._cond = threading.Condition()
        self.cores = [RemoteStepEngine(e, poll_s, cond=self._cond) for e in engines]
        self.poll_s = poll_s
        self._where: dict[str, RemoteStepEngine] = {}

    @property
    def weight_version(self) -> int:
        return min(c.weight_version for c in self.cores)

    @property
    def num_unfinished_seqs(self) -> int:
        return sum(c.num_unfinished_seqs for c in self.cores)

    def has_unfinished(self) -> bool:
        return any(c.has_unfinished() for c in self.cores)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    partial: list[CompletionOutput] | None = None, drafts: object = None) -> None:
        core = min(self.cores, key=lambda c: c.num_unfinished_seqs)
        core.add_request(request_id, prompt_token_ids, params, partial=partial, drafts=drafts)
        self._where[request_id] = core

    def step(self) -> list[RequestOutput]:
        with self._cond:
            if self.has_unfinished() and not any(c._done for c in self.cores):
                self._cond.wait_for(lambda: any(c._done for c in self.cores), timeout=self.poll_s)
        outs = [o for c in self.cores for o in c.step(wait=False)]
        for o in outs:
            self._where.pop(o.request_id, None)
        return outs

    def abort(self, request_id: str) -> RequestOutput | None:
        core = self._where.pop(request_id, None)
        return core.abort(request_id) if core is not None else None

    def close(self) -> None:
        for c in self.cores:
            c.close()


if TYPE_CHECKING:  # pragma: no cover - read by mypy only: both must keep implementing the step-level protocol
    def _implements_step_engine(one: RemoteStepEngine, several: MultiStepEngine) -> list[StepEngine]:
        return [one, several]
