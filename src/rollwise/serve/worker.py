"""The engine thread: the only thread that touches the `EngineCore`.

Why a single thread: `EngineCore` is not thread-safe, and continuous batching wants one loop anyway. HTTP
handler threads never call the engine; they put commands on a queue (add a request, abort one, run a
function between steps such as a weight load) and wait on their request's event queue. The loop is:

    drain commands -> step() -> hand finished outputs (and, for streaming requests, snapshots) back

so every client's request joins the same running batch at the next step.

NOTE: a failing `step()` (an engine bug, or a request that cannot be scheduled) must not kill the server:
every in-flight request is aborted and answered with a 500 naming the error, and the loop goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from rollwise.serve.protocol import APIError
from rollwise.types import RequestOutput, SamplingParams

log = logging.getLogger("rollwise.serve")


@dataclass
class Event:
    """What the engine thread tells a handler about one of its requests."""

    kind: str  # "snapshot" (streaming progress), "final" (finished or aborted), "error"
    request_id: str
    output: RequestOutput | None = None
    error: APIError | None = None


@dataclass
class _Handle:
    request_id: str
    stream: bool
    events: "queue.Queue[Event]"  # shared by all prompts of one HTTP request

    def put(self, kind: str, output: RequestOutput | None = None, error: APIError | None = None) -> None:
        self.events.put(Event(kind, self.request_id, output, error))


class EngineWorker:
    """Owns the engine thread. `submit`/`abort`/`call` are safe from any thread."""

    def __init__(self, engine: Any, idle_poll_s: float = 0.2) -> None:
        self.engine = engine
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._handles: dict[str, _Handle] = {}
        self._stop = threading.Event()
        self._idle_poll_s = idle_poll_s
        self._thread = threading.Thread(target=self._loop, name="rollwise-engine", daemon=True)
        self.steps = 0
        self.errors = 0

    def start(self) -> "EngineWorker":
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def stop(self, timeout: float = 10.0) -> None:
        """Abort whatever is running (clients get finish_reason 'abort') and end the thread."""
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout)

    # ------------------------------------------------------------------ any thread
    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, stream: bool,
               events: "queue.Queue[Event]") -> None:
        """Queue a request; its events (snapshots if `stream`, then one final or error) go to `events`."""
        if not self.alive:
            raise APIError(503, "the server is shutting down")
        self._inbox.put(("add", (_Handle(request_id, stream, events), prompt_ids, params)))

    @property
    def num_requests(self) -> int:
        return len(self._handles)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def call(self, fn: Callable[[Any], Any]) -> Future:
        """Run fn(engine) on the engine thread between two steps; the future holds its result or exception."""
        fut: Future = Future()
        if not self.alive:
            fut.set_exception(APIError(503, "the server is shutting down"))
            return fut
        self._inbox.put(("call", (fn, fut)))
        return fut

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        eng = self.engine
        while not self._stop.is_set():
            if not (eng.has_unfinished() or self._handles):  # idle: sleep until a command arrives
                try:
                    self._run(self._inbox.get(timeout=self._idle_poll_s))
                except queue.Empty:
                    continue
            self._drain()
            if self._stop.is_set():
                break
            if not eng.has_unfinished() and not self._handles:
                continue
            try:
                finished = eng.step()
            except Exception as e:  # noqa: BLE001 - keep serving; fail the in-flight requests loudly
                self._fail_all(e)
                continue
            self.steps += 1
            for out in finished:
                h = self._handles.pop(out.request_id, None)
                if h is not None:
                    h.put("final", out)
            for rid, h in list(self._handles.items()):
                if rid not in eng.requests:  # should not happen: never leave a client waiting forever
                    del self._handles[rid]
                    h.put("error", error=APIError(500, f"request {rid} vanished from the engine"))
                elif h.stream:
                    snap = eng.snapshot(rid)
                    if snap is not None:
                        h.put("snapshot", snap)
        self._shutdown()

    def _drain(self) -> None:
        while True:
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._run(cmd)

    def _run(self, cmd: tuple[str, Any]) -> None:
        kind, arg = cmd
        eng = self.engine
        if kind == "add":
            h, ids, params = arg
            try:
                eng.add_request(h.request_id, ids, params)
            except ValueError as e:
                h.put("error", error=APIError(400, str(e)))
                return
            self._handles[h.request_id] = h
        elif kind == "abort":
            h = self._handles.pop(arg, None)
            out = eng.abort(arg)
            if h is not None:
                h.put("final", out)
        elif kind == "call":
            fn, fut = arg
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn(eng))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                fut.set_exception(e)

    def _fail_all(self, e: Exception) -> None:
        self.errors += 1
        log.error("engine step failed; aborting %d requests:\n%s", len(self._handles), traceback.format_exc())
        try:
            self.engine.interrupt()
        except Exception:  # noqa: BLE001
            log.error("engine interrupt failed:\n%s", traceback.format_exc())
        err = APIError(500, f"engine error: {type(e).__name__}: {e}")
        for h in self._handles.values():
            h.put("error", error=err)
        self._handles.clear()

    def _shutdown(self) -> None:
        for rid, h in list(self._handles.items()):
            out = self.engine.abort(rid)
            if out is not None:
                h.put("final", out)
            else:
                h.put("error", error=APIError(503, "the server is shutting down"))
        self._handles.clear()
        while True:
            try:
                kind, arg = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                arg[0].put("error", error=APIError(503, "the server is shutting down"))
            elif kind == "call":
                arg[1].set_exception(APIError(503, "the server is shutting down"))
