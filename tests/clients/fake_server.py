"""A scriptable stand-in for a vLLM / SGLang server: records every route it is asked for, answers completions
from a script (so a test can return exactly the garbage it wants to prove is refused), and streams SSE.

Only for the unit tests of the remote engine; the live tier (tests/vllm) runs against a real vLLM.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


def choice(index: int, ids: list[int], lps: list[float] | None = None, reason: str | None = "length",
           text: str = "") -> dict[str, Any]:
    lps = [-0.5] * len(ids) if lps is None else lps
    return {"index": index, "text": text, "token_ids": ids, "finish_reason": reason,
            "logprobs": {"token_logprobs": lps, "tokens": [f"token_id:{t}" for t in ids]}}


def echo_completion(body: dict[str, Any]) -> dict[str, Any]:
    """A well-formed answer: sample j of n is [j+1, j+1, ...] up to max_tokens."""
    n, m = int(body.get("n", 1)), int(body.get("max_tokens", 4))
    return {"choices": [choice(j, [(j + 1) % 90 + 3] * m) for j in range(n)]}


@dataclass
class FakeServer:
    completion: Callable[[dict[str, Any]], Any] = echo_completion
    """body -> JSON answer for /v1/completions (non-streaming)."""
    stream_tokens: Callable[[dict[str, Any]], list[list[int]]] | None = None
    """body -> per-choice token lists for streaming; one SSE event per token."""
    stream_delay_s: float = 0.0
    routes: dict[str, Callable[[str, dict[str, Any]], tuple[int, Any]]] = field(default_factory=dict)
    """path -> handler(path_with_query, json_body) -> (status, json) overriding the defaults (GET: body {})."""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    auth: list[tuple[str, str | None]] = field(default_factory=list)
    """(path, the Authorization header or None) of every request."""
    stream_text: Callable[[int], str] | None = None
    """token id -> the text each streamed chunk claims (default: none)."""
    disconnects: int = 0
    weight_version: str = "0"

    def start(self) -> "FakeServer":
        fake = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    return json.loads(raw) if raw else None
                except json.JSONDecodeError:
                    return {"_raw": len(raw)}

            def do_GET(self) -> None:
                fake.calls.append((self.path, None))
                fake.auth.append((self.path, self.headers.get("Authorization")))
                if self.path.split("?")[0] in fake.routes:
                    st, obj = fake.routes[self.path.split("?")[0]](self.path, {})
                    return self._send(st, obj)
                if self.path.startswith("/v1/models"):
                    return self._send(200, {"data": [{"id": "fake-model", "root": "/models/fake"}]})
                if self.path.startswith("/weight_info"):
                    return self._send(200, {"weight_version": fake.weight_version})
                if self.path.startswith("/health"):
                    return self._send(200, {})
                self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                body = self._body()
                base = self.path.split("?")[0]
                fake.calls.append((self.path, body))
                fake.auth.append((self.path, self.headers.get("Authorization")))
                if base in fake.routes:
                    st, obj = fake.routes[base](self.path, body or {})
                    return self._send(st, obj)
                if base == "/v1/completions":
                    if body.get("stream"):
                        return self._stream(body)
                    return self._send(200, fake.completion(body))
                if base == "/v1/load_lora_adapter":  # vLLM answers plain text here
                    return self._send(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.".encode())
                if base == "/update_weight_version":
                    fake.weight_version = str(body["new_version"])
                    return self._send(200, {"success": True})
                if base in ("/pause", "/resume", "/reset_prefix_cache", "/flush_cache", "/update_weights_from_disk"):
                    return self._send(200, {"status": "ok", "success": True})
                if base == "/collective_rpc":
                    if body.get("method") == "rollwise_extension_version":
                        return self._send(200, {"results": [{"version": 1}]})
                    if body.get("method") == "rollwise_load_weights":
                        return self._send(200, {"results": [{"loaded": 3, "reprocessed": ["lm_head"], "seconds": 0.1}]})
                    return self._send(200, {"results": [None]})
                self._send(404, {"detail": "Not Found"})

            def _stream(self, body: dict[str, Any]) -> None:
                toks = (fake.stream_tokens or (lambda b: [[7] * int(b["max_tokens"])] * int(b.get("n", 1))))(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                try:
                    longest = max(len(t) for t in toks)
                    for i in range(longest):
                        for k, ids in enumerate(toks):
                            if i < len(ids):
                                last = i == len(ids) - 1
                                ch = choice(k, [ids[i]], reason="length" if last else None,
                                            text=fake.stream_text(ids[i]) if fake.stream_text else "")
                                self.wfile.write(b"data: " + json.dumps({"choices": [ch]}).encode() + b"\n\n")
                                self.wfile.flush()
                        if fake.stream_delay_s:
                            time.sleep(fake.stream_delay_s)
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except OSError:
                    fake.disconnects += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
