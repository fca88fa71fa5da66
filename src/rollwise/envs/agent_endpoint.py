"""The recording endpoint a user's agent talks to: OpenAI's chat and completions routes over the run's engine.

Each episode gets its own base URL, `http://127.0.0.1:PORT/ep/<episode id>/v1`, so many episodes run at once and
every call is filed under its episode. A call's prompt is turned into token ids here, never re-tokenized later:

- chat (`POST .../v1/chat/completions`): when the messages start with an earlier call's messages and the reply it
  got (the assistant message's content as served), the prompt is that call's prompt ids + its completion ids + the
  chat template's ids for the new messages (`models.turns.ChatTurns.reply_ids`, as multi-turn environments append
  replies). Otherwise the messages are rendered afresh through the chat template (with the request's `tools`).
- completions (`POST .../v1/completions`, a text prompt): when the text starts with an earlier call's prompt and
  completion text, the prompt is that call's ids + completion ids + the new text's ids; otherwise the text is
  encoded as task prompts are.

So an agent that keeps its conversation and appends to it yields one token-exact sequence (`envs.agent_record`).

Sampling is the run's: temperature, top-p and top-k come from the rollout config whatever the request says (the
trainer's log-probs must be of the distribution sampled from), `max_tokens` may only lower the run's, `stop` adds
stop strings, `n` must be 1. Each call gets a seed of its own from the episode's seed and the call's index.

Batching: one dispatcher thread takes every call waiting, sends them to the engine in one `generate` (so concurrent
episodes decode in the same batch) and hands each its output. An engine that raises is a failure outside the
episodes: every waiting call gets a 503 and `failure` keeps the exception, which the runner raises after the
episodes end (the run stops). A call beyond the episode's cap, or one whose prompt does not fit the episode's
token budget, is the episode's own outcome: the call gets a 400 and the episode's log says why.

Why not `rollwise serve` (serve/app.py): it sits above this layer and serves one engine to the world; this is a
loopback recorder of one run's episodes, a few hundred lines of stdlib.

Deliberately left out: streaming, `n > 1`, top log-probs, the Responses API, and continuous batching across calls
(a call arriving while a batch decodes joins the next batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rollwise.envs.agent_record import AgentCall
from rollwise.envs.multiturn import BatchGenerator, encode_reply
from rollwise.models.prompting import PromptFormat
from rollwise.models.turns import ChatTurns
from rollwise.types import SamplingParams, Tokenizer

MAX_BODY_BYTES = 8 << 20


class EndpointError(Exception):
    """An answer other than 200: its HTTP status and OpenAI-style message."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


@dataclass
class EpisodeLog:
    """One episode's calls and limits; the endpoint writes it, the runner reads it once the episode is over."""

    episode_id: str
    params: SamplingParams
    """The run's sampling params for this episode (n=1; `seed` seeds its calls)."""
    max_calls: int
    max_total_tokens: int
    calls: list[AgentCall] = field(default_factory=list)
    history: list[tuple[str, Any, AgentCall]] = field(default_factory=list)
    """Per call: ("chat", messages, call) or ("text", prompt text, call), for finding what a later call extends."""
    requested: int = 0
    error: str | None = None
    """Why the episode is over as errored (the call cap), set by the endpoint; the agent cannot clear it."""
    truncated: bool = False
    """A call did not fit the token budget (the episode is 'truncated')."""
    overridden: int = 0
    """Calls that asked for their own temperature / top_p / top_k (ignored: the run's apply)."""
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class _Pending:
    log: EpisodeLog
    prompt: list[int]
    params: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    out: Any = None
    error: EndpointError | None = None


def _content(m: dict[str, Any]) -> str:
    c = m.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "".join(p.get("text", "") for p in c if isinstance(p, dict))
    raise EndpointError(400, "a message's content must be a string, null or a list of text parts", "messages")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise EndpointError(400, "messages must be a non-empty list", "messages")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise EndpointError(400, "each message must be an object with a role", "messages")
        out.append({"role": m["role"], "content": _content(m)})
    return out


def _tool_calls(text: str, index: int) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` of the well-formed calls in a completion (`models.tool_calls` format); [] for none."""
    from rollwise.models.tool_calls import ToolCall, parse_tool_calls

    calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)]
    return [{"id": f"call_{index}_{k}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for k, c in enumerate(calls)]


class AgentEndpoint:
    """A loopback OpenAI-compatible endpoint over whatever engine `serving(engine)` names, recording every call."""

    def __init__(self, tokenizer: Tokenizer, prompt_format: PromptFormat, *, batch_wait_s: float = 0.005) -> None:
        self.tokenizer = tokenizer
        self.prompt_format = dataclasses.replace(prompt_format, system_prompt=None, tools=None)
        self.turns = ChatTurns(tokenizer, self.prompt_format)
        self.batch_wait_s = batch_wait_s
        self.failure: BaseException | None = None
        self._engine: BatchGenerator | None = None
        self._episodes: dict[str, EpisodeLog] = {}
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._tok_lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.endpoint = self  # type: ignore[attr-defined]
        self._threads = [threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                          name="rollwise-agent-http", daemon=True),
                         threading.Thread(target=self._dispatch, name="rollwise-agent-engine", daemon=True)]
        for t in self._threads:
            t.start()
        self._closed = False

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def base_url(self, episode_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/ep/{episode_id}/v1"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._queue.put(None)

    # ------------------------------------------------------------------ episodes
    @contextlib.contextmanager
    def serving(self, engine: BatchGenerator) -> Iterator[None]:
        """Calls go to `engine` inside the block (the controller hands in a fresh counting wrapper per step)."""
        self._engine = engine
        try:
            yield
        finally:
            self._engine = None

    def open(self, params: SamplingParams, max_calls: int, max_total_tokens: int) -> EpisodeLog:
        log = EpisodeLog(uuid.uuid4().hex[:16], dataclasses.replace(params, n=1), max_calls, max_total_tokens)
        self._episodes[log.episode_id] = log
        return log

    def finish(self, log: EpisodeLog) -> None:
        """No more calls for this episode (a late call from an abandoned agent thread gets a 410)."""
        with log.lock:
            log.closed = True
        self._episodes.pop(log.episode_id, None)

    # ------------------------------------------------------------------ one call
    def _encode(self, text: str) -> list[int]:
        with self._tok_lock:
            return encode_reply(self.tokenizer, text)

    def _chat_prompt(self, log: EpisodeLog, msgs: list[dict[str, str]], tools: Any) -> tuple[list[int], bool]:
        for kind, seen, call in reversed(log.history):
            if kind != "chat":
                continue
            hist = [*seen, {"role": "assistant", "content": call.meta.get("content", call.text)}]
            rest = msgs[len(hist):]
            if msgs[: len(hist)] == hist and rest and all(m["role"] != "assistant" for m in rest):
                with self._tok_lock:
                    ids = self.turns.reply_ids(rest, call.completion_token_ids)
                return call.prompt_token_ids + call.completion_token_ids + ids, True
        fmt = dataclasses.replace(self.prompt_format, tools=tools or None)
        try:
            with self._tok_lock:
                return fmt.encode(self.tokenizer, msgs), False
        except ValueError as e:
            raise EndpointError(400, f"cannot render these messages: {e}", "messages") from None

    def _text_prompt(self, log: EpisodeLog, text: str) -> tuple[list[int], bool]:
        for kind, seen, call in reversed(log.history):
            if kind == "text" and text.startswith(seen + call.text):
                rest = text[len(seen + call.text):]
                return call.prompt_token_ids + call.completion_token_ids + (self._encode(rest) if rest else []), True
        try:
            with self._tok_lock:
                return self.prompt_format.encode(self.tokenizer, text), False
        except ValueError as e:
            raise EndpointError(400, f"cannot encode this prompt: {e}", "prompt") from None

    def call(self, episode_id: str, route: str, body: Any) -> dict[str, Any]:
        """Serve one request of an episode: build its prompt, generate, record, answer (OpenAI's JSON)."""
        log = self._episodes.get(episode_id)
        if log is None:
            raise EndpointError(410, f"episode {episode_id} is over or unknown", "episode_closed")
        if not isinstance(body, dict):
            raise EndpointError(400, "the request body must be a JSON object")
        if body.get("stream"):
            raise EndpointError(400, "streaming is not supported by rollwise's agent endpoint", "stream")
        if body.get("n", 1) != 1:
            raise EndpointError(400, "n must be 1 (one completion per call)", "n")
        with log.lock:
            if log.closed:
                raise EndpointError(410, f"episode {episode_id} is over", "episode_closed")
            log.requested += 1
            index = log.requested
            if index > log.max_calls:
                log.error = log.error or f"agent made more than env.agent_max_calls={log.max_calls} model calls"
                raise EndpointError(400, log.error, "max_calls")
            if any(body.get(k) is not None for k in ("temperature", "top_p", "top_k")):
                log.overridden += 1
            if route == "chat":
                msgs = _messages(body)
                prompt, extended = self._chat_prompt(log, msgs, body.get("tools"))
            else:
                text = body.get("prompt")
                if not isinstance(text, str):
                    raise EndpointError(400, "prompt must be one string", "prompt")
                prompt, extended = self._text_prompt(log, text)
            room = log.max_total_tokens - len(prompt)
            if room < 1:
                log.truncated = True
                raise EndpointError(400, f"the prompt has {len(prompt)} tokens; this episode's budget is "
                                         f"{log.max_total_tokens} (env.max_episode_tokens)", "context_length_exceeded")
        params = self._params(log, body, index, room)
        pending = _Pending(log, prompt, params)
        self._queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        sample = pending.out
        call = AgentCall(list(prompt), list(sample.token_ids), [float(x) for x in sample.logprobs or []],
                         list(sample.weight_versions or []), sample.finish_reason, sample.text or "", extended)
        n = len(call.completion_token_ids)
        if len(call.logprobs) != n:
            call.logprobs = (call.logprobs + [0.0] * n)[:n]
        if len(call.weight_versions) != n:
            last = call.weight_versions[-1] if call.weight_versions else 0
            call.weight_versions = (call.weight_versions + [last] * n)[:n]
        finish = "length" if sample.finish_reason == "length" else "stop"
        with log.lock:
            if log.closed:
                raise EndpointError(410, f"episode {episode_id} is over", "episode_closed")
            call.meta["content"] = call.text
            log.calls.append(call)
            log.history.append(("chat", msgs, call) if route == "chat" else ("text", text, call))
        return self._answer(route, body, call, finish, episode_id, index)

    def _params(self, log: EpisodeLog, body: dict[str, Any], index: int, room: int) -> SamplingParams:
        sp = log.params
        want = body.get("max_completion_tokens", body.get("max_tokens"))
        cap = sp.max_tokens
        if isinstance(want, int) and not isinstance(want, bool) and want >= 1:
            cap = min(cap, want)
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else []
        seed = None if sp.seed is None else (sp.seed * 1_000_003 + zlib.crc32(f"call{index}".encode())) % (1 << 62)
        return dataclasses.replace(sp, n=1, max_tokens=max(1, min(cap, room)), seed=seed, logprobs=True,
                                   stop=(list(sp.stop or []) + stops) or None)

    def _answer(self, route: str, body: dict[str, Any], call: AgentCall, finish: str, episode_id: str,
                index: int) -> dict[str, Any]:
        usage = {"prompt_tokens": len(call.prompt_token_ids), "completion_tokens": len(call.completion_token_ids),
                 "total_tokens": len(call.prompt_token_ids) + len(call.completion_token_ids)}
        base = {"id": f"rw-{episode_id}-{index}", "created": int(time.time()), "model": str(body.get("model", "policy")),
                "usage": usage, "prompt_token_ids": call.prompt_token_ids}
        if route == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": call.text}
            calls = _tool_calls(call.text, index) if body.get("tools") else []
            if calls:  # NOTE: content keeps the whole text, so the message sent back extends the sequence
                message["tool_calls"] = calls
                finish = "tool_calls"
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                                      "token_ids": call.completion_token_ids}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None,
                                                   "top_logprobs": []}
                                                  for t, lp in zip(call.completion_token_ids, call.logprobs)]}
            return {**base, "object": "chat.completion", "choices": [choice]}
        choice = {"index": 0, "text": call.text, "finish_reason": finish, "token_ids": call.completion_token_ids,
                  "logprobs": None}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in call.completion_token_ids],
                                  "token_logprobs": call.logprobs, "top_logprobs": None, "text_offset": None}
        return {**base, "object": "text_completion", "choices": [choice]}

    # ------------------------------------------------------------------ the engine thread
    def _dispatch(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while True:  # gather the calls that arrive together, so they decode in one batch
                try:
                    item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            self._run(batch)

    def _run(self, batch: list[_Pending]) -> None:
        engine = self._engine
        late = [p for p in batch if p.log.closed or engine is None]
        for p in late:  # an abandoned agent's call, after its episode (or its step) ended: not generated
            p.error = EndpointError(410, f"episode {p.log.episode_id} is over", "episode_closed")
            p.done.set()
        batch = [p for p in batch if p not in late]
        if not batch:
            return
        assert engine is not None
        try:
            if self.failure is not None:
                raise self.failure
            outs = engine.generate([p.prompt for p in batch], [p.params for p in batch])
            if len(outs) != len(batch):
                raise RuntimeError(f"the engine returned {len(outs)} outputs for {len(batch)} prompts")
            for p, o in zip(batch, outs):
                p.out = o.outputs[0]
        except BaseException as e:  # noqa: BLE001 - outside every episode: kept and raised by the runner
            if self.failure is None:
                self.failure = e
            for p in batch:
                p.error = EndpointError(503, f"the engine failed: {type(e).__name__}: {e}", "engine_failed")
        for p in batch:
            p.done.set()


class _Server(ThreadingHTTPServer):
    # NOTE: every episode connects at once; the stdlib's backlog of 5 refuses the rest (the agent would see a
    # connection error that is not its episode's fault)
    request_queue_size = 1024


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def _send(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[str, str] | None:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) >= 4 and parts[0] == "ep" and parts[2] == "v1":
            return parts[1], "/".join(parts[3:])
        return None

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        route = self._route()
        if route and route[1] == "models":
            self._send(200, {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "rollwise"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found", "code": None}})

    def do_POST(self) -> None:  # noqa: N802
        ep: AgentEndpoint = self.server.endpoint  # type: ignore[attr-defined]
        route = self._route()
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length < 0 or length > MAX_BODY_BYTES:
                raise EndpointError(413, f"request bodies are limited to {MAX_BODY_BYTES} bytes")
            raw = self.rfile.read(length)
            kind = {"chat/completions": "chat", "completions": "text"}.get(route[1]) if route else None
            if route is None or kind is None:
                raise EndpointError(404, f"no route {self.path}; use {{base_url}}/chat/completions or /completions",
                                    "not_found")
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                raise EndpointError(400, "the request body is not JSON") from None
            self._send(200, ep.call(route[0], kind, body))
        except EndpointError as e:
            self._send(e.status, {"error": {"message": e.message, "type": e.code, "code": e.code}})
        except Exception as e:  # noqa: BLE001 - a bug of ours is that call's 500, never the server's end
            self._send(500, {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": None}})


__all__ = ["AgentEndpoint", "EndpointError", "EpisodeLog"]
