"""`OpenAIServer`: an OpenAI-compatible HTTP server over one `EngineCore` (stdlib `ThreadingHTTPServer`).

Threads: one per connection for HTTP (parsing, tokenizing, waiting, writing), and the single engine thread
of `EngineWorker` that runs the continuous batch. Handlers never touch the engine. What one client can hold
is bounded by conn.py: read deadlines per phase, a write timeout, a connection cap that closes idle
connections first, a byte budget for request bodies, and an accept loop that backs off when descriptors
run out. Each request is framed by exactly one unambiguous Content-Length (serve/framing.py: no request
smuggling behind a proxy); weight uploads are checked whole before the engine sees them (serve/weights.py).
Every error answer, the stdlib's own (400 bad request line, 414, 431, 501, 505) included, is OpenAI's error
JSON; JSON bodies nested deeper than `max_json_depth` are a 400.

Routes:
    POST /v1/completions            POST /v1/chat/completions      GET /v1/models      GET /health
    POST /admin/load_weights        (Bearer admin key) body {"path": DIR} or raw safetensors bytes
    POST /update_weights_from_disk  (SGLang's route name, same key) body {"model_path": DIR}
    POST /collective_rpc            (vLLM dev-mode route name, same key) body {"method": "reload_weights"}

Why the standard library: no extra dependency, `rollwise --help` stays fast, and one Python thread per
connection is plenty next to an engine whose step takes milliseconds; the engine thread releases the GIL
inside torch.

Left out on purpose: TLS, API keys on the generation routes, multiple models, prompt log-probs.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs

from rollwise.serve.chat import render_chat
from rollwise.serve.conn import (AcceptBackoff, ByteBudget, Connection, ConnectionTable, ConnLimits, Evicted,
                                 HeadTooLarge, ReadDeadline, fd_connection_cap, reject_busy)
from rollwise.serve.framing import FramingError, HeadRecorder, body_length, check_head_lines
from rollwise.serve.protocol import (APIError, GenerationRequest, ModelInfo, parse_chat, parse_completion,
                                     resolve_max_tokens)
from rollwise.serve.respond import GenerationRun
from rollwise.serve.weights import check_upload
from rollwise.serve.worker import EngineWorker, Event

log = logging.getLogger("rollwise.serve")


@dataclass
class ServeConfig:
    """HTTP-side settings of `rollwise serve` (engine sizing lives in `EngineConfig`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    """0 picks a free port (see `OpenAIServer.url`)."""
    served_model_name: str | None = None
    """The `model` clients must send; default: the model directory as given."""
    admin_key: str | None = None
    """Bearer key of the weight-loading routes; None disables them (403)."""
    max_body_mb: float = 32.0
    """Largest JSON body; weight uploads to /admin/load_weights may be up to `max_upload_gb`."""
    max_upload_gb: float = 64.0
    weight_load_timeout_s: float = 600.0
    disconnect_poll_s: float = 0.1
    """How often a waiting handler checks whether its client hung up (then the request is aborted)."""
    max_json_depth: int = 64
    """Deepest nesting of arrays/objects accepted in a JSON body (a request needs fewer than 6); deeper is 400."""
    limits: ConnLimits = field(default_factory=ConnLimits)
    """Timeouts, the connection cap and the byte budget (see serve/conn.py)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_json_depth < 2:
            raise ValueError(f"max_json_depth must be >= 2, got {self.max_json_depth}")


class OpenAIServer:
    """Serve `engine` over HTTP. `start()` runs in background threads; `serve_forever()` blocks.

    >>> with OpenAIServer(EngineCore.from_pretrained(d), d, ServeConfig(port=0)) as srv:
    ...     print(srv.url)
    """

    def __init__(self, engine: Any, model_dir: str | Path, config: ServeConfig | None = None) -> None:
        self.config = config or ServeConfig()
        self.engine = engine
        self.model_dir = str(model_dir)
        self.tokenizer = engine.tokenizer
        self.info = ModelInfo(name=self.config.served_model_name or self.model_dir, max_model_len=engine.max_model_len,
                              vocab_size=engine.model.spec.vocab_size, max_num_seqs=engine.config.max_num_seqs,
                              has_tokenizer=self.tokenizer is not None)
        self.worker = EngineWorker(engine)
        self.created = int(time.time())
        self._tok_lock = threading.Lock()
        self._httpd = _HTTPServer((self.config.host, self.config.port), _Handler)
        self._httpd.setup_guard(self, self.config.limits)
        self._http_thread: threading.Thread | None = None
        self._closed = False
        self._serving = False
        self._close_lock = threading.Lock()
        self._shut = threading.Event()

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "OpenAIServer":
        """Start the engine thread and serve HTTP on a background thread."""
        self.worker.start()
        self._serving = True
        self._http_thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                             name="rollwise-http", daemon=True)
        self._http_thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until `shutdown()` (e.g. from a signal handler's thread)."""
        if not self.worker.alive:
            self.worker.start()
        self._serving = True
        self._httpd.serve_forever(poll_interval=0.1)

    def shutdown(self, drain_s: float = 5.0) -> None:
        """Stop accepting requests, let running ones finish for up to `drain_s`, abort the rest, close."""
        with self._close_lock:
            first = not self._closed
            self._closed = True
        if not first:  # another thread (a signal handler's) is shutting down: wait for it
            self._shut.wait()
            return
        if self._serving:  # httpd.shutdown() blocks unless serve_forever is running
            self._httpd.shutdown()
        deadline = time.monotonic() + drain_s
        while self.worker.num_requests and time.monotonic() < deadline:
            time.sleep(0.02)
        self.worker.stop()
        self._httpd.server_close()
        self._shut.set()

    def __enter__(self) -> "OpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(drain_s=0.0)

    # ------------------------------------------------------------------ helpers used by handlers
    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._tok_lock:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def pieces(self, ids: list[int]) -> tuple[list[str], list[str]]:
        """Per token: its name (decoded with special tokens) and its share of the text (without them)."""
        if self.tokenizer is None:
            return ["" for _ in ids], ["" for _ in ids]
        with self._tok_lock:
            names = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
            special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
            texts = ["" if t in special else nm for t, nm in zip(ids, names)]
            return names, texts

    def full_text(self, ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def check_fits(self, prompt_len: int, n: int) -> None:
        """400 for a request the KV cache can never hold (else the scheduler would fail at step time)."""
        bm = self.engine.block_manager
        need = -(-prompt_len // bm.block_size) + ((n - 1) if prompt_len % bm.block_size else 0)
        if need > bm.num_blocks:
            raise APIError(400, f"a prompt of {prompt_len} tokens with n={n} needs {need} KV-cache blocks but the "
                                f"server has {bm.num_blocks}; shorten the prompt or lower n", "prompt")

    def check_admin(self, headers: Any) -> None:
        key = self.config.admin_key
        if not key:
            raise APIError(403, "admin routes are disabled: start the server with --admin-key or ROLLWISE_ADMIN_KEY")
        auth = headers.get("Authorization", "")
        given = auth[7:] if auth.startswith("Bearer ") else ""
        if not given:
            raise APIError(401, "missing admin key: send 'Authorization: Bearer KEY'")
        if not hmac.compare_digest(given.encode(), key.encode()):
            raise APIError(401, "invalid admin key")

    def load_weights(self, tensors: dict[str, Any], version: int | None = None) -> int:
        """Check the whole upload (serve/weights.py: a bad one is a 400 and nothing is copied), then copy it into
        the engine between two steps as `version` (the caller's number, see `engine.protocol`; None: current + 1).

        Returns the version this load set, as the engine thread returned it: never `engine.weight_version` read
        afterwards, which a concurrent load may already have moved on."""
        check_upload(self.engine.model, tensors)
        fut = self.worker.call(lambda eng: eng.load_weights(tensors, version))
        timeout = self.config.weight_load_timeout_s
        try:
            return int(fut.result(timeout=timeout))
        except TimeoutError:
            if fut.cancel():  # still queued behind the engine's work: it will not run
                raise APIError(503, f"weight load did not start within {timeout:.0f}s; nothing was loaded") from None
            raise APIError(503, f"weight load did not finish within {timeout:.0f}s; it is still running and "
                                "will apply (see /health's weight_version)") from None
        except ValueError as e:  # CheckpointError the checks above did not foresee
            raise APIError(400, f"cannot load these weights: {e}") from None


def _version_arg(query: dict[str, list[str]]) -> int | None:
    """`weight_version=N` from the admin request (query string or JSON body), or None."""
    raw = query.get("weight_version")
    if not raw:
        return None
    try:
        v = int(raw[-1])
    except ValueError:
        v = -1
    if v < 0:
        raise APIError(400, f"weight_version must be a non-negative integer, got {raw[-1]!r}", "weight_version")
    return v


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # 64+ clients connect at once; the default backlog of 5 drops SYNs
    app: OpenAIServer
    conns: ConnectionTable
    budget: ByteBudget
    limits: ConnLimits

    def setup_guard(self, app: OpenAIServer, limits: ConnLimits) -> None:
        self.app = app
        self.limits = limits
        self.conns = ConnectionTable(fd_connection_cap(limits.max_connections))
        self.budget = ByteBudget(int(limits.max_buffered_mb * 2**20))
        self._backoff = AcceptBackoff(self.conns)
        self._busy = _error_response(503, "the server holds its maximum of connections, all working on requests; "
                                          "retry shortly")

    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            got = super().get_request()
        except OSError as e:
            self._backoff.failed(e)  # out of descriptors: free one and sleep instead of spinning
            raise
        self._backoff.succeeded()
        return got

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = Connection(request, self.limits.write_timeout_s)
        if not self.conns.admit(conn):
            reject_busy(request, self._busy)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.conns.remove(request)  # before the close: see Connection.evict
        super().shutdown_request(request)


def _error_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response with OpenAI's error JSON, for answers sent outside a handler."""
    body = json.dumps(APIError(status, message).to_json()).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n")
    return head.encode() + body


def _json_depth(obj: Any, limit: int) -> int:
    """Nesting depth of parsed JSON, counted without recursion; stops early past `limit`."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (list, dict)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return deepest


def _read_dir_tensors(path: Any) -> dict[str, Any]:
    from rollwise.models.loader import iter_safetensors

    if not isinstance(path, str) or not path:
        raise APIError(400, "the checkpoint directory must be given as a non-empty string", "path")
    if not Path(path).is_dir():
        raise APIError(400, f"checkpoint directory not found on the server: {path}", "path")
    try:
        return dict(iter_safetensors(path))
    except ValueError as e:
        raise APIError(400, str(e), "path") from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    # ------------------------------------------------------------------ plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("%s " + format, self.address_string(), *args)

    @property
    def app(self) -> OpenAIServer:
        return self.server.app

    def _send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, allow_nan=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, e: APIError) -> None:
        self._send_json(e.status, e.to_json())

    def _read_body(self, limit: int, budgeted: bool = True) -> bytes:
        """The body, read against its deadline and (unless `budgeted` is False) the server's byte budget."""
        n = self._body_len  # framed before any route ran (serve/framing.py)
        if n == 0:
            self._consumed = True
            return b""
        if n > limit:
            raise APIError(413, f"request body of {n} bytes exceeds the limit of {limit} bytes")
        self._body_started = True
        lim = self.server.limits
        self._reader.begin("request body", lim.body_deadline_s(n))
        chunks: list[bytes] = []
        left = n
        try:
            while left:
                chunk = self.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    raise APIError(400, f"the client closed the connection after {n - left} of {n} body bytes")
                if budgeted:
                    if not self.server.budget.take(len(chunk)):
                        raise APIError(503, "the server is holding too many request bytes; retry shortly")
                    self._held += len(chunk)
                chunks.append(chunk)
                left -= len(chunk)
        except ReadDeadline as e:
            raise APIError(408, f"the request body ({n} bytes) did not arrive within {e.timeout_s:.3g}s; "
                                f"{n - left} bytes came") from None
        self._consumed = True
        return b"".join(chunks)

    def _read_json(self) -> Any:
        raw = self._read_body(int(self.app.config.max_body_mb * 2**20))
        if not raw:
            raise APIError(400, "request body is empty; send a JSON object")
        depth = self.app.config.max_json_depth
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"invalid JSON body: {e}") from None
        except RecursionError:
            raise APIError(400, f"the JSON body is nested deeper than {depth} levels") from None
        if _json_depth(obj, depth) > depth:
            raise APIError(400, f"the JSON body is nested deeper than {depth} levels")
        return obj

    # ------------------------------------------------------------------ connection handling
    def setup(self) -> None:
        super().setup()
        conn = self.server.conns.get(self.request)
        if conn is None:  # evicted between accept and this thread starting
            conn = Connection(self.request, self.server.limits.write_timeout_s)
            conn.reader.evicted = True
        self._conn = conn
        self._reader = conn.reader
        self._held = 0
        self.rfile.close()
        self.rfile = io.BufferedReader(self._reader)
        self.connection.settimeout(self.server.limits.write_timeout_s)

    def handle_one_request(self) -> None:
        """The stdlib's, with the head read against a deadline and a size cap, and errors as JSON."""
        lim = self.server.limits
        conn = self._conn
        conn.waiting, conn.waiting_since = True, time.monotonic()
        self._reader.begin("request head", lim.header_timeout_s, limit=lim.max_header_bytes + io.DEFAULT_BUFFER_SIZE)
        self.command, self.request_version, self.requestline = "", "HTTP/1.1", ""
        self._body_len, self._consumed, self._body_started, self._framed = 0, False, False, False
        try:
            self.raw_requestline = self.rfile.readline(lim.max_request_line + 1)
            if len(self.raw_requestline) > lim.max_request_line:
                self.send_error(414, f"the request line is longer than {lim.max_request_line} bytes")
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self._parse_head():  # 400/411/431/501/505 already answered, as JSON (see send_error)
                return
        except ReadDeadline as e:
            self.close_connection = True
            if e.got:  # a client that sent nothing (an idle keep-alive) is closed without an answer
                self._send_quietly(408, f"the request head did not arrive within {e.timeout_s:.3g}s")
            return
        except HeadTooLarge:
            self._send_quietly(431, f"the request head is larger than {lim.max_header_bytes} bytes")
            return
        except (Evicted, OSError):
            self.close_connection = True
            return
        conn.waiting = False
        self._reader.begin("idle", None)
        try:
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(501, f"unsupported method {self.command[:32]!r}")
                return
            method()
            self._finish_body()
            self.wfile.flush()
        except (TimeoutError, Evicted, OSError):  # a write timed out or the client went away
            self.close_connection = True
        finally:
            if self._held:
                self.server.budget.give(self._held)
                self._held = 0

    def _parse_head(self) -> bool:
        """The stdlib's `parse_request`, with the raw header lines kept, then the request framed (framing.py)."""
        stream = self.rfile
        self._recorder = HeadRecorder(stream)
        self.rfile = self._recorder  # type: ignore[assignment] - parse_headers only calls readline
        try:
            if not self.parse_request():
                return False
        finally:
            self.rfile = stream
        return self._frame()

    def _frame(self) -> bool:
        """Decide the body's length from the head, or answer the framing error (and close); True when framed."""
        if self._framed:
            return True
        try:
            check_head_lines(self._recorder.lines)
            self._body_len = body_length(self.headers)
        except FramingError as e:
            self.send_error(e.status, e.message)
            return False
        self._framed = True
        return True

    def handle_expect_100(self) -> bool:
        """Grant `Expect: 100-continue` only to a request that frames (else its error answers instead)."""
        return self._frame() and super().handle_expect_100()

    def _finish_body(self) -> None:
        """Read and drop a body the route did not read, so the next request starts where the client put it and
        the body is never parsed as one; close instead when part of it was read or it is over the JSON limit."""
        n = self._body_len
        if self._consumed or n == 0 or self.close_connection:
            return
        if self._body_started or n > int(self.app.config.max_body_mb * 2**20):
            self.close_connection = True
            return
        self._reader.begin("request body", self.server.limits.body_deadline_s(n))
        left = n
        try:
            while left:
                chunk = self.rfile.read1(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
        except (ReadDeadline, Evicted, OSError):
            pass
        self._consumed = left == 0
        self.close_connection = self.close_connection or left > 0

    def _send_quietly(self, status: int, message: str) -> None:
        try:
            self.send_error(status, message)
        except OSError:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error the stdlib raises itself (400 bad request line, 414, 431, 501, 505) as OpenAI's JSON."""
        text = message or HTTPStatus(code).phrase
        if explain and explain != text and code in (400, 431):
            text = f"{text}: {explain}"
        text = " ".join(str(text).split())[:300]
        if self.request_version == "HTTP/0.9":  # parse_request's default: answer with a status line anyway
            self.request_version = "HTTP/1.1"
        self.close_connection = True  # after a malformed request the byte stream cannot be trusted
        data = json.dumps(APIError(code, text).to_json()).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, routes: dict[str, Callable[[], None]]) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        fn = routes.get(path)
        try:
            if fn is None:
                other = {"GET": ("/health", "/v1/models"), "POST": ("/v1/completions", "/v1/chat/completions")}
                if path in sum(other.values(), ()):
                    raise APIError(405, f"{self.command} is not allowed on {path}")
                raise APIError(404, f"no route {self.command} {path}")
            fn()
        except APIError as e:  # an unread body is read and dropped after the answer (_finish_body)
            self._send_error(e)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):  # TimeoutError: a write past write_timeout_s
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - a bug must answer 500, not kill the connection silently
            log.exception("unhandled error on %s %s", self.command, path)
            try:
                self._send_error(APIError(500, f"internal error: {type(e).__name__}: {e}"))
            except OSError:
                self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._dispatch({"/health": self._health, "/v1/models": self._models})

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch({"/v1/completions": self._completions, "/v1/chat/completions": self._chat,
                        "/admin/load_weights": self._admin_load, "/update_weights_from_disk": self._sglang_load,
                        "/collective_rpc": self._vllm_rpc})

    def _client_gone(self) -> bool:
        """True when the client closed its side (EOF readable) while we wait for the engine."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    # ------------------------------------------------------------------ simple routes
    def _health(self) -> None:
        app = self.app
        self._send_json(200 if app.worker.alive else 503, {
            "status": "ok" if app.worker.alive else "stopping", "model": app.info.name,
            "weight_version": app.engine.weight_version, "num_requests": app.worker.num_requests,
            "engine_steps": app.worker.steps, "engine_errors": app.worker.errors,
        })

    def _models(self) -> None:
        app = self.app
        self._send_json(200, {"object": "list", "data": [{
            "id": app.info.name, "object": "model", "created": app.created, "owned_by": "rollwise",
            "root": app.model_dir, "parent": None, "max_model_len": app.info.max_model_len, "permission": [],
        }]})

    # ------------------------------------------------------------------ admin routes
    def _admin_load(self) -> None:
        app = self.app
        app.check_admin(self.headers)
        query = parse_qs(self.path.split("?", 1)[1]) if "?" in self.path else {}
        ctype = self.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if ctype == "application/octet-stream":
            raw = self._read_body(int(app.config.max_upload_gb * 2**30), budgeted=False)  # authenticated above
            if not raw:
                raise APIError(400, "empty weight upload; send a safetensors file as the body")
            from safetensors import SafetensorError
            from safetensors.torch import load as st_load

            try:
                tensors = st_load(raw)
            except (SafetensorError, ValueError) as e:
                raise APIError(400, f"the body is not a valid safetensors file: {e}") from None
        else:
            body = self._read_json()
            if not isinstance(body, dict):
                raise APIError(400, "request body must be a JSON object")
            tensors = _read_dir_tensors(body.get("path", body.get("model_path")))
            if "weight_version" in body:
                query["weight_version"] = [str(body["weight_version"])]
        version = app.load_weights(tensors, _version_arg(query))
        self._send_json(200, {"success": True, "weight_version": version, "num_tensors": len(tensors),
                              "message": f"loaded {len(tensors)} tensors; weight_version={version}"})

    def _sglang_load(self) -> None:
        app = self.app
        app.check_admin(self.headers)
        body = self._read_json()
        if not isinstance(body, dict):
            raise APIError(400, "request body must be a JSON object")
        tensors = _read_dir_tensors(body.get("model_path"))
        version = app.load_weights(tensors)
        self._send_json(200, {"success": True, "message": f"loaded {len(tensors)} tensors", "weight_version": version,
                              "num_paused_requests": 0})

    def _vllm_rpc(self) -> None:
        app = self.app
        app.check_admin(self.headers)
        body = self._read_json()
        if not isinstance(body, dict) or body.get("method") != "reload_weights":
            raise APIError(400, "only {'method': 'reload_weights'} is supported (reloads the served model directory)",
                           "method")
        version = app.load_weights(_read_dir_tensors(app.model_dir))
        self._send_json(200, {"results": [None], "weight_version": version})

    # ------------------------------------------------------------------ generation
    def _completions(self) -> None:
        req = parse_completion(self._read_json(), self.app.info)
        self._generate(req, chat=False)

    def _chat(self) -> None:
        app = self.app
        req = parse_chat(self._read_json(), app.info)
        with app._tok_lock:
            try:
                req.prompts = [render_chat(app.tokenizer, req.messages)]
            except Exception as e:  # noqa: BLE001 - a template error is the request's problem
                raise APIError(400, f"cannot apply the chat template: {type(e).__name__}: {e}") from None
        self._generate(req, chat=True)

    def _generate(self, req: GenerationRequest, chat: bool) -> None:
        app = self.app
        prompt_ids: list[list[int]] = []
        params = []
        for p in req.prompts:
            ids = app.encode(p, req.add_special_tokens) if isinstance(p, str) else p
            if not ids:
                raise APIError(400, "the prompt is empty after tokenization", "prompt")
            bad = [t for t in ids if not 0 <= t < app.info.vocab_size]
            if bad:
                raise APIError(400, f"prompt token ids outside the vocabulary: {bad[:5]}", "prompt")
            app.check_fits(len(ids), req.params.n)
            prompt_ids.append(ids)
            params.append(replace(req.params, max_tokens=resolve_max_tokens(req, len(ids), app.info)))
        events: queue.Queue[Event] = queue.Queue()
        rids = [f"{req.request_id}-{i}" for i in range(len(prompt_ids))]
        for rid, ids, sp in zip(rids, prompt_ids, params):
            app.worker.submit(rid, ids, sp, req.stream, events)
        run = GenerationRun(self, req, chat, rids, prompt_ids, params, events)
        if req.stream:
            run.stream()
        else:
            run.respond()
