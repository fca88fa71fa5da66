"""rollwise serve under misuse and load: bad requests, admin auth, weight reloads, disconnects, 64 clients,
and graceful shutdown of the `rollwise serve` process on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rollwise import LLM, SamplingParams
from serve_util import ADMIN_KEY, MODEL, post, request, start_server

ROLLWISE = str(Path(sys.executable).with_name("rollwise"))  # the console script, as users run it
GOOD = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 4, "seed": 0}

BAD_COMPLETIONS = [
    # (description, body or raw bytes, status, message fragment)
    ("invalid JSON", b"{not json", 400, "invalid JSON"),
    ("empty body", b"", 400, "empty"),
    ("body not an object", b"[1, 2]", 400, "JSON object"),
    ("missing model", {"prompt": "1+1=", "max_tokens": 4}, 400, "'model' is required"),
    ("unknown model", {**GOOD, "model": "gpt-9"}, 404, "does not exist"),
    ("model not a string", {**GOOD, "model": 3}, 400, "'model' must be a string"),
    ("missing prompt", {"model": MODEL}, 400, "'prompt' is required"),
    ("empty prompt", {**GOOD, "prompt": ""}, 400, "must not be empty"),
    ("empty token list", {**GOOD, "prompt": []}, 400, "'prompt' must be"),
    ("float token ids", {**GOOD, "prompt": [1.5, 2]}, 400, "'prompt' must be"),
    ("mixed prompt list", {**GOOD, "prompt": ["a", [1]]}, 400, "'prompt' must be"),
    ("token outside vocab", {**GOOD, "prompt": [5, 100000]}, 400, "outside the vocabulary"),
    ("negative max_tokens", {**GOOD, "max_tokens": -5}, 400, "'max_tokens' must be at least 1"),
    ("zero max_tokens", {**GOOD, "max_tokens": 0}, 400, "at least 1"),
    ("enormous max_tokens", {**GOOD, "max_tokens": 10**12}, 400, "maximum context length is 128"),
    ("prompt + max_tokens over context", {**GOOD, "prompt": [5] * 100, "max_tokens": 50}, 400, "you requested 150"),
    ("prompt over context", {**GOOD, "prompt": [5] * 200}, 400, "the prompt has 200 tokens"),
    ("max_tokens a string", {**GOOD, "max_tokens": "4"}, 400, "'max_tokens' must be an integer"),
    ("max_tokens a bool", {**GOOD, "max_tokens": True}, 400, "'max_tokens' must be an integer"),
    ("n zero", {**GOOD, "n": 0}, 400, "'n' must be >= 1"),
    ("n above max_num_seqs", {**GOOD, "n": 10**6}, 400, "'n' must be <="),
    ("temperature a string", {**GOOD, "temperature": "hot"}, 400, "'temperature' must be a number"),
    ("negative temperature", {**GOOD, "temperature": -1}, 400, "'temperature' must be >= 0"),
    ("top_p zero", {**GOOD, "top_p": 0}, 400, "'top_p' must be > 0"),
    ("top_k below -1", {**GOOD, "top_k": -3}, 400, "'top_k' must be >= -1"),
    ("seed a float", {**GOOD, "seed": 1.5}, 400, "'seed' must be an integer"),
    ("stop a number", {**GOOD, "stop": 5}, 400, "'stop' must be a string or a list"),
    ("stop token outside vocab", {**GOOD, "stop_token_ids": [10**6]}, 400, "'stop_token_ids' has ids outside"),
    ("logprobs too many", {**GOOD, "logprobs": 50}, 400, "'logprobs' must be <= 20"),
    ("logprobs a bool", {**GOOD, "logprobs": True}, 400, "'logprobs' must be an integer"),
    ("echo", {**GOOD, "echo": True}, 400, "'echo' is not supported"),
    ("beam search", {**GOOD, "use_beam_search": True}, 400, "not supported"),
    ("presence penalty", {**GOOD, "presence_penalty": 0.5}, 400, "'presence_penalty' is not supported"),
    ("stream not a bool", {**GOOD, "stream": "yes"}, 400, "'stream' must be true or false"),
    ("stream_options without stream", {**GOOD, "stream_options": {"include_usage": True}}, 400, "only be set"),
]

BAD_CHAT = [
    ("no messages", {"model": MODEL}, 400, "'messages' must be a non-empty list"),
    ("bad role", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role must be one of"),
    ("content not text", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, "content must be"),
    ("top_logprobs without logprobs", {"model": MODEL, "messages": [{"role": "user", "content": "1"}],
                                       "top_logprobs": 2}, 400, "needs 'logprobs': true"),
    ("unknown chat model", {"model": "x", "messages": [{"role": "user", "content": "1"}]}, 404, "does not exist"),
]


def _check_error(r, status, fragment):
    assert r.status == status, (r.status, r.raw[:300])
    err = r.body["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == status
    assert fragment in err["message"], err["message"]
    assert "\n" not in err["message"]


@pytest.mark.parametrize("case", BAD_COMPLETIONS + BAD_CHAT, ids=lambda c: c[0])
def test_bad_request_gets_4xx_and_server_keeps_serving(server, case):
    _, body, status, fragment = case
    path = "/v1/chat/completions" if case in BAD_CHAT else "/v1/completions"
    before = post(server, "/v1/completions", GOOD)
    assert before.status == 200 and before.body["usage"]["completion_tokens"] >= 1, before.raw[:300]
    r = post(server, path, None, raw=body) if isinstance(body, bytes) else post(server, path, body)
    _check_error(r, status, fragment)
    ok = post(server, "/v1/completions", GOOD)  # seeded: the same answer as before the bad request
    assert ok.status == 200 and ok.body["choices"] == before.body["choices"], (ok.raw[:300], before.raw[:300])


def test_routes_methods_and_body_limits(server):
    _check_error(request(server.url + "/v1/nothing"), 404, "no route")
    _check_error(request(server.url + "/v1/completions"), 405, "not allowed")
    # A body over the 32 MiB limit is refused from its Content-Length, before it is read.
    host, port = server.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 40000000\r\n\r\n{")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413") and b"exceeds the limit" in reply
    assert post(server, "/v1/completions", GOOD).status == 200


def test_admin_auth_and_weight_reload(server, llm, char_ckpt, other_ckpt):
    sp = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 10, "temperature": 0, "ignore_eos": True,
          "return_token_ids": True}
    before = post(server, "/v1/completions", sp).body
    v0 = request(server.url + "/health").body["weight_version"]
    path = {"path": str(other_ckpt)}
    _check_error(post(server, "/admin/load_weights", path), 401, "missing admin key")
    _check_error(post(server, "/admin/load_weights", path, headers={"Authorization": "Bearer nope"}), 401,
                 "invalid admin key")
    _check_error(post(server, "/update_weights_from_disk", {"model_path": str(other_ckpt)},
                      headers={"Authorization": "Bearer nope"}), 401, "invalid admin key")
    assert request(server.url + "/health").body["weight_version"] == v0
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    _check_error(post(server, "/admin/load_weights", {"path": "/no/such/dir"}, headers=auth), 400, "not found")
    r = post(server, "/admin/load_weights", path, headers=auth)
    assert r.status == 200 and r.body["weight_version"] == v0 + 1, r.body
    after = post(server, "/v1/completions", sp).body
    ref = LLM(other_ckpt, block_size=4, max_model_len=128).generate(
        [[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].outputs[0]
    assert after["choices"][0]["token_ids"] == ref.token_ids != before["choices"][0]["token_ids"]
    assert after["weight_version"] == v0 + 1 and set(after["choices"][0]["weight_versions"]) == {v0 + 1}
    # SGLang's route name loads a directory; vLLM's reload_weights reloads the served directory.
    r = post(server, "/update_weights_from_disk", {"model_path": str(char_ckpt)}, headers=auth)
    assert r.status == 200 and r.body["success"] is True and r.body["weight_version"] == v0 + 2
    assert post(server, "/v1/completions", sp).body["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]
    r = post(server, "/collective_rpc", {"method": "reload_weights"}, headers=auth)
    assert r.status == 200 and r.body["weight_version"] == v0 + 3
    _check_error(post(server, "/collective_rpc", {"method": "rm_rf"}, headers=auth), 400, "reload_weights")
    # A checkpoint of another shape is refused and the old weights keep serving.
    r = post(server, "/admin/load_weights", None, raw=b"not safetensors",
             headers={**auth, "Content-Type": "application/octet-stream"})
    _check_error(r, 400, "not a valid safetensors")
    assert post(server, "/v1/completions", sp).body["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]


def test_admin_routes_off_without_a_key(char_ckpt):
    srv = start_server(char_ckpt, admin_key=None)
    try:
        r = post(srv, "/admin/load_weights", {"path": str(char_ckpt)}, headers={"Authorization": "Bearer x"})
        _check_error(r, 403, "admin routes are disabled")
    finally:
        srv.shutdown(drain_s=0.0)


def _raw_post(srv, body: dict) -> socket.socket:
    host, port = srv.url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _wait_idle(srv, timeout=10.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if srv.worker.num_requests == 0 and not srv.engine.has_unfinished():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"requests still running after {timeout}s: {srv.worker.num_requests}")


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_its_request(server, stream, monkeypatch):
    real_step = server.engine.step

    def slow_step():  # 120 steps take >= 0.6 s, far longer than noticing the hang-up (polled every 0.1 s)
        time.sleep(0.005)
        return real_step()

    monkeypatch.setattr(server.engine, "step", slow_step)
    long = {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 120, "ignore_eos": True, "stream": stream}
    s = _raw_post(server, long)
    t0 = time.monotonic()
    while server.worker.num_requests == 0 and time.monotonic() - t0 < 5:
        time.sleep(0.005)
    assert server.worker.num_requests == 1
    steps0 = server.worker.steps
    if stream:
        s.recv(256)  # the stream has started
    s.close()
    _wait_idle(server)
    assert server.worker.steps - steps0 < 110  # aborted early, not run to 120 tokens
    assert post(server, "/v1/completions", GOOD).status == 200


def test_64_concurrent_clients(server):
    n_clients, max_tokens = 64, 24
    errors: list[str] = []
    lat: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    steps0, dec0 = server.engine.stats.steps - server.engine.stats.prefill_steps, server.engine.stats.decode_tokens

    def client(i: int) -> None:
        body = {"model": MODEL, "prompt": [5 + i % 20, 6, 7], "max_tokens": max_tokens, "seed": i,
                "ignore_eos": True, "logprobs": 1}
        t = time.perf_counter()
        r = post(server, "/v1/completions", body)
        dt = time.perf_counter() - t
        with lock:
            if r.status != 200:
                errors.append(f"{r.status} {r.raw[:100]!r}")
            else:
                lat.append(dt)
                tokens[0] += r.body["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as ex:
        list(ex.map(client, range(n_clients)))
    wall = time.perf_counter() - t0
    assert not errors, errors[:3]
    assert tokens[0] == n_clients * max_tokens
    lat.sort()
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    st = server.engine.stats
    decode_steps = st.steps - st.prefill_steps - steps0
    batch = (st.decode_tokens - dec0) / max(decode_steps, 1)
    print(f"\n64 clients: p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, {tokens[0] / wall:.0f} tokens/s "
          f"({tokens[0]} tokens in {wall:.2f}s), mean decode batch {batch:.1f}")
    assert batch > 4, "concurrent clients must share the continuous batch (one at a time would be 1)"


def test_cli_serves_and_stops_on_sigterm(char_ckpt):
    env = {**os.environ, "ROLLWISE_ADMIN_KEY": "k"}
    proc = subprocess.Popen([ROLLWISE, "serve", "--model", str(char_ckpt),
                             "--port", "0", "--served-model-name", MODEL, "--max-model-len", "64"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stderr.readline()
        assert "on http://" in line and "admin routes on" in line, line
        url = line.split(" on ")[1].split()[0]
        r = request(url + "/v1/completions", "POST", GOOD)
        assert r.status == 200 and r.body["choices"][0]["finish_reason"] in ("stop", "length")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert "SIGTERM, shutting down" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    bad = subprocess.run([ROLLWISE, "serve", "--model", "/no/such/dir"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not a directory" in bad.stderr and "Traceback" not in bad.stderr


def test_engine_limits_and_engine_errors_do_not_stop_the_server(char_ckpt):
    srv = start_server(char_ckpt, num_kv_blocks=6)  # 6 blocks x 4 tokens: a 30-token prompt can never fit
    try:
        _check_error(post(srv, "/v1/completions", {**GOOD, "prompt": [5] * 30}), 400, "needs 8 KV-cache blocks")
        assert post(srv, "/v1/completions", GOOD).status == 200
        # An engine failure mid-step answers the requests in flight with a 500 and the next request works.
        real_step = srv.engine.step
        calls = {"n": 0}

        def flaky_step():
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("simulated kernel failure")
            return real_step()

        srv.engine.step = flaky_step
        _check_error(post(srv, "/v1/completions", GOOD), 500, "engine error: RuntimeError: simulated kernel failure")
        assert srv.worker.errors == 1 and not srv.engine.has_unfinished()
        ok = post(srv, "/v1/completions", {**GOOD, "max_tokens": 3, "ignore_eos": True})
        assert ok.status == 200 and ok.body["usage"]["completion_tokens"] == 3
        assert request(srv.url + "/health").body["engine_errors"] == 1
    finally:
        srv.shutdown(drain_s=0.0)


# ------------------------------------------------------------------ hostile connections (issue 12)
# A server with tight limits, so each attack resolves in about a second.

def _limits(**kw):
    from rollwise.serve.conn import ConnLimits

    base = dict(header_timeout_s=0.5, body_timeout_s=0.5, min_body_rate_mb_s=200.0, write_timeout_s=2.0,
                max_connections=16, max_buffered_mb=8.0)
    return ConnLimits(**{**base, **kw})


@pytest.fixture(scope="module")
def tight(char_ckpt):
    srv = start_server(char_ckpt, serve={"limits": _limits()})
    yield srv
    srv.shutdown(drain_s=0.0)


def _addr(srv):
    host, port = srv.url.split("//")[1].split(":")
    return host, int(port)


def _read_reply(s: socket.socket, timeout: float = 5.0) -> tuple[int | None, dict, bytes]:
    """(status, headers, body) of one response, or (None, {}, b"") when the server closed without one."""
    s.settimeout(timeout)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        if b"\r\n\r\n" not in data:
            return None, {}, data
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
        n = int(headers.get("content-length", 0))
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body
    except (ConnectionResetError, BrokenPipeError):
        return None, {}, data


def _raw(srv, data: bytes, timeout: float = 5.0):
    with socket.create_connection(_addr(srv), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (ConnectionResetError, BrokenPipeError):
            pass
        return _read_reply(s, timeout)


def _json_error(reply, status, fragment):
    code, headers, body = reply
    assert code == status, (code, body[:300])
    assert headers["content-type"] == "application/json", headers
    err = json.loads(body)["error"]
    assert err["code"] == status and fragment in err["message"] and "\n" not in err["message"], err
    return err


def _health_ok(srv, within: float = 2.0) -> float:
    t0 = time.monotonic()
    r = request(srv.url + "/health", timeout=within)
    assert r.status == 200, r.raw[:200]
    return time.monotonic() - t0


def test_deeply_nested_json_is_a_400_not_a_500(tight):
    for depth in (100_000, 65):
        body = b'{"model": "tiny", "prompt": [5], "user": ' + b"[" * depth + b"]" * depth + b"}"
        r = post(tight, "/v1/completions", None, raw=body)
        _check_error(r, 400, "nested deeper than 64 levels")
    shallow = {**GOOD, "user": json.loads("[" * 60 + "]" * 60)}  # unknown fields are ignored, as in vLLM
    assert post(tight, "/v1/completions", shallow).status == 200


@pytest.mark.parametrize("data, status, fragment", [
    (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "request line is longer than 8192"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n", 431, "headers"),
    (b"GET /health HTTP/1.1\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n", 431, "more than 65536 bytes"),
    (b"GET /health HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"y" * 2000) for i in range(90)) + b"\r\n", 431,
     "request head is larger than 65536 bytes"),
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", 501, "unsupported method 'BREW'"),
    (b"this is not http\r\n\r\n", 400, "Bad request"),
    (b"GET /health HTTP/9.0\r\n\r\n", 505, "HTTP"),
], ids=["414", "431-count", "431-line", "431-total", "501", "400", "505"])
def test_protocol_errors_are_openai_json(tight, data, status, fragment):
    _json_error(_raw(tight, data), status, fragment)
    _health_ok(tight)


def test_slow_loris_is_cut_off_and_threads_stay_bounded(tight):
    """100 clients trickle a request head a byte at a time: the server drops each after header_timeout_s,
    never holds more than max_connections of them, and /health answers throughout."""
    base_threads = threading.active_count()
    socks = []
    for _ in range(100):
        s = socket.create_connection(_addr(tight), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\n")
        socks.append(s)
    peak = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5:
        for s in socks:
            try:
                s.send(b"X")
            except OSError:
                pass
        peak = max(peak, threading.active_count() - base_threads, len(tight._httpd.conns))
        assert _health_ok(tight, within=2.0) < 1.0
        time.sleep(0.1)
    # The cap of 16, plus slack for the /health probe and evicted threads still on their way out (100 without a cap).
    assert peak <= 24, peak
    closed = 0
    for s in socks:
        code, _, body = _read_reply(s, timeout=2.0)
        assert code in (None, 408), (code, body[:200])
        closed += 1
        s.close()
    assert closed == 100
    t1 = time.monotonic()
    while len(tight._httpd.conns) and time.monotonic() - t1 < 2:
        time.sleep(0.02)
    assert len(tight._httpd.conns) == 0


def test_slow_head_that_started_gets_408(tight):
    with socket.create_connection(_addr(tight), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        reply = _read_reply(s, timeout=3.0)
    _json_error(reply, 408, "request head did not arrive within 0.5s")
    assert time.monotonic() - t0 < 2.0


def test_stalled_bodies_time_out_and_release_their_bytes(tight):
    """8 clients announce 30 MiB bodies, send 3 MiB and stall: each is answered 408 (or 503 once the 8 MiB
    budget is spent) within a second or so, and no bytes stay held."""
    budget = tight._httpd.budget
    socks = []
    for _ in range(8):
        s = socket.create_connection(_addr(tight), timeout=5)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (30 * 2**20))
        try:
            s.sendall(b" " * (3 * 2**20))
        except OSError:
            pass
        socks.append(s)
    peak = budget.used
    statuses = []
    for s in socks:
        code, headers, body = _read_reply(s, timeout=5.0)
        peak = max(peak, budget.used)
        statuses.append(code)
        if code is not None:
            _json_error((code, headers, body), code, "did not arrive within" if code == 408 else "too many request bytes")
        s.close()
    # None: refused over budget and reset while its 3 MiB were still being sent (the 503 was not read back).
    assert set(statuses) <= {408, 503, None} and 408 in statuses, statuses
    assert peak <= 8 * 2**20
    t0 = time.monotonic()
    while budget.used and time.monotonic() - t0 < 2:
        time.sleep(0.02)
    assert budget.used == 0
    _health_ok(tight)
    assert post(tight, "/v1/completions", GOOD).status == 200


def test_connection_cap_evicts_idle_then_refuses_with_503(char_ckpt):
    srv = start_server(char_ckpt, serve={"limits": _limits(max_connections=4, header_timeout_s=30.0,
                                                           body_timeout_s=30.0)})
    try:
        idle = [socket.create_connection(_addr(srv), timeout=5) for _ in range(10)]  # connect, send nothing
        time.sleep(0.2)
        assert len(srv._httpd.conns) <= 4
        assert _health_ok(srv) < 1.0  # the oldest idle connection made room
        # Four connections busy sending a body are not evictable: a fifth is refused with a JSON 503.
        busy = []
        for _ in range(4):
            s = socket.create_connection(_addr(srv), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
            busy.append(s)
        time.sleep(0.2)
        reply = _raw(srv, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        _json_error(reply, 503, "maximum of connections")
        assert reply[1]["connection"] == "close"
        for s in busy + idle:
            s.close()
        time.sleep(0.2)
        assert _health_ok(srv) < 1.0
        assert srv._httpd.conns.evictions >= 6 and srv._httpd.conns.rejections >= 1
    finally:
        srv.shutdown(drain_s=0.0)


FD_SERVER = r"""
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
sys.path.insert(0, sys.argv[2])
from serve_util import start_server
srv = start_server(sys.argv[1])
print(srv.url, flush=True)
held = []
for line in sys.stdin:
    if line.strip() == "fill":  # use up every descriptor, as a leak elsewhere in the process would
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                break
        print("filled", len(held), flush=True)
    elif line.strip() == "free":
        for fd in held:
            os.close(fd)
        held.clear()
        print("freed", flush=True)
"""


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_descriptor_limit_idle_connections_and_accept_backoff(char_ckpt, tmp_path):
    """At a 256-descriptor limit: 300 idle connections leave /health answering and the CPU idle; with every
    descriptor used up, the accept loop backs off instead of spinning, and recovers when they come back."""
    proc = subprocess.Popen([sys.executable, "-c", FD_SERVER, str(char_ckpt), str(Path(__file__).parent)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    socks: list[socket.socket] = []
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://"), url
        host, port = url.split("//")[1].split(":")
        for _ in range(300):
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        time.sleep(0.5)
        assert request(url + "/health", timeout=3).status == 200
        c0 = _cpu_s(proc.pid)
        time.sleep(1.0)
        assert _cpu_s(proc.pid) - c0 < 0.3, "the server burns CPU while holding idle connections"
        assert request(url + "/health", timeout=3).status == 200
        for s in socks:
            s.close()
        socks.clear()
        time.sleep(0.3)
        proc.stdin.write("fill\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("filled")
        socks = [socket.create_connection((host, int(port)), timeout=5) for _ in range(5)]  # wait in the backlog
        time.sleep(0.3)
        c0 = _cpu_s(proc.pid)
        time.sleep(1.0)
        assert _cpu_s(proc.pid) - c0 < 0.3, "the accept loop spins on EMFILE"
        for s in socks:
            s.close()
        socks.clear()
        proc.stdin.write("free\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("freed")
        assert request(url + "/health", timeout=5).status == 200
    finally:
        for s in socks:
            s.close()
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("flag, value", [("--header-timeout", "0"), ("--body-timeout", "-1"),
                                         ("--write-timeout", "inf"), ("--max-buffered-mb", "nan"),
                                         ("--max-connections", "0")])
def test_cli_refuses_bad_connection_limits(char_ckpt, capsys, flag, value):
    from rollwise.cli.main import main

    assert main(["serve", "--model", str(char_ckpt), flag, value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and flag in err, err
