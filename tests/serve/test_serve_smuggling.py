"""Request smuggling against `rollwise serve`, over raw sockets: each attack hides a second request where a proxy in
front of the server would see body bytes, and checks that the hidden request is never executed.

The hidden request is an authenticated weight reload that sets weight_version to 4242 (the served weights, so a
failure does not change the model for the other tests): if the server ever parses it as a request of its own,
/health reports version 4242 and a second response comes back on the socket.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from serve_util import ADMIN_KEY, request, start_server

HIDDEN_VERSION = 4242


@pytest.fixture(scope="module")
def srv(char_ckpt):
    from rollwise.serve.conn import ConnLimits

    limits = ConnLimits(header_timeout_s=0.5, body_timeout_s=1.0, min_body_rate_mb_s=200.0, write_timeout_s=2.0)
    s = start_server(char_ckpt, serve={"limits": limits})
    yield s
    s.shutdown(drain_s=0.0)


@pytest.fixture(autouse=True)
def _fresh_version(srv, char_ckpt):
    """Each attack starts at weight_version 0, whatever an earlier one did."""
    from serve_util import post

    r = post(srv, "/admin/load_weights", {"path": str(char_ckpt), "weight_version": 0},
             headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status == 200 and r.body["weight_version"] == 0, r.raw[:300]


def _hidden(ckpt) -> bytes:
    body = json.dumps({"path": str(ckpt), "weight_version": HIDDEN_VERSION}).encode()
    return (b"POST /admin/load_weights HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + ADMIN_KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def _addr(srv) -> tuple[str, int]:
    host, port = srv.url.split("//")[1].split(":")
    return host, int(port)


def _responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Every complete HTTP response in `data`, in order: (status, lower-cased headers, body)."""
    out = []
    while b"\r\n\r\n" in data:
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
        n = int(headers.get("content-length", 0))
        out.append((int(lines[0].split()[1]), headers, rest[:n]))
        data = rest[n:]
    return out


def _exchange(srv, data: bytes, timeout: float = 10.0) -> tuple[list[tuple[int, dict[str, str], bytes]], bytes]:
    """Send `data` on one connection and read until the server closes it (it closes an idle keep-alive after
    header_timeout_s): the responses, and the raw bytes."""
    got = b""
    with socket.create_connection(_addr(srv), timeout=timeout) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
    return _responses(got), got


def _version(srv) -> int:
    return request(srv.url + "/health").body["weight_version"]


def _attacks(ckpt) -> list[tuple[str, bytes, int]]:
    hidden = _hidden(ckpt)
    post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    size = b"%x\r\n" % len(hidden)
    return [
        # TE.CL: a proxy that frames by Transfer-Encoding forwards one request whose chunk is the hidden one; a
        # server that frames by Content-Length reads 4 bytes and parses the chunk as a request of its own.
        ("te-cl", post + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(size) + size + hidden
         + b"\r\n0\r\n\r\n", 400),
        # CL.TE: the other order (a server that framed by Transfer-Encoding would run the hidden request).
        ("cl-te", post + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % (5 + len(hidden))
         + b"0\r\n\r\n" + hidden, 400),
        ("te-cl-obfuscated", post + b"Content-Length: %d\r\nTransfer-Encoding: xchunked\r\n\r\n" % len(size) + size
         + hidden + b"\r\n0\r\n\r\n", 400),
        # Two Content-Lengths: a proxy that takes the last forwards `{}` + hidden as one body.
        ("cl-cl", post + b"Content-Length: 2\r\nContent-Length: %d\r\n\r\n{}" % (2 + len(hidden)) + hidden, 400),
        ("cl-list", post + b"Content-Length: 2, %d\r\n\r\n{}" % (2 + len(hidden)) + hidden, 400),
        # Values Python's int() reads as 2 and a strict proxy does not.
        ("cl-plus", post + b"Content-Length: +2\r\n\r\n{}" + hidden, 400),
        ("cl-underscore", post + b"Content-Length: 0_2\r\n\r\n{}" + hidden, 400),
        ("cl-folded", post + b"Content-Length:\r\n 2\r\n\r\n{}" + hidden, 400),
        # Whitespace before the colon: the stdlib parser drops every header from there on (a body of 0 bytes)
        # where a lenient proxy reads Content-Length and forwards the hidden request as the body.
        ("cl-space-colon", post + b"Content-Length : %d\r\n\r\n" % len(hidden) + hidden, 400),
        # A bare CR splits one header line into two for the stdlib and not for a proxy.
        ("bare-cr", post + b"X-Note: a\rContent-Length: %d\r\n\r\n" % len(hidden) + hidden, 400),
        # Transfer-Encoding alone: chunked bodies are not decoded (411, close), so the chunk is never parsed.
        ("te-only", post + b"Transfer-Encoding: chunked\r\n\r\n" + size + hidden + b"\r\n0\r\n\r\n", 411),
        ("te-gzip", post + b"Transfer-Encoding: gzip\r\n\r\n" + hidden, 501),
        # Bodies a route does not read are still framed: they are read and dropped, not parsed as a request.
        ("get-with-body", b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(hidden) + hidden, 200),
        ("404-with-body", b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(hidden) + hidden, 404),
        ("401-with-body", b"POST /admin/load_weights HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(hidden)
         + hidden, 401),
    ]


_IDS = ["te-cl", "cl-te", "te-cl-obfuscated", "cl-cl", "cl-list", "cl-plus", "cl-underscore", "cl-folded",
        "cl-space-colon", "bare-cr", "te-only", "te-gzip", "get-with-body", "404-with-body", "401-with-body"]


@pytest.mark.parametrize("name", _IDS)
def test_a_request_hidden_in_a_body_is_never_executed(srv, char_ckpt, name):
    attacks = {n: (data, status) for n, data, status in _attacks(char_ckpt)}
    assert set(attacks) == set(_IDS)
    data, status = attacks[name]
    v0 = _version(srv)
    replies, raw = _exchange(srv, data)
    statuses = [r[0] for r in replies]
    assert statuses == [status], (statuses, raw[:600])
    assert _version(srv) == v0, "the hidden weight reload was executed"
    if status >= 400:
        err = json.loads(replies[0][2])["error"]
        assert err["code"] == status and "\n" not in err["message"]
    if status in (400, 411, 501):  # an ambiguous stream cannot be trusted: closed after the answer
        assert replies[0][1].get("connection") == "close"
    assert _version(srv) == v0 and request(srv.url + "/health").status == 200


def test_framing_errors_name_the_problem(srv, char_ckpt):
    post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    cases = [
        (post + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", "both Content-Length and Transfer-Encoding"),
        (post + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", "more than one Content-Length"),
        (post + b"Content-Length: 2x\r\n\r\n{}", "Content-Length must be a decimal number"),
        (post + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "send Content-Length"),
        (post + b"Content-Length : 2\r\n\r\n{}", "header line"),
    ]
    for data, fragment in cases:
        replies, raw = _exchange(srv, data)
        assert len(replies) == 1, raw[:400]
        msg = json.loads(replies[0][2])["error"]["message"]
        assert fragment in msg, msg


def test_expect_continue_is_not_granted_to_an_ambiguous_request(srv, char_ckpt):
    """A client that waits for 100 Continue before sending an ambiguous body gets the 400 instead."""
    data = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    replies, raw = _exchange(srv, data)
    assert b"100 Continue" not in raw and [r[0] for r in replies] == [400], raw[:400]


def test_framed_requests_still_pipeline_on_one_connection(srv, char_ckpt):
    """The cure must not break HTTP/1.1: back-to-back requests on one connection, a GET with a body among them,
    all get their answers, in order."""
    body = json.dumps({"model": "tiny", "prompt": [5, 6], "max_tokens": 2, "temperature": 0}).encode()
    comp = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" \
        % len(body) + body
    get_body = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\nignored"
    health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    replies, raw = _exchange(srv, comp + get_body + health + comp)
    assert [r[0] for r in replies] == [200, 200, 200, 200], raw[:600]
    assert json.loads(replies[1][2])["object"] == "list" and "weight_version" in json.loads(replies[2][2])
    assert json.loads(replies[0][2])["choices"] == json.loads(replies[3][2])["choices"]


# ------------------------------------------------------------------ the framing rules as a pure function

def _head(lines: list[bytes]):
    import http.client
    import io

    return http.client.parse_headers(io.BytesIO(b"".join(lines) + b"\r\n"))


@pytest.mark.parametrize("lines, length", [
    ([], 0),
    ([b"Content-Length: 0\r\n"], 0),
    ([b"Content-Length: 17\r\n"], 17),
    ([b"content-length:17 \r\n"], 17),
    ([b"Content-Length:\t17\t\r\n", b"X: y\n"], 17),
])
def test_body_length_of_well_framed_heads(lines, length):
    from rollwise.serve.framing import body_length, check_head_lines

    check_head_lines(lines)
    assert body_length(_head(lines)) == length


@pytest.mark.parametrize("lines, status", [
    ([b"Content-Length: 1\r\n", b"Content-Length: 1\r\n"], 400),
    ([b"Content-Length: 1\r\n", b"Transfer-Encoding: identity\r\n"], 400),
    ([b"Content-Length: -1\r\n"], 400),
    ([b"Content-Length: \xd9\xa5\r\n"], 400),  # an Arabic-Indic digit five: int() reads it, HTTP does not
    ([b"Content-Length: " + b"9" * 20 + b"\r\n"], 400),
    ([b"Content-Length: \r\n"], 400),
    ([b"Transfer-Encoding: chunked\r\n"], 411),
    ([b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: chunked\r\n"], 411),
    ([b"Transfer-Encoding: gzip, chunked\r\n"], 501),
])
def test_body_length_refuses_ambiguous_framing(lines, status):
    from rollwise.serve.framing import FramingError, body_length

    with pytest.raises(FramingError) as e:
        body_length(_head(lines))
    assert e.value.status == status and "\n" not in e.value.message


@pytest.mark.parametrize("line", [
    b"Content-Length : 5\r\n", b"Content Length: 5\r\n", b" Content-Length: 5\r\n", b"\tX: folded\r\n",
    b"X: a\rContent-Length: 5\r\n", b"X: a\x00b\r\n", b"X\x7f: 1\r\n", b": no name\r\n", b"no colon\r\n",
    b"X: a\x0bb\r\n",
])
def test_check_head_lines_refuses_lines_parsers_disagree_on(line):
    from rollwise.serve.framing import FramingError, check_head_lines

    with pytest.raises(FramingError) as e:
        check_head_lines([b"Host: x\r\n", line])
    assert e.value.status == 400
