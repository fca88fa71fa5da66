"""RemoteEngine drives `rollwise serve` exactly like the in-process LLM; MultiEngine mixes both; a short RL
run goes through the server (generate -> train -> push weights -> generate)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollwise import LLM, SamplingParams
from rollwise.clients.remote import Engine, MultiEngine, RemoteEngine, RemoteEngineError
from serve_util import ADMIN_KEY, MODEL, start_server

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15, 16, 17, 18]]
TOL = 1e-4


def _assert_same(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert ra.prompt_token_ids == rb.prompt_token_ids
        for oa, ob in zip(ra.outputs, rb.outputs):
            assert oa.token_ids == ob.token_ids
            assert oa.finish_reason == ob.finish_reason
            assert oa.text == ob.text
            assert max((abs(x - y) for x, y in zip(oa.logprobs, ob.logprobs)), default=0.0) < TOL
            assert oa.weight_versions == ob.weight_versions


@pytest.fixture()
def fresh_server(char_ckpt):
    srv = start_server(char_ckpt)
    yield srv
    srv.shutdown(drain_s=0.0)


def test_remote_generate_equals_in_process(server, llm):
    eng = RemoteEngine(server.url, api_key=ADMIN_KEY)
    assert isinstance(eng, Engine) and isinstance(llm, Engine)
    assert eng.model == MODEL  # discovered from /v1/models
    sp = SamplingParams(n=2, max_tokens=12, seed=11, temperature=0.9, top_k=20)
    _assert_same(eng.generate(PROMPTS, sp), llm.generate(PROMPTS, sp))
    # Per-prompt params, string prompts, stop strings, greedy.
    sps = [SamplingParams(max_tokens=8, seed=i, stop=["+"], ignore_eos=True) for i in range(3)]
    texts = ["12+34=", "5*6=", "1+1="]
    got, ref = eng.generate(texts, sps), llm.generate(texts, sps)
    _assert_same(got, ref)
    assert [g.prompt for g in got] == texts
    one = eng.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(one) == 1 and len(one[0].outputs[0].token_ids) == 5
    assert eng.weight_version == llm.weight_version == 0
    # With a tokenizer the server's own text is compared with the ids' text: an honest server never disagrees.
    checked = RemoteEngine(server.url, tokenizer=llm.tokenizer)
    checked.generate(texts + PROMPTS, sps + [sp] * len(PROMPTS))
    assert checked.counters() == {"text_mismatch": 0}


def test_remote_load_weights_round_trip(fresh_server, other_ckpt, char_ckpt, tmp_path):
    eng = RemoteEngine(fresh_server.url, api_key=ADMIN_KEY)
    sp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    before = eng.generate(PROMPTS, sp)
    other = LLM(other_ckpt, block_size=4, max_model_len=128)
    state = AutoModelForCausalLM.from_pretrained(other_ckpt).state_dict()
    assert eng.load_weights(state) == 1 == eng.weight_version  # safetensors bytes in the request body
    after = eng.generate(PROMPTS, sp)
    ref = other.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in after] == [o.outputs[0].token_ids for o in ref]
    assert [o.outputs[0].token_ids for o in after] != [o.outputs[0].token_ids for o in before]
    assert all(set(o.outputs[0].weight_versions) == {1} for o in after)
    # From a directory the server can read.
    # The caller owns the version (the trainer's update count): the server adopts it and its tokens carry it.
    assert eng.load_weights_from_dir(char_ckpt, version=7) == 7 == eng.weight_version == eng.health()["weight_version"]
    again = eng.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in again] == [o.outputs[0].token_ids for o in before]
    assert all(set(o.outputs[0].weight_versions) == {7} for o in again)
    # SGLang and vLLM have routes of their own: tests/clients/test_weight_sync.py drives them on fake servers.
    # Wrong key and wrong shapes: a clear error, the server unchanged.
    with pytest.raises(RemoteEngineError, match="HTTP 401: invalid admin key"):
        RemoteEngine(fresh_server.url, api_key="wrong").load_weights_from_dir(other_ckpt)
    with pytest.raises(RemoteEngineError, match="HTTP 400: .*shape mismatch"):
        eng.load_weights({"model.norm.weight": torch.ones(3)}, version=10)
    assert eng.weight_version == 7  # a refused load changes nothing


def test_remote_errors_are_clear_and_never_hang():
    # A server that accepts connections and never answers: the timeout fires with a message.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        lsock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        eng = RemoteEngine(f"http://127.0.0.1:{port}", model="m", timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(RemoteEngineError, match="timed out after"):
            eng.generate([[1, 2, 3]] * 3, SamplingParams(max_tokens=4))
        assert time.monotonic() - t0 < 5
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        lsock.close()
    with pytest.raises(RemoteEngineError, match="cannot connect"):
        RemoteEngine(f"http://127.0.0.1:{port}", timeout_s=1)
    with pytest.raises(ValueError, match="base_url"):
        RemoteEngine("localhost:8000", model="m")
    with pytest.raises(ValueError, match="backend"):
        RemoteEngine("http://127.0.0.1:1", model="m", backend="tgi")


def test_remote_bad_request_message_comes_through(server):
    eng = RemoteEngine(server.url)
    with pytest.raises(RemoteEngineError, match="HTTP 400: .*maximum context length is 128"):
        eng.generate([[5] * 100], SamplingParams(max_tokens=100))
    with pytest.raises(RemoteEngineError, match="HTTP 404: model 'nope' does not exist"):
        RemoteEngine(server.url, model="nope").generate([[5, 6]], SamplingParams(max_tokens=2))


def test_multi_engine_mixes_local_and_remote(server, llm, char_ckpt):
    remote = RemoteEngine(server.url)
    local = LLM(char_ckpt, block_size=4, max_model_len=128)
    multi = MultiEngine([local, remote], weights=[1, 3])
    assert multi.split(8) == [(0, 2), (2, 8)] and multi.split(1) == [(0, 0), (0, 1)]
    prompts = PROMPTS * 2
    sp = SamplingParams(n=2, max_tokens=8, seed=2)
    _assert_same(multi.generate(prompts, sp), llm.generate(prompts, sp))
    assert multi.weight_version == 0 and multi.tokenizer is local.tokenizer
    with pytest.raises(TypeError, match="not an engine"):
        MultiEngine([object()])


def test_short_rl_run_through_the_server(fresh_server, char_ckpt):
    """Generate on the server, train on the rollouts, push the weights back: versions and log-probs line up."""
    from rollwise.config import TrainConfig
    from rollwise.train.advantages import assign_advantages
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.trainer import Trainer
    from rollwise.types import Rollout, RolloutGroup

    eng = RemoteEngine(fresh_server.url, api_key=ADMIN_KEY)
    tr = Trainer(char_ckpt, TrainConfig(lr=1e-3), device="cpu", temperature=1.0)
    target = 5  # reward: how often token 5 ("1") appears; the policy should learn to say it more
    for step in range(3):
        outs = eng.generate([[7, 8, 9], [10, 11, 12]], SamplingParams(n=8, max_tokens=8, seed=step, ignore_eos=True))
        groups = []
        for i, out in enumerate(outs):
            rs = [Rollout(f"p{i}", f"s{step}g{i}", j, out.prompt_token_ids, o.token_ids, o.logprobs,
                          o.weight_versions, [1] * len(o.token_ids), reward=o.token_ids.count(target) / 8)
                  for j, o in enumerate(out.outputs)]
            assert all(set(r.weight_versions) == {step} for r in rs)
            groups.append(RolloutGroup(f"p{i}", f"s{step}g{i}", rs))
        assign_advantages(groups, "grpo")
        batch = TrainBatch.from_rollouts([r for g in groups for r in g.rollouts], 4096)
        m = tr.train_step(batch, LOSSES["grpo"], LossConfig())
        # The engine's log-probs (through HTTP and JSON) are the trainer's, before the update.
        assert m["logprob_diff_max"] < 1e-3, m
        assert eng.load_weights(tr.state_dict_for_sync()) == step + 1
    assert fresh_server.engine.weight_version == 3
