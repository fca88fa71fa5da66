"""Speculative rollouts: drafts change how many forward passes a sample takes, never what it samples.

- greedy output identical with and without drafts (right, wrong and garbage drafts);
- sampled sequences follow the exact law: a chi-square test of 4,800 three-token samples, drawn with drafts of
  likely and unlikely tokens, against the joint distribution computed with transformers; the same test rejects two
  deliberately wrong verification rules, so it has the power to catch one;
- with the same seed the output equals the output without drafts (sample-and-compare acceptance);
- log-probs of accepted and replaced tokens are transformers' processed ones (temperature, top-k, top-p);
- edge cases: drafts longer than max_tokens, drafts past EOS, empty drafts, out-of-vocabulary drafts;
- block bookkeeping: rejected positions' blocks are handed back, nothing leaks, the prefix cache stays right.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollwise import LLM, SamplingParams
from rollwise.engine import speculative
from rollwise.engine.speculative import DraftSpec, accepted_prefix, draft_length

from conftest import chi_square_excess, make_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40, 41, 42, 43, 44]]


def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def always_speculate(llm: LLM) -> LLM:
    """Draft length = k whatever the batch size and acceptance (the adaptive rule is tested on its own)."""
    llm.engine.calibrate_spec = False
    llm.engine.scheduler.config.spec_overhead_rows = 1e9
    return llm


def corrupt(ids: list[int], every: int = 5, vocab: int = 97) -> list[int]:
    return [(t + 7) % vocab if i % every == every - 1 else t for i, t in enumerate(ids)]


# ------------------------------------------------------------------------------------------------- pure parts


def test_accepted_prefix_and_draft_length():
    assert accepted_prefix([1, 2, 3], [1, 2, 3, 4]) == 4  # all accepted + the bonus token
    assert accepted_prefix([1, 2, 3], [1, 9, 3, 4]) == 2  # accepted 1, replaced 2 by 9, rest dropped
    assert accepted_prefix([1, 2, 3], [7, 2, 3, 4]) == 1
    assert accepted_prefix([], [5]) == 1
    # Few sequences left -> long drafts; a full batch -> none; higher acceptance -> longer.
    assert draft_length(0.8, 1, 16.0, 8) == 8
    assert draft_length(0.8, 256, 16.0, 8) == 0
    assert draft_length(0.5, 8, 16.0, 8) < draft_length(0.9, 8, 16.0, 8)
    assert draft_length(0.9, 4, 16.0, 3) == 3  # capped by k
    with pytest.raises(ValueError, match="k must be"):
        DraftSpec((), k=0)


def test_step_cost_fit_gives_the_overhead_in_rows():
    c = speculative.StepCost(prior=16.0, min_steps=8)
    for rows in (4, 8, 16, 64, 4, 8, 16, 64):
        c.observe(rows, 0.1 + 0.005 * rows)  # c0 = 0.1 s, c1 = 5 ms per row: R0 = 20
    assert abs(c.overhead_rows() - 20.0) < 1e-6
    flat = speculative.StepCost(prior=16.0, min_steps=8)
    for _ in range(10):
        flat.observe(8, 0.2)  # no spread in batch size: keep the prior
    assert flat.overhead_rows() == 16.0


def test_draft_store_keeps_each_prompts_most_recent_completions():
    from types import SimpleNamespace as NS

    from rollwise.control.drafts import DraftStore

    def group(pid, *comps):
        return NS(prompt_id=pid, rollouts=[NS(prompt_id=pid, completion_token_ids=list(c)) for c in comps])

    st = DraftStore("past", k=3, per_prompt=2)
    assert st.for_task("a") is None  # past only, nothing seen: no speculation
    st.observe([group("a", [1, 2], [3], []), group("b", [9])])
    st.observe([group("a", [4, 5])])
    d = st.for_task("a")
    assert d.sequences == ((4, 5), (3,)) and d.k == 3 and not d.ngram  # newest first, at most per_prompt
    both = DraftStore("both", per_prompt=2)
    assert both.for_task("zzz").ngram and both.for_task("zzz").sequences == ()
    ngram = DraftStore("ngram")
    ngram.observe([group("a", [1])])
    assert len(ngram) == 0 and ngram.for_task("a").sequences == ()
    assert DraftStore.from_config(NS(source="off", k=8, per_prompt=8)) is None
    with pytest.raises(ValueError, match="speculative source must be one of"):
        DraftStore("sometimes")


def test_cold_start_acceptance_comes_from_the_runs_history():
    """A new request's acceptance estimate starts from the run's measured acceptance (DraftSpec.prior), not
    Beta(1, 1): with 90% of drafts accepted so far, a sample drafts at a full batch from its first step."""
    from types import SimpleNamespace as NS

    from rollwise.control.drafts import PRIOR_WEIGHT, DraftStore
    from rollwise.engine.speculative import RequestDrafter

    st = DraftStore("past", k=8)
    st.observe([NS(prompt_id="a", rollouts=[NS(prompt_id="a", completion_token_ids=[1, 2, 3])])])
    assert st.for_task("a").prior == (1.0, 1.0)  # no history yet
    st.observe_acceptance(90, 100)
    a0, b0 = st.for_task("a").prior
    assert a0 / (a0 + b0) == pytest.approx(0.9) and a0 + b0 == pytest.approx(PRIOR_WEIGHT)
    st.observe_acceptance(0, 100)  # a bad step weighs more than the older history (decay per step)
    a1, b1 = st.for_task("a").prior
    assert a1 / (a1 + b1) < 0.45

    def first_step_length(prior):
        d = RequestDrafter([5, 6], DraftSpec(((1, 2, 3),), 8, prior=prior))
        return draft_length(d.attach(NS(num_output_tokens=0), 0).acceptance, 64, 16.0, 8)

    assert first_step_length((1.0, 1.0)) == 0 and first_step_length((7.2, 0.8)) >= 1
    with pytest.raises(ValueError, match="acceptance prior"):
        DraftSpec((), 8, prior=(0.0, 1.0))


def test_drafter_follows_a_past_continuation_and_resyncs():
    class Seq:  # what the drafter reads of a Sequence
        def __init__(self, ids, n_prompt):
            self.token_ids, self.num_prompt, self.spec = ids, n_prompt, None

        @property
        def num_output_tokens(self):
            return len(self.token_ids) - self.num_prompt

    prompt = [1, 2, 3]
    d = speculative.RequestDrafter(prompt, DraftSpec(((10, 11, 12, 13, 14, 15),), k=8, ngram=False))
    s = Seq(list(prompt), 3)
    s.spec = d.attach(s, 0)
    assert d.propose(s, 3) == [10, 11, 12]
    s.token_ids += [10, 11]
    d.observe(s, [10, 11])
    assert d.propose(s, 2) == [12, 13]
    s.token_ids += [99, 13]  # diverged, then wrote a token of the draft again: re-attach after it
    d.observe(s, [99, 13])
    assert d.propose(s, 8) == [14, 15]


# ------------------------------------------------------------------------------------------------- greedy


def test_greedy_identical_with_and_without_drafts(tiny_ckpts):
    llm = always_speculate(LLM(tiny_ckpts["llama"], block_size=4, max_num_seqs=8))
    sp = SamplingParams(n=2, temperature=0, max_tokens=24, ignore_eos=True)
    base = llm.generate(PROMPTS, sp)
    drafts = [[corrupt(o.outputs[0].token_ids), [3] * 30, []] for o in base]  # mostly right, wrong, empty
    before = llm.engine.stats.spec.accepted_tokens
    outs = llm.generate(PROMPTS, sp, drafts=drafts)
    for a, b in zip(base, outs):
        for x, y in zip(a.outputs, b.outputs):
            assert y.token_ids == x.token_ids
            assert y.finish_reason == x.finish_reason == "length"
            assert max(abs(u - v) for u, v in zip(x.logprobs, y.logprobs)) < 1e-4
    assert llm.engine.stats.spec.accepted_tokens - before > 20  # the drafts were really used
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks  # nothing leaked


# ------------------------------------------------------------------------------------------------- the law

V = 6
MAX_T = 3
STAT_PROMPT = [3, 4, 5, 1]


@pytest.fixture(scope="module")
def tiny_v6(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("v6") / "m", "llama", vocab=V, hidden_size=32,
                                intermediate_size=64)


def exact_joint(path: Path, temperature: float) -> dict[tuple[int, ...], float]:
    """P(completion) for every completion of MAX_T tokens, from transformers' logits."""
    model = hf_model(path)
    seqs = list(itertools.product(range(V), repeat=MAX_T))
    ids = torch.tensor([STAT_PROMPT + list(s) for s in seqs])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits.double() / temperature, dim=-1)
    n = len(STAT_PROMPT)
    out = {}
    for i, s in enumerate(seqs):
        out[s] = math.exp(sum(lp[i, n - 1 + t, tok].item() for t, tok in enumerate(s)))
    return out


def stat_drafts(path: Path) -> list[list[int]]:
    """After each first token a, a continuation of likely tokens (a even) or unlikely ones (a odd)."""
    model = hf_model(path)
    drafts = []
    for a in range(V):
        ctx = STAT_PROMPT + [a]
        cont = [a]
        for _ in range(MAX_T + 2):  # longer than max_tokens on purpose
            with torch.no_grad():
                p = model(torch.tensor([ctx])).logits[0, -1]
            tok = int(p.argmax() if a % 2 == 0 else p.argmin())
            cont.append(tok)
            ctx.append(tok)
        drafts.append(cont)
    return drafts


def sample_counts(path: Path, drafts, temperature: float, seed0: int) -> tuple[dict, LLM]:
    llm = always_speculate(LLM(path, block_size=2, max_num_seqs=800, max_model_len=32))
    counts: dict[tuple[int, ...], int] = {}
    reqs, per = 12, 400
    params = [SamplingParams(n=per, temperature=temperature, max_tokens=MAX_T, seed=seed0 + i, ignore_eos=True)
              for i in range(reqs)]
    outs = llm.generate([STAT_PROMPT] * reqs, params, drafts=None if drafts is None else [drafts] * reqs,
                        draft_k=MAX_T, ngram_drafts=False)
    for o in outs:
        for c in o.outputs:
            key = tuple(c.token_ids)
            counts[key] = counts.get(key, 0) + 1
    return counts, llm


def test_sampled_law_is_exact_with_drafts_and_wrong_rules_fail(tiny_v6, monkeypatch):
    temperature = 0.8
    probs = exact_joint(tiny_v6, temperature)
    drafts = stat_drafts(tiny_v6)
    plain, _ = sample_counts(tiny_v6, None, temperature, seed0=1000)
    assert chi_square_excess(plain, probs) < 1.0  # the test is calibrated on ordinary sampling
    spec, llm = sample_counts(tiny_v6, drafts, temperature, seed0=2000)
    st = llm.engine.stats.spec
    assert st.tested_tokens > 3000 and 0.1 < st.acceptance_rate < 0.9  # likely and unlikely drafts were verified
    assert chi_square_excess(spec, probs) < 1.0
    # Two plausible bugs, each caught by the same test:
    # (1) on a rejection, emit the token sampled one row later (an off-by-one in the verify walk);
    orig = speculative.accepted_prefix

    def off_by_one(draft, sampled):
        n = orig(draft, sampled)
        if n <= len(draft) and n < len(sampled):
            sampled[n - 1] = sampled[n]
        return n

    monkeypatch.setattr("rollwise.engine.core.accepted_prefix", off_by_one)
    bad1, _ = sample_counts(tiny_v6, drafts, temperature, seed0=2000)
    assert chi_square_excess(bad1, probs) > 2.0
    monkeypatch.undo()
    # (2) every verify row of a sample reuses the draw of its first row (the counter position not advanced).
    from rollwise.engine.model_runner import ModelRunner

    orig_sb = ModelRunner._sampling_batch

    def same_draw(self, out):
        sb = orig_sb(self, out)
        if out.drafts is not None:
            pos = [s.num_output_tokens for s, d in zip(out.seqs, out.drafts) for _ in range(1 + len(d))]
            sb.positions = torch.tensor(pos, dtype=torch.long)
        return sb

    monkeypatch.setattr(ModelRunner, "_sampling_batch", same_draw)
    bad2, _ = sample_counts(tiny_v6, drafts, temperature, seed0=2000)
    assert chi_square_excess(bad2, probs) > 2.0


# ------------------------------------------------------------------------------------------------- seeds, log-probs


def test_same_seed_same_output_and_equal_to_no_drafts(tiny_ckpts):
    llm = always_speculate(LLM(tiny_ckpts["qwen2"], block_size=4, max_num_seqs=16))
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=20, seed=5, ignore_eos=True)
    base = llm.generate(PROMPTS, sp)
    drafts = [[o.outputs[1].token_ids, corrupt(o.outputs[2].token_ids, 3)] for o in base]
    a = llm.generate(PROMPTS, sp, drafts=drafts)
    b = llm.generate(PROMPTS, sp, drafts=drafts)
    assert llm.engine.stats.spec.accepted_tokens > 0
    for x, y, z in zip(base, a, b):
        for o0, o1, o2 in zip(x.outputs, y.outputs, z.outputs):
            assert o1.token_ids == o2.token_ids and o1.logprobs == o2.logprobs
            assert o1.token_ids == o0.token_ids  # sample-and-compare: the very tokens ordinary sampling draws


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, -1), (0.7, 0.8, -1), (1.0, 1.0, 5)])
def test_logprobs_of_accepted_and_replaced_tokens_match_transformers(tiny_ckpts, temperature, top_p, top_k):
    path = tiny_ckpts["llama"]
    llm = always_speculate(LLM(path, block_size=4, max_num_seqs=16))
    sp = SamplingParams(n=3, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=16, seed=9,
                        ignore_eos=True)
    seed_outs = llm.generate(PROMPTS, SamplingParams(n=3, temperature=temperature, top_p=top_p, top_k=top_k,
                                                     max_tokens=16, seed=1, ignore_eos=True))
    drafts = [[c.token_ids for c in o.outputs] + [corrupt(o.outputs[0].token_ids, 2)] for o in seed_outs]
    before = (llm.engine.stats.spec.accepted_tokens, llm.engine.stats.spec.tested_tokens)
    outs = llm.generate(PROMPTS, sp, drafts=drafts)
    acc = llm.engine.stats.spec.accepted_tokens - before[0]
    rejected = llm.engine.stats.spec.tested_tokens - before[1] - acc
    assert acc > 0 and rejected > 0
    hf = hf_model(path)
    for prompt, out in zip(PROMPTS, outs):
        for o in out.outputs:
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + o.token_ids])).logits[0].double()
            for t, (tok, lp) in enumerate(zip(o.token_ids, o.logprobs)):
                ref = naive_processed(logits[len(prompt) - 1 + t], temperature, top_p, top_k)
                assert ref[tok] > float("-inf")
                assert abs(lp - ref[tok].item()) < 1e-4
            assert o.weight_versions == [0] * len(o.token_ids)


def naive_processed(logits_row: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """log p under softmax(logits / T), top-k, then top-p of the renormalised rest (crossing token kept)."""
    lp = torch.log_softmax(logits_row / temperature, -1)
    order = lp.argsort(descending=True).tolist()
    if top_k > 0:
        order = order[:top_k]
    z = torch.logsumexp(lp[order], 0)
    kept, mass = [], 0.0
    for i in order:
        kept.append(i)
        mass += math.exp(lp[i].item() - z.item())
        if mass >= top_p:
            break
    out = torch.full_like(lp, float("-inf"))
    zk = torch.logsumexp(lp[kept], 0)
    out[kept] = lp[kept] - zk
    return out


# ------------------------------------------------------------------------------------------------- edge cases


def test_drafts_longer_than_max_tokens_past_eos_empty_and_out_of_vocabulary(tiny_ckpts):
    llm = always_speculate(LLM(tiny_ckpts["llama"], block_size=4, max_num_seqs=8))
    eos = 2
    # Longer than max_tokens: stops at max_tokens exactly.
    sp = SamplingParams(n=2, temperature=0, max_tokens=7, ignore_eos=True)
    base = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    outs = llm.generate(PROMPTS, sp, drafts=[[o.outputs[0].token_ids] for o in base])
    for b, o in zip(base, outs):
        for c in o.outputs:
            assert c.token_ids == b.outputs[0].token_ids[:7] and c.finish_reason == "length"
            assert len(c.logprobs) == len(c.weight_versions) == 7
    # A draft that reaches EOS and goes on: the accepted EOS ends the sample, nothing after it is emitted.
    p = PROMPTS[0]
    free = llm.generate([p], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0].token_ids
    # Make EOS the greedy choice at output position 4 by a stop id: stop_token_ids applies inside accepted runs too.
    stop_tok = free[4]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_tok])
    ref = llm.generate([p], sp)[0].outputs[0]
    got = llm.generate([p], sp, drafts=[[free + [eos, 5, 6, 7]]])[0].outputs[0]
    assert got.token_ids == ref.token_ids and got.token_ids[-1] == stop_tok and got.finish_reason == "stop"
    # EOS inside the draft, with EOS honoured: greedy output unchanged (EOS is not what the model picks).
    sp = SamplingParams(n=2, temperature=0, max_tokens=12)
    ref = llm.generate([p], sp)[0]
    got = llm.generate([p], sp, drafts=[[free[:3] + [eos] + free[4:]]])[0]
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in ref.outputs]
    # Empty drafts and an empty list of drafts: plain decoding (n-gram drafts may still apply).
    sp = SamplingParams(n=2, temperature=0, max_tokens=10, ignore_eos=True)
    ref = llm.generate(PROMPTS, sp)
    for d in ([[]], []):
        got = llm.generate(PROMPTS, sp, drafts=[d] * len(PROMPTS))
        assert [c.token_ids for o in got for c in o.outputs] == [c.token_ids for o in ref for c in o.outputs]
    # Out of vocabulary: one clear line, nothing left queued.
    with pytest.raises(ValueError, match=r"draft token id 97 is outside the vocabulary \[0, 97\)"):
        llm.generate(PROMPTS, sp, drafts=[[[5, 97]]] * len(PROMPTS))
    with pytest.raises(ValueError, match="draft lists for"):
        llm.generate(PROMPTS, sp, drafts=[[[5]]])
    with pytest.raises(ValueError, match="list of token-id lists"):
        llm.generate(PROMPTS[:1], sp, drafts=["abc"])
    assert not llm.engine.requests
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_blocks_and_prefix_cache_stay_right_under_rejections(tiny_ckpts):
    """Small blocks, many rejected positions, a tight cache: outputs equal plain greedy, the prefix cache serves
    only verified KV (a second identical request, served from it, still matches), and no block leaks."""
    llm = always_speculate(LLM(tiny_ckpts["qwen3"], block_size=2, max_num_seqs=8, num_kv_blocks=96))
    sp = SamplingParams(n=3, temperature=0, max_tokens=20, ignore_eos=True)
    ref = llm.generate(PROMPTS, sp)
    bad = [[corrupt(o.outputs[0].token_ids, 2), [1] * 25] for o in ref]
    for _ in range(2):
        got = llm.generate(PROMPTS, sp, drafts=bad)
        assert [c.token_ids for o in got for c in o.outputs] == [c.token_ids for o in ref for c in o.outputs]
    # A prompt equal to an earlier prompt + output reuses its verified blocks and continues identically.
    long_prompt = PROMPTS[0] + ref[0].outputs[0].token_ids[:12]
    cont = llm.generate([long_prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert cont.outputs[0].token_ids == ref[0].outputs[0].token_ids[12:20]
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(c == 0 for c in bm.ref_count)


# ------------------------------------------------------------------------------------------------- the loop


def test_controller_feeds_past_rollouts_as_drafts_and_rollouts_are_unchanged(tiny_ckpts):
    """Two steps over the same prompts: step 2's requests carry step 1's completions as drafts; the rollouts equal
    those of a controller without drafts (same seeds), and the step books report the speculation."""
    from rollwise.control.controller import RolloutController
    from rollwise.control.drafts import DraftStore
    from rollwise.control.policies.uniform import UniformPolicy
    from rollwise.envs.base import Task
    from rollwise.types import Score

    class Env:
        def score(self, task, completion):
            return Score(0.0)

    tasks = [Task(id=f"t{i}", prompt=f"q{i}", answer=None) for i in range(3)]
    encode = {t.id: p for t, p in zip(tasks, PROMPTS)}
    params = SamplingParams(n=4, temperature=0.8, max_tokens=16, seed=3, ignore_eos=True)
    results = {}
    for use in (False, True):
        llm = always_speculate(LLM(tiny_ckpts["llama"], block_size=4, max_num_seqs=16))
        store = DraftStore("both", k=4, per_prompt=4) if use else None
        ctl = RolloutController(UniformPolicy(), Env(), None, encode=lambda t: encode[t.id], drafts=store)
        steps = []
        for step in (1, 2):
            # The same seed both steps: the same completions, so step 1's rollouts are perfect drafts for step 2.
            res = ctl.run_step(llm.engine, lambda k: tasks[:k], params, step=step, batch_groups=3)
            steps.append(res)
        results[use] = steps
        if use:
            assert len(store) == 3 and store.for_task("t0").sequences
            assert steps[0].accounting.spec_acceptance is None or steps[0].accounting.spec_acceptance < 1.0
            acc = steps[1].accounting
            assert acc.spec_acceptance == 1.0 and acc.spec_tokens_per_forward > 2.0
            m = acc.metrics()
            assert {"control_spec_acceptance", "control_spec_tokens_per_forward", "control_spec_saved_s"} <= set(m)
        else:
            assert "control_spec_acceptance" not in steps[1].accounting.metrics()
    for a, b in zip(results[False], results[True]):
        ra = [r.completion_token_ids for g in a.groups for r in g.rollouts]
        rb = [r.completion_token_ids for g in b.groups for r in g.rollouts]
        assert ra == rb


def test_config_refuses_speculation_off_the_local_engine():
    from pydantic import ValidationError

    from rollwise.config import RunConfig, load_config

    with pytest.raises(ValidationError, match="rollout.speculative.source 'past' needs engine.backend 'local'"):
        RunConfig.model_validate({"rollout": {"speculative": {"source": "past", "k": 4}},
                                  "engine": {"backend": "remote", "remote_urls": ["http://x"]}})
    cfg = load_config(None, ["rollout.speculative.source=both", "rollout.speculative.k=4"])
    assert cfg.rollout.speculative.source == "both" and cfg.rollout.speculative.k == 4
    with pytest.raises((ValidationError, ValueError)):
        load_config(None, ["rollout.speculative.source=sometimes"])


@pytest.mark.slow
def test_speculation_in_the_loop_reports_its_metrics(tmp_path_factory, run_cfg):
    import json

    from rollwise.run.loop import train

    out = tmp_path_factory.mktemp("spec_loop")
    train(run_cfg(out, "rollout.speculative.source=both", "rollout.speculative.k=4"), log=lambda s: None)
    lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert any("control_spec_acceptance" in m and "control_spec_tokens_per_forward" in m for m in lines)


@pytest.mark.slow
def test_real_model_stop_strings_inside_accepted_runs(smollm2_dir):
    """SmolLM2 through its chat template, greedy: a draft equal to the whole free continuation is accepted up to the
    stop string, and the output (tokens, text, log-probs) equals the one without drafts."""
    import torch as _t

    from rollwise.models.prompting import PromptFormat

    _t.set_num_threads(1)
    llm = always_speculate(LLM(smollm2_dir, max_num_seqs=4, max_model_len=256, num_kv_blocks=64))
    ids = PromptFormat().encode(llm.tokenizer, "What is 47 + 38?")
    free = llm.generate([ids], SamplingParams(temperature=0, max_tokens=40))[0].outputs[0]
    words = free.text.split()
    assert len(words) > 4
    stop = words[3]
    sp = SamplingParams(temperature=0, max_tokens=40, stop=[stop])
    ref = llm.generate([ids], sp)[0].outputs[0]
    got = llm.generate([ids], sp, drafts=[[free.token_ids]])[0].outputs[0]
    assert got.finish_reason == ref.finish_reason == "stop"
    assert got.token_ids == ref.token_ids and got.text == ref.text and stop not in got.text
    assert max(abs(a - b) for a, b in zip(got.logprobs, ref.logprobs)) < 1e-4
    assert llm.engine.stats.spec.accepted_tokens >= len(ref.token_ids) - 2
