"""HTTP helpers and the in-process server starter shared by the serve tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADMIN_KEY = "test-admin-key"
MODEL = "tiny"
CHARS = "0123456789+-*= abcdefghij\n"


def start_server(ckpt: Path, admin_key: str | None = ADMIN_KEY, serve: dict[str, Any] | None = None,
                 **engine_kwargs: Any):
    """An in-process server on a free port; `serve` holds extra `ServeConfig` fields (e.g. tight `limits`)."""
    from rollwise.engine.core import EngineConfig, EngineCore
    from rollwise.serve.app import OpenAIServer, ServeConfig

    cfg = EngineConfig(**{"block_size": 4, "max_model_len": 128, **engine_kwargs})
    eng = EngineCore.from_pretrained(ckpt, config=cfg)
    scfg = ServeConfig(port=0, served_model_name=MODEL, admin_key=admin_key, **(serve or {}))
    return OpenAIServer(eng, ckpt, scfg).start()


@dataclass
class Reply:
    status: int
    body: Any
    raw: bytes


def request(url: str, method: str = "GET", body: Any = None, raw: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 60.0) -> Reply:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            content = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        content, status = e.read(), e.code
    try:
        parsed = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        parsed = None
    return Reply(status, parsed, content)


def post(srv, path: str, body: Any, **kw: Any) -> Reply:
    return request(srv.url + path, "POST", body, **kw)


def sse_events(srv, path: str, body: Any) -> list[Any]:
    """POST a streaming request; the parsed `data:` payloads, with '[DONE]' kept as a string."""
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = r.read().decode()
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
