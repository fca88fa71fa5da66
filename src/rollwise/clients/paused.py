"""vLLM's /pause and /resume around a weight load, as a pair that is always closed.

A vLLM left paused queues every later request forever: the run hangs instead of failing. So the pause is inside
the block whose exit resumes (a /pause slower than its deadline has still paused the server: vLLM sets the pause
state before it waits for in-flight requests to drain), and /resume gets a deadline of its own, however long the
steps before it took. When the load failed, the server's own /is_paused (where it has one) must confirm the
resume; a server still paused is resumed again until the deadline, then named in the error.

Deliberately left out: resuming a server another client paused (this client resumes only what it paused).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rollwise.clients.http_client import HttpClient
from rollwise.clients.remote_check import RemoteEngineError

CONFIRM_POLL_S = 0.1
"""How often a failed sync asks /is_paused while it waits for the resume to take."""


@contextlib.contextmanager
def paused(http: HttpClient, deadline_s: float) -> Iterator[None]:
    """Pause `http`'s server (mode=wait) for the block; resume it on the way out, whatever happened inside."""
    try:
        http.json("POST", "/pause?mode=wait", None, deadline_s=deadline_s)
        yield
    except BaseException as failed:
        _resume(http, deadline_s, failed)
        raise
    _resume(http, deadline_s, None)


def _resume(http: HttpClient, deadline_s: float, failed: BaseException | None) -> None:
    """POST /resume with a fresh deadline; after a failure also confirm it took. A resume that fails while another
    error is on its way out is added to that error's line (a KeyboardInterrupt goes on as it is)."""
    try:
        http.json("POST", "/resume", None, deadline_s=deadline_s)
        if failed is not None:
            _confirm_resumed(http, time.monotonic() + deadline_s, deadline_s)
    except RemoteEngineError as e:
        if failed is None:
            raise
        if isinstance(failed, Exception):
            raise RemoteEngineError(f"{failed}; then resuming it failed, so it may be left paused: {e}") from None


def _confirm_resumed(http: HttpClient, until: float, deadline_s: float) -> None:
    """Wait (to `until`) for /is_paused to say false, resuming again while it says true; a server without the route
    (404, or an answer without `is_paused`) has nothing to confirm."""
    while True:
        left = until - time.monotonic()
        r = http.request("GET", "/is_paused", deadline_s=max(left, CONFIRM_POLL_S))
        data = r.json()
        if r.status >= 400 or not isinstance(data, dict) or data.get("is_paused") is not True:
            return
        if left <= 0:
            raise RemoteEngineError(f"{http.base_url} is still paused {deadline_s:g}s after /resume")
        time.sleep(CONFIRM_POLL_S)
        http.json("POST", "/resume", None, deadline_s=deadline_s)
