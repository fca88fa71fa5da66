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
    r = post(server, path, None, raw=body) if isinstance(body, bytes) else post(server, path, body)
    _check_error(r, status, fragment)
    ok = post(server, "/v1/completions", GOOD)
    assert ok.status == 200 and len(ok.body["choices"][0]["text"]) >= 0


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
