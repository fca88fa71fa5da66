"""HTTP for remote engines: keep-alive requests with a *total* deadline, and cancellable SSE streams.

Why not a socket timeout alone: it bounds one read, so a server that drips a byte every few seconds keeps a
request alive forever (measured: a response dripping for minutes outlived every timeout). Here a watchdog closes
the socket when the request's whole deadline passes, so no answer, however slow, takes longer than the deadline.

Streams (`stream`) get a connection of their own; `Stream.cancel()` closes it from any thread, which is how a
remote sample is aborted mid-generation: the server sees the client hang up and stops the request (vLLM and
`rollwise serve` both abort on disconnect).

Deliberately left out: retries of generation requests (the caller decides; a stale keep-alive connection is
reconnected once, before anything was sent on it), HTTP/2, proxies.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import urlsplit

from rollwise.clients.remote_check import RemoteEngineError

MAX_BODY_BYTES = 256 << 20
"""The largest response body read (a completions answer for 64 x 4k tokens is a few MB)."""
MAX_EVENT_BYTES = 8 << 20
"""The largest single SSE event."""
MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects a server's JSON may have (an OpenAI answer has fewer than 10 levels;
JSON nested thousands deep would otherwise end in a RecursionError, here or in whatever later walks it)."""


def loads(raw: bytes, what: str) -> Any:
    """`raw` as JSON, or None when it is not JSON; RemoteEngineError naming `what` when it is nested deeper than
    `MAX_JSON_DEPTH`."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    except RecursionError:
        data = None
        depth = MAX_JSON_DEPTH + 1
    else:
        depth = json_depth(data, MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise RemoteEngineError(f"{what}: an answer nested deeper than {MAX_JSON_DEPTH} levels")
    return data


def json_depth(data: Any, limit: int) -> int:
    """How deep `data`'s arrays and objects nest (0 for a scalar), counted without recursion and only up to
    `limit` + 1."""
    deepest = 0
    stack = [(data, 1)] if isinstance(data, (list, dict)) else []
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        for child in (node.values() if isinstance(node, dict) else node):
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1))
    return deepest


@dataclass
class Response:
    status: int
    body: bytes
    what: str = "the server"
    """The request, as errors name it (`POST http://host:port/path`)."""

    def json(self) -> Any:
        """The body as JSON, None when it is not JSON; RemoteEngineError when it nests too deep (`loads`)."""
        return loads(self.body, self.what)


class _Watchdog:
    """Closes `conn`'s socket when `seconds` pass; `fired` says whether it did."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self.fired = False
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self._timer.cancel()


class HttpClient:
    """One server: `request` (thread-local keep-alive connections) and `stream` (a connection per stream)."""

    def __init__(self, base_url: str, api_key: str | None = None, connect_timeout_s: float = 10.0) -> None:
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must look like http://host:port, got {base_url!r}")
        self.base_url = url
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path
        self.api_key = api_key
        self.connect_timeout_s = float(connect_timeout_s)
        self._local = threading.local()

    def _new_conn(self, timeout: float) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=timeout)

    def _headers(self, body: bytes | None, content_type: str) -> dict[str, str]:
        h = {"Content-Type": content_type} if body is not None else {}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: bytes | None = None, *, deadline_s: float,
                content_type: str = "application/json") -> Response:
        """One exchange, finished within `deadline_s` seconds or RemoteEngineError."""
        what = f"{method} {self.base_url}{path}"
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._new_conn(min(self.connect_timeout_s, deadline_s))
            fresh = conn.sock is None
            dog = None
            try:
                if fresh:
                    conn.connect()
                conn.sock.settimeout(deadline_s)
                dog = _Watchdog(conn, deadline_s)
                conn.request(method, self._prefix + path, body=body, headers=self._headers(body, content_type))
                resp = conn.getresponse()
                data = resp.read(MAX_BODY_BYTES + 1)
                if len(data) > MAX_BODY_BYTES:
                    raise RemoteEngineError(f"{what}: response body over {MAX_BODY_BYTES >> 20} MB")
                dog.cancel()
                if dog.fired:
                    raise OSError("deadline")
                if resp.will_close:
                    self._drop()
                return Response(resp.status, data, what)
            except RemoteEngineError:
                self._drop()
                raise
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                self._drop()
                if dog is not None and dog.fired:
                    raise RemoteEngineError(f"{what}: timed out after {deadline_s:g}s (total deadline)") from None
                if attempt == 0 and not fresh:  # the server closed an idle keep-alive connection: reconnect
                    continue
                raise RemoteEngineError(f"{what}: connection lost ({e})") from None
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                if (dog is not None and dog.fired) or isinstance(e, (socket.timeout, TimeoutError)):
                    raise RemoteEngineError(f"{what}: timed out after {deadline_s:g}s (total deadline)") from None
                if isinstance(e, http.client.HTTPException):
                    raise RemoteEngineError(f"{what}: the server does not speak HTTP ({type(e).__name__}: "
                                            f"{str(e)[:80]!r})") from None
                raise RemoteEngineError(f"{what}: cannot connect ({e})") from None
            finally:
                if dog is not None:
                    dog.cancel()
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, payload: Any = None, *, deadline_s: float) -> Any:
        """`request` with a JSON body and a JSON answer; HTTP errors raise RemoteEngineError with the server's
        message."""
        body = None if payload is None else json.dumps(payload).encode()
        r = self.request(method, path, body, deadline_s=deadline_s)
        data = r.json()
        if r.status >= 400:
            raise RemoteEngineError(f"{method} {self.base_url}{path} -> HTTP {r.status}: {error_message(data, r.body)}")
        if data is None and r.body.strip():
            raise RemoteEngineError(f"{method} {self.base_url}{path} -> HTTP {r.status} with a body that is not JSON")
        return data

    def ok(self, method: str, path: str, payload: Any = None, *, deadline_s: float) -> bytes:
        """`request` with a JSON body whose answer need not be JSON (vLLM's LoRA routes answer plain text); HTTP
        errors raise RemoteEngineError with the server's message. Returns the body."""
        body = None if payload is None else json.dumps(payload).encode()
        r = self.request(method, path, body, deadline_s=deadline_s)
        if r.status >= 400:
            raise RemoteEngineError(f"{method} {self.base_url}{path} -> HTTP {r.status}: {error_message(r.json(), r.body)}")
        return r.body

    def stream(self, path: str, payload: Any, *, deadline_s: float, headers: dict[str, str] | None = None) -> "Stream":
        """POST `payload` and return its SSE stream (the status is checked here; events are read by iterating)."""
        conn = self._new_conn(min(self.connect_timeout_s, deadline_s))
        body = json.dumps(payload).encode()
        what = f"POST {self.base_url}{path} (stream)"
        s = Stream(conn, deadline_s, what)
        try:
            conn.connect()
            conn.sock.settimeout(deadline_s)
            conn.request("POST", self._prefix + path, body=body,
                         headers={**self._headers(body, "application/json"), **(headers or {})})
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            s.close()
            if s.dog.fired:
                raise RemoteEngineError(f"{what}: timed out after {deadline_s:g}s (total deadline)") from None
            raise RemoteEngineError(f"{what}: cannot connect ({e})") from None
        if resp.status >= 400:
            data = resp.read(1 << 16)
            s.close()
            raise RemoteEngineError(f"{what} -> HTTP {resp.status}: {error_message(loads(data, what), data)}")
        s.resp = resp
        return s


class Stream:
    """An SSE response: iterate for the decoded JSON of each `data:` event (ends at `[DONE]` or EOF)."""

    def __init__(self, conn: http.client.HTTPConnection, deadline_s: float, what: str) -> None:
        self.conn = conn
        self.what = what
        self.resp: http.client.HTTPResponse | None = None
        self.cancelled = False
        self.dog = _Watchdog(conn, deadline_s)
        self.deadline_s = deadline_s

    def cancel(self) -> None:
        """Hang up (any thread): the reader stops, and the server aborts the request."""
        self.cancelled = True
        self.dog._fire()

    def close(self) -> None:
        self.dog.cancel()
        try:
            self.conn.close()
        except OSError:
            pass

    def events(self) -> Iterator[Any]:
        assert self.resp is not None
        buf: list[bytes] = []
        size = 0
        try:
            while True:
                line = self.resp.readline(MAX_EVENT_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_EVENT_BYTES or size > MAX_EVENT_BYTES:
                    raise RemoteEngineError(f"{self.what}: an event over {MAX_EVENT_BYTES >> 20} MB")
                line = line.rstrip(b"\r\n")
                if line:
                    if line.startswith(b"data:"):
                        buf.append(line[5:].strip())
                        size += len(line)
                    continue
                if not buf:
                    continue
                raw = b"".join(buf)
                buf, size = [], 0
                if raw == b"[DONE]":
                    return
                event = loads(raw, self.what)
                if event is None and raw.strip() != b"null":
                    raise RemoteEngineError(f"{self.what}: an event that is not JSON: {raw[:120]!r}")
                yield event
        except (OSError, http.client.HTTPException) as e:
            if self.cancelled:
                return
            if self.dog.fired:
                raise RemoteEngineError(f"{self.what}: timed out after {self.deadline_s:g}s (total deadline)") from None
            raise RemoteEngineError(f"{self.what}: connection lost ({e})") from None
        finally:
            self.close()
        if self.cancelled:
            return
        if self.dog.fired:
            raise RemoteEngineError(f"{self.what}: timed out after {self.deadline_s:g}s (total deadline)")
        raise RemoteEngineError(f"{self.what}: the stream ended without [DONE]")


def error_message(data: Any, raw: bytes) -> str:
    """The server's error text: OpenAI's error.message, FastAPI's detail, or the raw body's start."""
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if isinstance(err, str) and err:
            return err[:300]
        for k in ("message", "detail"):
            if data.get(k):
                return str(data[k])[:300]
    return raw[:200].decode("utf-8", "replace") or "(empty body)"
