"""rollwise serve: completions and chat (plain and streamed) agree with the in-process engine token for token."""

from __future__ import annotations

import pytest

from rollwise import SamplingParams
from rollwise.serve.chat import render_chat
from serve_util import MODEL, post, request, sse_events

TOL = 1e-4  # log-probs: same kernels, but a different batch around the request can move the last bits


def _same(choice_ids, choice_lps, out, text=None, choice_text=None):
    assert choice_ids == out.token_ids
    assert len(choice_lps) == len(out.logprobs)
    assert max((abs(a - b) for a, b in zip(choice_lps, out.logprobs)), default=0.0) < TOL
    if text is not None:
        assert choice_text == text


def test_string_prompt_n_samples_match_llm(server, llm):
    body = {"model": MODEL, "prompt": "12+34=", "n": 3, "max_tokens": 12, "temperature": 1.0, "seed": 5,
            "logprobs": 1, "return_token_ids": True, "add_special_tokens": False}
    r = post(server, "/v1/completions", body)
    assert r.status == 200, r.body
    ref = llm.generate(["12+34="], SamplingParams(n=3, max_tokens=12, seed=5))[0]
    assert r.body["object"] == "text_completion" and r.body["model"] == MODEL
    assert [c["index"] for c in r.body["choices"]] == [0, 1, 2]
    for c, o in zip(r.body["choices"], ref.outputs):
        _same(c["token_ids"], c["logprobs"]["token_logprobs"], o, o.text, c["text"])
        assert c["finish_reason"] == o.finish_reason
        assert c["prompt_token_ids"] == ref.prompt_token_ids
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(lp["text_offset"]) == len(lp["top_logprobs"]) == len(o.token_ids)
        # text_offset: where each token's text starts inside `text`
        for tok, off in zip(lp["tokens"], lp["text_offset"]):
            if tok not in ("<pad>", "<bos>", "<eos>", "<unk>"):
                assert c["text"][off:off + len(tok)] == tok
    u = r.body["usage"]
    assert u["prompt_tokens"] == len(ref.prompt_token_ids)
    assert u["completion_tokens"] == sum(len(o.token_ids) for o in ref.outputs)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert r.body["weight_version"] == 0
    # Two different samples really differ (n>1 is not one sample repeated).
    assert len({tuple(c["token_ids"]) for c in r.body["choices"]}) > 1


def test_token_prompts_and_batches_of_prompts(server, llm):
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    sp = SamplingParams(n=2, max_tokens=10, seed=9, ignore_eos=True)
    ref = llm.generate(prompts, sp)
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 10, "seed": 9,
                                         "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True})
    assert r.status == 200, r.body
    ch = r.body["choices"]
    assert [c["index"] for c in ch] == list(range(6))  # prompt i, sample j -> index i*n + j
    for i, out in enumerate(ref):
        for j, o in enumerate(out.outputs):
            c = ch[i * 2 + j]
            ids = [int(t.split(":")[1]) for t in c["logprobs"]["tokens"]]
            _same(ids, c["logprobs"]["token_logprobs"], o)
            assert c["finish_reason"] == "length" and len(ids) == 10
            assert c["logprobs"]["top_logprobs"] == [None] * 10  # logprobs=0: the sampled token's log-prob only
            assert "token_ids" not in c  # only with return_token_ids
    # A single token-id prompt and a list of strings.
    one = post(server, "/v1/completions", {"model": MODEL, "prompt": prompts[0], "max_tokens": 10, "seed": 9,
                                           "ignore_eos": True, "n": 2})
    assert [c["text"] for c in one.body["choices"]] == [o.text for o in ref[0].outputs]
    two = post(server, "/v1/completions", {"model": MODEL, "prompt": ["1+1=", "2+2="], "max_tokens": 4, "seed": 1})
    assert two.status == 200 and len(two.body["choices"]) == 2


def test_greedy_and_logprobs_absent_unless_asked(server, llm):
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0,
                                         "ignore_eos": True})
    ref = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].outputs[0]
    assert r.body["choices"][0]["text"] == ref.text
    assert r.body["choices"][0]["logprobs"] is None


def test_stop_strings_and_stop_token_ids(server, llm):
    free = llm.generate(["12+34="], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    stop = free.text[3:5]
    ref = llm.generate(["12+34="], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop]))[0]
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "12+34=", "temperature": 0, "max_tokens": 16,
                                         "ignore_eos": True, "stop": stop, "return_token_ids": True,
                                         "add_special_tokens": False})
    c = r.body["choices"][0]
    assert c["text"] == ref.outputs[0].text == free.text[: free.text.find(stop)]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == stop
    assert c["token_ids"] == ref.outputs[0].token_ids
    tok = free.token_ids[2]
    r = post(server, "/v1/completions", {"model": MODEL, "prompt": "12+34=", "temperature": 0, "max_tokens": 16,
                                         "ignore_eos": True, "stop_token_ids": [tok], "return_token_ids": True,
                                         "add_special_tokens": False})
    c = r.body["choices"][0]
    assert c["token_ids"] == free.token_ids[: free.token_ids.index(tok) + 1]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == tok


def _concat_stream(events, n):
    assert events[-1] == "[DONE]"
    text, ids, lps, finish = [""] * n, [[] for _ in range(n)], [[] for _ in range(n)], [None] * n
    for ev in events[:-1]:
        for c in ev["choices"]:
            k = c["index"]
            assert finish[k] is None, "no chunk after a choice finished"
            text[k] += c["text"] if "text" in c else c["delta"].get("content", "")
            ids[k] += c.get("token_ids", [])
            if c["logprobs"] is not None:
                lp = c["logprobs"]
                lps[k] += lp["token_logprobs"] if "token_logprobs" in lp else [e["logprob"] for e in lp["content"]]
            finish[k] = c["finish_reason"]
    return text, ids, lps, finish


@pytest.mark.parametrize("stop", [None, "+"])
def test_streamed_completion_equals_plain(server, stop):
    body = {"model": MODEL, "prompt": "12+34=", "n": 2, "max_tokens": 24, "seed": 3, "logprobs": 1,
            "return_token_ids": True, "ignore_eos": True}
    if stop:
        body["stop"] = [stop, "9a"]
    plain = post(server, "/v1/completions", body).body
    events = sse_events(server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert len(events) > 4  # really streamed, not one chunk
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    text, ids, lps, finish = _concat_stream(events[:-2] + ["[DONE]"], 2)
    firsts: dict[int, dict] = {}
    for ev in events[:-2]:
        for c in ev["choices"]:
            firsts.setdefault(c["index"], c)
    assert [firsts[k]["prompt_token_ids"] for k in range(2)] == [c["prompt_token_ids"] for c in plain["choices"]]
    for k, c in enumerate(plain["choices"]):
        assert text[k] == c["text"]
        assert ids[k] == c["token_ids"]
        assert lps[k] == pytest.approx(c["logprobs"]["token_logprobs"], abs=TOL)
        assert finish[k] == c["finish_reason"]
    assert all(e["object"] == "text_completion" and e["model"] == MODEL for e in events[:-1])


def test_chat_completion_plain_and_streamed(server, llm):
    tok = llm.tokenizer
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "12+34"}]
    prompt = render_chat(tok, messages)
    assert prompt.endswith("assistant: ")
    ref = llm.generate([prompt], SamplingParams(n=2, max_tokens=10, seed=4, ignore_eos=True))[0]
    body = {"model": MODEL, "messages": messages, "n": 2, "max_tokens": 10, "seed": 4, "ignore_eos": True,
            "logprobs": True, "top_logprobs": 1}
    r = post(server, "/v1/chat/completions", body)
    assert r.status == 200, r.body
    assert r.body["object"] == "chat.completion"
    for c, o in zip(r.body["choices"], ref.outputs):
        assert c["message"] == {"role": "assistant", "content": o.text}
        content = c["logprobs"]["content"]
        assert [e["logprob"] for e in content] == pytest.approx(o.logprobs, abs=TOL)
        for e in content:
            assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
            assert e["bytes"] == list(e["token"].encode()) and e["top_logprobs"][0]["token"] == e["token"]
    assert r.body["usage"]["prompt_tokens"] == len(ref.prompt_token_ids)
    events = sse_events(server, "/v1/chat/completions", {**body, "stream": True})
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    firsts = {}
    for e in events[:-1]:
        for c in e["choices"]:
            firsts.setdefault(c["index"], c["delta"])
    assert all(d.get("role") == "assistant" for d in firsts.values())
    text, _, lps, finish = _concat_stream(events, 2)
    assert text == [o.text for o in ref.outputs]
    assert finish == [o.finish_reason for o in ref.outputs]
    assert lps[0] == pytest.approx(ref.outputs[0].logprobs, abs=TOL)
    # Chat's default max_tokens fills the context.
    r = post(server, "/v1/chat/completions", {"model": MODEL, "messages": messages, "ignore_eos": True, "seed": 1})
    assert r.body["usage"]["total_tokens"] == server.info.max_model_len


def test_models_and_health(server):
    r = request(server.url + "/v1/models")
    assert r.status == 200
    assert r.body["object"] == "list"
    card = r.body["data"][0]
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 128
    h = request(server.url + "/health")
    assert h.status == 200 and h.body["status"] == "ok" and h.body["model"] == MODEL
    assert isinstance(h.body["weight_version"], int)


def test_render_chat_prefers_the_tokenizers_template():
    from rollwise.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer("abc")
    msgs = [{"role": "user", "content": "ab"}]
    assert render_chat(tok, msgs) == "user: ab\nassistant: "
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert render_chat(tok, msgs) == "<user>ab<assistant>"
