"""The requests RemoteEngine sends and the responses rollwise serve returns, checked against the field sets of
vLLM's OpenAI-compatible server (vllm/entrypoints/openai/protocol.py: CompletionRequest, CompletionResponse,
CompletionResponseChoice, CompletionLogProbs, CompletionStreamResponse, ChatCompletionResponse, ModelCard,
ErrorInfo, UsageInfo; plus the later `return_token_ids` request field with choice `token_ids` and
`prompt_token_ids`). Written down here by hand so a drift on either side fails a test.

rollwise's own additions are listed in ROLLWISE_EXTRAS and documented in docs/serve.md.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rollwise import SamplingParams
from rollwise.clients.remote import RemoteEngine
from serve_util import MODEL, post, request, sse_events

VLLM_COMPLETION_REQUEST = {
    # OpenAI fields
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
    # vLLM sampling params
    "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "allowed_token_ids", "prompt_logprobs", "prompt_embeds",
    # vLLM extra params
    "add_special_tokens", "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "guided_decoding_backend", "guided_whitespace_pattern", "priority", "request_id", "logits_processors",
    "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs",
}
REQUEST_TYPES = {  # field -> accepted Python types in JSON (as vLLM's pydantic model declares them)
    "model": (str,), "prompt": (str, list), "n": (int,), "max_tokens": (int,), "temperature": (float, int),
    "top_p": (float, int), "top_k": (int,), "seed": (int,), "stop": (str, list), "stop_token_ids": (list,),
    "ignore_eos": (bool,), "logprobs": (int,), "return_tokens_as_token_ids": (bool,), "return_token_ids": (bool,),
    "add_special_tokens": (bool,), "skip_special_tokens": (bool,), "stream": (bool,),
}
VLLM_COMPLETION_RESPONSE = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                            "usage", "kv_transfer_params"}
VLLM_COMPLETION_CHOICE = {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs",
                          "token_ids", "prompt_token_ids"}
VLLM_COMPLETION_LOGPROBS = {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
VLLM_STREAM_RESPONSE = {"id", "object", "created", "model", "choices", "usage"}
VLLM_STREAM_CHOICE = {"index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids", "prompt_token_ids"}
VLLM_USAGE = {"prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"}
VLLM_CHAT_RESPONSE = {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
                      "prompt_logprobs", "kv_transfer_params"}
VLLM_CHAT_CHOICE = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids"}
VLLM_CHAT_MESSAGE = {"role", "content", "refusal", "annotations", "audio", "function_call", "tool_calls",
                     "reasoning_content"}
VLLM_CHAT_LOGPROB = {"token", "logprob", "bytes", "top_logprobs"}
VLLM_MODEL_CARD = {"id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"}
VLLM_ERROR = {"message", "type", "param", "code"}
ROLLWISE_EXTRAS = {"weight_version", "weight_versions"}
"""Top-level `weight_version` (newest token's weights) and, with return_token_ids, per-token `weight_versions`."""


def _subset(got: dict, allowed: set[str], what: str) -> None:
    extra = set(got) - allowed - ROLLWISE_EXTRAS
    assert not extra, f"{what} has fields vLLM does not document: {sorted(extra)}"


def test_remote_engine_requests_use_vllm_fields():
    eng = RemoteEngine.__new__(RemoteEngine)  # no server needed to build a request body
    eng.model = MODEL
    sps = [SamplingParams(), SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=5, max_tokens=33, seed=-3,
                                            stop=["\n", "##"], stop_token_ids=[2, 7], ignore_eos=True)]
    for sp in sps:
        for prompt in ([1, 2, 3], "text"):
            body = eng.completion_request(prompt, sp)
            assert set(body) <= VLLM_COMPLETION_REQUEST, set(body) - VLLM_COMPLETION_REQUEST
            for k, v in body.items():
                assert isinstance(v, REQUEST_TYPES[k]) and not (isinstance(v, bool) and bool not in REQUEST_TYPES[k]), k
            assert body["return_tokens_as_token_ids"] and body["return_token_ids"] and body["logprobs"] >= 1
            assert json.loads(json.dumps(body)) == body
    body = eng.completion_request([1], sps[1])
    assert body["stop"] == ["\n", "##"] and body["top_k"] == 5 and body["seed"] == -3


def test_server_responses_use_vllm_fields(server):
    base = {"model": MODEL, "prompt": [[5, 6, 7], [8, 9]], "n": 2, "max_tokens": 6, "seed": 1, "logprobs": 2,
            "return_token_ids": True, "stop": ["+"]}
    r = post(server, "/v1/completions", base).body
    _subset(r, VLLM_COMPLETION_RESPONSE, "completion response")
    assert {"id", "object", "created", "model", "choices", "usage"} <= set(r) and r["object"] == "text_completion"
    assert isinstance(r["created"], int) and r["id"].startswith("cmpl-")
    _subset(r["usage"], VLLM_USAGE, "usage")
    for c in r["choices"]:
        _subset(c, VLLM_COMPLETION_CHOICE, "completion choice")
        assert {"index", "text", "logprobs", "finish_reason"} <= set(c)
        assert set(c["logprobs"]) == VLLM_COMPLETION_LOGPROBS
        assert all(isinstance(d, dict) for d in c["logprobs"]["top_logprobs"])
        assert c["finish_reason"] in ("stop", "length", "abort")
    for ev in sse_events(server, "/v1/completions", {**base, "stream": True})[:-1]:
        _subset(ev, VLLM_STREAM_RESPONSE, "stream chunk")
        for c in ev["choices"]:
            _subset(c, VLLM_STREAM_CHOICE, "stream choice")
    chat = post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "1+1"}],
                                                 "max_tokens": 4, "logprobs": True, "top_logprobs": 1}).body
    _subset(chat, VLLM_CHAT_RESPONSE, "chat response")
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    for c in chat["choices"]:
        _subset(c, VLLM_CHAT_CHOICE, "chat choice")
        _subset(c["message"], VLLM_CHAT_MESSAGE, "chat message")
        for e in c["logprobs"]["content"]:
            assert set(e) == VLLM_CHAT_LOGPROB
            for t in e["top_logprobs"]:
                assert set(t) <= VLLM_CHAT_LOGPROB - {"top_logprobs"}
    models = request(server.url + "/v1/models").body
    assert set(models) == {"object", "data"}
    _subset(models["data"][0], VLLM_MODEL_CARD, "model card")
    err = post(server, "/v1/completions", {"model": MODEL}).body
    assert set(err) == {"error"} and set(err["error"]) == VLLM_ERROR and isinstance(err["error"]["code"], int)


class _FakeVLLM(BaseHTTPRequestHandler):
    """Answers like an older vLLM server that knows `return_tokens_as_token_ids` but not `return_token_ids`:
    token ids only inside `logprobs.tokens` as 'token_id:N', and no rollwise extension fields."""

    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def log_message(self, *a) -> None:
        pass

    def _send(self, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B", "object": "model", "created": 0,
                                                "owned_by": "vllm", "root": "/models/qwen", "parent": None,
                                                "max_model_len": 4096, "permission": []}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        choices = []
        for j in range(body["n"]):
            ids = [100 + j, 200 + j, 300]
            choices.append({"index": j, "text": "abc", "finish_reason": "length" if j else "stop",
                            "stop_reason": None, "prompt_logprobs": None,
                            "logprobs": {"text_offset": [0, 1, 2], "tokens": [f"token_id:{t}" for t in ids],
                                         "token_logprobs": [-0.5, -1.25, -2.0],
                                         "top_logprobs": [{f"token_id:{t}": -0.5} for t in ids]}})
        self._send({"id": "cmpl-x", "object": "text_completion", "created": 0, "model": body["model"],
                    "choices": choices, "usage": {"prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6}})


def test_remote_engine_parses_a_plain_vllm_response():
    _FakeVLLM.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FakeVLLM)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        eng = RemoteEngine(f"http://127.0.0.1:{httpd.server_address[1]}", backend="vllm", timeout_s=10)
        assert eng.model == "Qwen/Qwen2.5-0.5B"
        out = eng.generate([[1, 2, 3]], SamplingParams(n=2, max_tokens=3, seed=0))[0]
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert set(_FakeVLLM.seen[0]) <= VLLM_COMPLETION_REQUEST
    assert out.prompt_token_ids == [1, 2, 3]
    assert [o.token_ids for o in out.outputs] == [[100, 200, 300], [101, 201, 300]]
    assert out.outputs[0].logprobs == [-0.5, -1.25, -2.0]
    assert [o.finish_reason for o in out.outputs] == ["stop", "length"]
    assert out.outputs[1].weight_versions == [0, 0, 0]  # vLLM reports none: the client's own count
