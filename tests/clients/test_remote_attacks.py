"""A remote engine's answer is not trusted: each test is a hostile or broken server's response, refused with one
line naming the server and the field (never a traceback from deep inside, never training on it)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from fake_server import FakeServer, choice

from rollwise.clients.remote import RemoteEngine, RemoteEngineError
from rollwise.types import SamplingParams

SP = SamplingParams(n=2, max_tokens=6, seed=0)


class CharTok:
    """Decodes id i as chr(ord('a') + i % 26): enough to tell rollwise's text from the server's."""

    def __len__(self) -> int:
        return 97

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) - ord("a") for c in text]


def _engine_answering(answer) -> tuple[FakeServer, RemoteEngine]:
    srv = FakeServer(completion=lambda body: answer).start()
    return srv, RemoteEngine(srv.url, backend="vllm", tokenizer=CharTok(), timeout_s=5)


GOOD = [choice(0, [3, 4]), choice(1, [5])]


@pytest.mark.parametrize("bad,match", [
    ({"choices": [choice(0, ["3", "4"]), choice(1, [5])]}, r"token_ids' holds '3', not an integer"),
    ({"choices": [choice(0, [3, 120]), choice(1, [5])]}, r"token id 120 is outside the vocabulary \[0, 97\)"),
    ({"choices": [choice(0, [3, -1]), choice(1, [5])]}, r"token id -1 is outside the vocabulary"),
    ({"choices": [choice(0, [3, 4], [None, -0.1]), choice(1, [5])]}, r"token_logprobs holds None, not a number"),
    ({"choices": [choice(0, [3, 4], [0.7, -0.1]), choice(1, [5])]}, r"token_logprobs holds 0.7: a log-prob is finite and <= 0"),
    ({"choices": [choice(0, [3, 4], [float("nan"), -0.1]), choice(1, [5])]}, r"token_logprobs holds nan"),
    ({"choices": [choice(0, [3] * 3005), choice(1, [5])]}, r"3005 tokens for max_tokens=6"),
    ({"choices": [dict(choice(0, [3, 4]), weight_versions=[1_000_000, 0]), choice(1, [5])]},
     r"weight version 1000000 was never loaded through this client"),
    ({"choices": [choice(0, [3, 4]), choice(1, [5])], "weight_version": 1_000_000}, r"weight version 1000000"),
    ({"choices": [choice(0, [3, 4])]}, r"1 choices for n=2"),
    ({"choices": [choice(0, [3, 4]), choice(0, [5])]}, r"repeated index 0"),
    ({"choices": [choice(0, [3, 4], [-0.1]), choice(1, [5])]}, r"2 token ids but 1 log-probs"),
    ({"choices": "many"}, r"no 'choices' list"),
    ({"choices": [dict(choice(0, [3]), finish_reason="exploded"), choice(1, [5])]}, r"finish_reason is 'exploded'"),
])
def test_bad_response_is_refused_with_the_field(bad, match):
    srv, eng = _engine_answering(bad)
    try:
        with pytest.raises(RemoteEngineError, match=match) as e:
            eng.generate([[1, 2, 3]], SP)
        assert srv.url in str(e.value) and "\n" not in str(e.value)
    finally:
        srv.stop()


def test_text_is_decoded_from_the_token_ids_never_taken_from_the_server():
    # The server says the answer is "42" while its token ids spell something else: the reward sees the ids' text,
    # and the disagreement is counted.
    srv, eng = _engine_answering({"choices": [choice(0, [3, 4], text="42"), choice(1, [5], text="f")]})
    try:
        out = eng.generate([[1, 2, 3]], SP)[0]
        assert [o.text for o in out.outputs] == ["de", "f"]
        assert out.outputs[0].token_ids == [3, 4] and out.outputs[0].weight_versions == [0, 0]
        assert eng.counters() == {"text_mismatch": 1}
    finally:
        srv.stop()


def test_a_server_whose_text_keeps_disagreeing_with_its_ids_is_refused_with_one_line():
    srv, eng = _engine_answering({"choices": [choice(0, [3, 4], text="42"), choice(1, [5], text="42")]})
    try:
        with pytest.raises(RemoteEngineError, match=r"the text of 32 of the server's 32 samples disagrees with their "
                                                    r"token ids") as e:
            for _ in range(16):
                eng.generate([[1, 2, 3]], SP)
        assert srv.url in str(e.value) and "\n" not in str(e.value)
    finally:
        srv.stop()


def test_an_honest_detokenizers_spacing_and_a_held_back_character_are_not_disagreements():
    srv, eng = _engine_answering({"choices": [choice(0, [3, 4], text=" d e"), choice(1, [5], text="f\ufffd")]})
    try:
        for _ in range(20):
            eng.generate([[1, 2, 3]], SP)
        assert eng.counters() == {"text_mismatch": 0}
    finally:
        srv.stop()


def test_a_streamed_text_that_disagrees_with_its_ids_is_counted_and_refused():
    srv = FakeServer(stream_tokens=lambda b: [[9, 9, 9]] * int(b["n"]), stream_text=lambda t: "7").start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", tokenizer=CharTok(), timeout_s=5)
        se = eng.stepwise()
        with pytest.raises(RemoteEngineError, match=r"\(stream\): the text of 32 of the server's 32 samples") as e:
            for k in range(8):
                se.add_request(f"r{k}", [1, 2], SamplingParams(n=4, max_tokens=3))
                while se.has_unfinished():
                    se.step()
                assert eng.counters()["text_mismatch"] == 4 * (k + 1)
        assert srv.url in str(e.value)
    finally:
        srv.stop()


def test_the_admin_key_goes_to_the_weight_sync_routes_only(tmp_path):
    """Whoever answers on the URL sees every completion request: the admin key must not ride along with them."""
    import torch

    srv = FakeServer().start()
    try:
        eng = RemoteEngine(srv.url, api_key="s3cret", backend="vllm", tokenizer=CharTok(), timeout_s=5,
                           weights_dir=tmp_path)
        eng.generate([[1, 2, 3]], SP)
        se = eng.stepwise()
        se.add_request("r", [1, 2], SamplingParams(n=1, max_tokens=3))
        while se.has_unfinished():
            se.step()
        eng.health()
        eng.load_weights({"model.norm.weight": torch.ones(3)}, version=1)
        keyed = {p.split("?")[0] for p, a in srv.auth if a == "Bearer s3cret"}
        bare = {p.split("?")[0] for p, a in srv.auth if a is None}
        assert keyed == {"/collective_rpc", "/pause", "/reset_prefix_cache", "/update_weight_version", "/resume",
                         "/weight_info"}
        assert bare == {"/v1/models", "/v1/completions", "/health"}
    finally:
        srv.stop()


def test_a_response_that_drips_forever_is_cut_at_the_total_deadline():
    # Headers, then one body byte every 0.2 s: every read succeeds, so a per-read timeout never fires.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            c.recv(65536)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            try:
                while not stop.is_set():
                    c.sendall(b" ")
                    time.sleep(0.2)
            except OSError:
                pass
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        eng = RemoteEngine(f"http://127.0.0.1:{port}", model="m", timeout_s=1.5)
        t0 = time.monotonic()
        with pytest.raises(RemoteEngineError, match="timed out after 1.5s"):
            eng.generate([[1, 2]], SamplingParams(max_tokens=4))
        assert time.monotonic() - t0 < 4.0
    finally:
        stop.set()
        lsock.close()


def test_a_stream_that_never_stops_is_cut_at_max_tokens():
    srv = FakeServer(stream_tokens=lambda b: [[9] * 50]).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", tokenizer=CharTok(), timeout_s=5)
        se = eng.stepwise()
        se.add_request("r", [1, 2], SamplingParams(n=1, max_tokens=6))
        with pytest.raises(RemoteEngineError, match="7 tokens for max_tokens=6"):
            while se.has_unfinished():
                se.step()
    finally:
        srv.stop()


DEEP = b"[" * 100_000 + b"]" * 100_000  # past the JSON parser's stack
NESTED_ERROR = b'{"error": {"message": ' + b"[" * 900 + b"]" * 900 + b"}}"  # parses, but str() of it recurses


@pytest.mark.parametrize("body", [DEEP, b'{"choices": ' + DEEP + b"}", NESTED_ERROR], ids=["deep", "in-choices",
                                                                                          "error-message"])
def test_a_reply_nested_past_the_stack_is_one_line_naming_the_server(body):
    srv = FakeServer(routes={"/v1/completions": lambda p, b: (500 if body is NESTED_ERROR else 200, body)}).start()
    try:
        eng = RemoteEngine(srv.url, backend="vllm", tokenizer=CharTok(), timeout_s=5)
        with pytest.raises(RemoteEngineError, match=r"v1/completions: an answer nested deeper than 64 levels") as e:
            eng.generate([[1, 2, 3]], SP)
        assert srv.url in str(e.value) and "\n" not in str(e.value)
    finally:
        srv.stop()


@pytest.mark.parametrize("event", [DEEP, b'{"error": ' + b"[" * 900 + b"]" * 900 + b"}"], ids=["deep", "error"])
def test_a_streamed_event_nested_past_the_stack_is_one_line_naming_the_server(event):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)

    def serve() -> None:
        c, _ = lsock.accept()
        got = b""
        while b"\r\n\r\n" not in got:  # the whole request, so closing sends no reset that could drop the answer
            got += c.recv(65536)
        head, _, body = got.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                  b"data: " + event + b"\n\n")
        c.shutdown(socket.SHUT_WR)
        c.settimeout(5)
        try:
            while c.recv(65536):
                pass
        except OSError:
            pass
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
    try:
        eng = RemoteEngine(url, model="m", backend="vllm", tokenizer=CharTok(), timeout_s=5)
        se = eng.stepwise()
        se.add_request("r", [1, 2], SamplingParams(n=1, max_tokens=3))
        with pytest.raises(RemoteEngineError, match=r"\(stream\): .*an answer nested deeper than 64 levels") as e:
            while se.has_unfinished():
                se.step()
        assert url in str(e.value) and "\n" not in str(e.value)
    finally:
        lsock.close()
