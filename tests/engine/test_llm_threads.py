"""`LLM.generate` called from many threads at once: each caller gets exactly its own outputs.

Regression for issue 12: `LLMJudge` on an in-process `LLM` under `score_many` with 8 workers gave 13 of 16
errored scores (KeyError), because every caller stepped the one engine and took the others' finished requests.
"""

from __future__ import annotations

import threading

from conftest import make_tiny_checkpoint
from rollwise import LLM, SamplingParams
from rollwise.models.tokenizer import build_char_tokenizer
from rollwise.rewards.concurrent import score_many
from rollwise.rewards.judge import LLMJudge
from rollwise.types import Task


def _run_threads(fn, n):
    results: list = [None] * n
    errors: list = []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - collected and asserted on below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a generate call hung"
    return results, errors


def test_concurrent_generate_returns_each_callers_own_outputs(tiny_ckpts):
    llm = LLM(tiny_ckpts["llama"], block_size=4, max_num_seqs=64)
    prompts = [[[5 + i, 6 + i, 7], [30 + i, 31]] for i in range(8)]
    sps = [SamplingParams(n=2, temperature=1.0, max_tokens=6 + i, seed=i, ignore_eos=True) for i in range(8)]
    expected = [llm.generate(prompts[i], sps[i]) for i in range(8)]
    steps_before = llm.engine.stats.steps
    got, errors = _run_threads(lambda i: llm.generate(prompts[i], sps[i]), 8)
    assert not errors, errors[:1]
    for exp, out in zip(expected, got):
        assert [o.prompt_token_ids for o in out] == [o.prompt_token_ids for o in exp]
        assert [[c.token_ids for c in o.outputs] for o in out] == [[c.token_ids for c in o.outputs] for o in exp]
        for o, e in zip(out, exp):
            for c, ce in zip(o.outputs, e.outputs):
                assert max(abs(a - b) for a, b in zip(c.logprobs, ce.logprobs)) < 1e-5
    assert not llm.engine.has_unfinished() and not llm.engine.requests
    assert llm.engine.stats.steps > steps_before


def test_llm_judge_under_score_many_with_8_workers(tmp_path):
    tok = build_char_tokenizer("0123456789 :+=Scoreabcdefghijklmnopqrstuvwxyz\n.QAR'")
    path = make_tiny_checkpoint(tmp_path / "judge", "llama", vocab=len(tok), seed=4)
    tok.save_pretrained(path)
    llm = LLM(path, block_size=4)
    judge = LLMJudge(llm, template="q {prompt} a {completion} score:", max_score=9,
                     sampling=SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    items = [(Task(id=f"t{i}", prompt=f"{i}+{i}=", answer=str(2 * i)), str(i * 3)) for i in range(16)]
    def per_sample(task, completion):  # one generate call per sample (the judge's score_batch would batch them)
        return judge(task, completion)

    one = score_many(per_sample, items, max_workers=1, timeout_s=None)
    eight = score_many(per_sample, items, max_workers=8, timeout_s=None)
    assert [s.error for s in eight] == [s.error for s in one]
    assert not any(s.error and "KeyError" in s.error for s in eight)
    assert [s.info.get("reply") for s in eight] == [s.info.get("reply") for s in one]
    assert [s.value for s in eight] == [s.value for s in one]


def test_abort_from_another_thread_ends_that_generate_call(tiny_ckpts):
    import time

    llm = LLM(tiny_ckpts["llama"], block_size=4)
    out: dict = {}
    sp = SamplingParams(temperature=1.0, max_tokens=400, seed=1, ignore_eos=True)
    th = threading.Thread(target=lambda: out.setdefault("r", llm.generate([[5, 6, 7]], sp)))
    th.start()
    deadline = time.monotonic() + 60
    rid = None
    while rid is None and time.monotonic() < deadline:
        rid = next(iter(llm.running_request_ids()), None)  # let in between two steps of the other thread
        time.sleep(0.001)
    assert rid is not None
    partial = llm.abort(rid)
    th.join(60)
    assert not th.is_alive()
    c = out["r"][0].outputs[0]
    assert c.finish_reason == "abort" and len(c.token_ids) < 400
    assert partial is not None and partial.outputs[0].token_ids == c.token_ids
