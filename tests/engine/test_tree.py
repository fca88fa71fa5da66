"""Tree rollouts in the engine: a forked child is exactly what resubmitting its prefix would give, every leaf is an
ordinary sample of the policy, and the bookkeeping (copies, aborts, preemption, blocks) holds.

- a child's tokens after its fork equal those of the same sample resumed from the prefix as a prompt (`partial=`:
  the prefix's KV recomputed from scratch), with log-probs to 1e-4, and every sample's log-probs equal
  transformers' processed log-probs of its tokens: the shared and copied KV is right;
- the law of each leaf slot equals plain sampling (chi-square against the exact joint law computed with
  transformers, EOS included, for fixed and entropy branching); skipping the copy of the partial last block
  (a plausible bug) is caught by the same test;
- a parent that ends first hands its unborn children copies; an abort leaves every sample ended; a KV cache too
  small for the batch preempts and still finishes right; nothing leaks;
- refusals: drafts, resumed partials and greedy sampling do not combine with trees.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollwise import LLM, SamplingParams
from rollwise.types import CompletionOutput, TreeSpec

from conftest import chi_square_excess, make_tiny_checkpoint

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40, 41, 42, 43, 44, 45, 46, 47]]
T = 0.9


def hf_model(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].double() / temperature, dim=-1)
    n = len(prompt)
    return [lp[n - 1 + t, tok].item() for t, tok in enumerate(completion)]


def check_tree_shape(out, n: int) -> None:
    """Parents point to lower slots; a child shares its parent's tokens before its fork."""
    assert len(out.outputs) == n
    for o in out.outputs:
        if o.tree_parent is None:
            continue
        par = out.outputs[o.tree_parent]
        assert o.tree_parent < o.index and 0 <= o.tree_fork <= len(o.token_ids)
        assert o.token_ids[:o.tree_fork] == par.token_ids[:o.tree_fork]
        assert o.logprobs[:o.tree_fork] == par.logprobs[:o.tree_fork]


@pytest.mark.parametrize("spec", [TreeSpec(branch="fixed", segment_tokens=3),
                                  TreeSpec(branch="entropy", segment_tokens=4, entropy_threshold=3.5),
                                  TreeSpec(fanout=3, roots=2, segment_tokens=2)], ids=["fixed", "entropy", "wide"])
def test_children_equal_their_prefix_resubmitted_and_match_transformers(tiny_ckpts, spec):
    path = tiny_ckpts["llama"]
    llm = LLM(path, block_size=4, max_num_seqs=64)
    n = 8
    sp = SamplingParams(n=n, temperature=T, max_tokens=14, seed=11, tree=spec, ignore_eos=True)
    outs = llm.generate(PROMPTS, sp)
    hf = hf_model(path)
    forks = 0
    for prompt, out in zip(PROMPTS, outs):
        check_tree_shape(out, n)
        for o in out.outputs:
            ref = hf_logprobs(hf, prompt, o.token_ids, T)
            assert max(abs(a - b) for a, b in zip(o.logprobs, ref)) < 1e-4
            if o.tree_parent is None or o.tree_fork == len(o.token_ids):
                continue
            forks += 1
            # The same sample resumed from its prefix: the prefix's KV recomputed as a prompt, same seed and index.
            partial = [CompletionOutput(i, [], [], "length") for i in range(n)]
            partial[o.index] = CompletionOutput(o.index, o.token_ids[:o.tree_fork], o.logprobs[:o.tree_fork], None)
            again = llm.generate([prompt], SamplingParams(n=n, temperature=T, max_tokens=14, seed=11, ignore_eos=True),
                                 partial=[partial])[0].outputs[o.index]
            assert again.token_ids == o.token_ids
            assert max(abs(a - b) for a, b in zip(again.logprobs, o.logprobs)) < 1e-4
    assert forks >= len(PROMPTS) * (n - spec.roots) - 2  # nearly every child really forked mid-generation
    st = llm.engine.stats
    assert st.tree_forks >= forks
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # nothing leaked


def test_a_tree_generates_fewer_tokens_than_independent_samples(tiny_ckpts):
    llm = LLM(tiny_ckpts["llama"], block_size=4)
    prompts = PROMPTS * 2
    plain = SamplingParams(n=8, temperature=T, max_tokens=24, seed=5, ignore_eos=True)
    llm.generate(prompts, plain)
    rows_plain = llm.engine.stats.decode_tokens
    llm2 = LLM(tiny_ckpts["llama"], block_size=4)
    tree = SamplingParams(n=8, temperature=T, max_tokens=24, seed=5, ignore_eos=True,
                          tree=TreeSpec(branch="fixed", segment_tokens=6))
    outs = llm2.generate(prompts, tree)
    own = sum(len(o.token_ids) - (o.tree_fork or 0) for r in outs for o in r.outputs)
    # 1 root x 24 + 1 x 18 + 2 x 12 + 4 x 6 own tokens = 90 per tree instead of 192; each forked child's first
    # token comes from its parent's logits row.
    assert own == len(prompts) * 90
    assert llm2.engine.stats.decode_tokens < 0.5 * rows_plain


def test_a_parent_that_ends_first_hands_its_children_copies(tmp_path):
    # A model whose EOS is likely: many samples end before their children's branch points.
    path = make_tiny_checkpoint(tmp_path / "m", vocab=6, hidden_size=32, intermediate_size=64)
    llm = LLM(path, block_size=2)
    sp = SamplingParams(n=8, temperature=1.0, max_tokens=12, seed=1, tree=TreeSpec(branch="fixed", segment_tokens=3))
    outs = llm.generate([[3, 4, 5, 1]] * 20, sp)
    copies = 0
    for out in outs:
        check_tree_shape(out, 8)
        for o in out.outputs:
            assert o.finish_reason in ("stop", "length")
            if o.tree_parent is not None and o.tree_fork == len(o.token_ids):
                par = out.outputs[o.tree_parent]
                assert o.token_ids == par.token_ids and o.finish_reason == par.finish_reason
                copies += 1
    assert copies > 0 and llm.engine.stats.tree_copies == copies
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_abort_ends_every_sample_and_a_small_cache_preempts_right(tiny_ckpts):
    path = tiny_ckpts["llama"]
    llm = LLM(path, block_size=4)
    eng = llm.engine
    sp = SamplingParams(n=8, temperature=T, max_tokens=30, seed=2, ignore_eos=True,
                        tree=TreeSpec(branch="fixed", segment_tokens=5))
    eng.add_request("a", PROMPTS[0], sp)
    for _ in range(8):  # the root has branched once; most children are not born yet
        eng.step()
    out = eng.abort("a")
    assert [o.finish_reason for o in out.outputs] == ["abort"] * 8
    check_tree_shape(out, 8)
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert not eng.has_unfinished()
    # A cache that cannot hold every sample at once: preemption recomputes, and trees still come out exact.
    small = LLM(path, block_size=4, num_kv_blocks=40, max_num_seqs=64)
    outs = small.generate(PROMPTS * 3, SamplingParams(n=8, temperature=T, max_tokens=20, seed=4, ignore_eos=True,
                                                      tree=TreeSpec(segment_tokens=4, entropy_threshold=3.5)))
    assert small.engine.scheduler.num_preemptions > 0
    hf = hf_model(path)
    for prompt, out in zip(PROMPTS * 3, outs):
        check_tree_shape(out, 8)
        for o in out.outputs:
            assert len(o.token_ids) == 20
            ref = hf_logprobs(hf, prompt, o.token_ids, T)
            assert max(abs(a - b) for a, b in zip(o.logprobs, ref)) < 1e-4
    assert small.engine.block_manager.num_free_blocks == 40


def test_trees_refuse_drafts_partials_and_greedy(tiny_ckpts):
    eng = LLM(tiny_ckpts["llama"]).engine
    tree = TreeSpec()
    with pytest.raises(ValueError, match="tree sampling does not combine with speculative drafts"):
        eng.add_request("d", [5, 6], SamplingParams(n=4, temperature=1.0, tree=tree), drafts=[[7, 8]])
    with pytest.raises(ValueError, match="resumed partial samples"):
        eng.add_request("p", [5, 6], SamplingParams(n=1, temperature=1.0, tree=tree),
                        partial=[CompletionOutput(0, [7], [-1.0], None)])
    with pytest.raises(ValueError, match="greedy"):
        eng.add_request("g", [5, 6], SamplingParams(n=4, temperature=0.0, tree=tree))
    assert not eng.requests
    with pytest.raises(ValueError, match="tree.fanout must be an integer >= 2"):
        TreeSpec(fanout=1)
    with pytest.raises(ValueError, match="tree.branch must be"):
        TreeSpec(branch="random")  # type: ignore[arg-type]


def test_the_plan_is_bfs_over_branch_points():
    assert TreeSpec().parents(8) == [None, 0, 0, 1, 0, 1, 2, 3]
    assert TreeSpec(fanout=4).parents(6) == [None, 0, 0, 0, 0, 0]
    assert TreeSpec(roots=3).parents(4) == [None, None, None, 0]
    assert TreeSpec(roots=5).parents(2) == [None, None]


# ------------------------------------------------------------------------------------------------- the law

V = 6
MAX_T = 3
EOS = 2
STAT_PROMPT = [3, 4, 5, 1]


@pytest.fixture(scope="module")
def tiny_v6(tmp_path_factory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("v6") / "m", "llama", vocab=V, hidden_size=32,
                                intermediate_size=64)


def exact_law(path: Path, temperature: float) -> dict[tuple[int, ...], float]:
    """P(completion) for every completion of at most MAX_T tokens ending at EOS or at MAX_T, from transformers."""
    model = hf_model(path)
    law: dict[tuple[int, ...], float] = {}
    n = len(STAT_PROMPT)
    frontier = [((), 1.0)]
    for t in range(MAX_T):
        ids = torch.tensor([STAT_PROMPT + list(s) for s, _ in frontier])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits.double()[:, n - 1 + t] / temperature, dim=-1)
        nxt = []
        for i, (s, p) in enumerate(frontier):
            for tok in range(V):
                q = p * math.exp(lp[i, tok].item())
                if tok == EOS or t == MAX_T - 1:
                    law[s + (tok,)] = q
                else:
                    nxt.append((s + (tok,), q))
        frontier = nxt
    assert abs(sum(law.values()) - 1.0) < 1e-9
    return law


def slot_counts(path: Path, spec: TreeSpec, n: int, reqs: int, seed0: int) -> tuple[list[dict], LLM]:
    llm = LLM(path, block_size=2, max_num_seqs=2048, max_model_len=16)
    params = [SamplingParams(n=n, temperature=T, max_tokens=MAX_T, seed=seed0 + i, tree=spec) for i in range(reqs)]
    outs = llm.generate([STAT_PROMPT] * reqs, params)
    counts: list[dict] = [dict() for _ in range(n)]
    for o in outs:
        for c in o.outputs:
            key = tuple(c.token_ids)
            counts[c.index][key] = counts[c.index].get(key, 0) + 1
    return counts, llm


@pytest.mark.parametrize("spec", [TreeSpec(branch="fixed", segment_tokens=1),
                                  TreeSpec(branch="entropy", segment_tokens=2, entropy_threshold=1.55)],
                         ids=["fixed", "entropy"])
def test_every_leaf_is_an_ordinary_sample_of_the_policy(tiny_v6, spec, monkeypatch):
    law = exact_law(tiny_v6, T)
    n, reqs = 4, 1500
    counts, llm = slot_counts(tiny_v6, spec, n, reqs, seed0=7000)
    st = llm.engine.stats
    assert st.tree_forks > reqs  # children really forked mid-generation (and some became copies at EOS)
    for j in range(n):
        assert sum(counts[j].values()) == reqs
        assert chi_square_excess(counts[j], law) < 1.0, f"slot {j}"
    # The same test catches a child whose copy of its parent's partial last KV block is lost (the block left as
    # the zeroed cache it started as).
    from rollwise.engine.model_runner import ModelRunner

    def lost_copy(self, pairs):
        for _, dst in pairs:
            for cache in self.kv_caches:
                cache[:, :, dst].zero_()

    monkeypatch.setattr(ModelRunner, "copy_blocks", lost_copy)
    bad, _ = slot_counts(tiny_v6, spec, n, 8 * reqs, seed0=9000)
    assert max(chi_square_excess(bad[j], law) for j in range(1, n)) > 2.0


def test_early_stop_aborts_a_decided_tree_whole_and_keeps_its_finished_leaves(tiny_ckpts):
    """control.policy early_stop with trees: the leaves are scored as they end inside their tree, and a group
    decided zero-variance is aborted whole, its running samples and its branches not yet born (aborted copies of
    their parent, no tokens of their own). The leaves that ended first are exactly those of the same tree run to the
    end (same seeds), the decision saw only those, and the step's books balance (run_step checks the ledger)."""
    from rollwise.control.controller import RolloutController
    from rollwise.control.policies.early_stop import EarlyStop, EarlyStopPolicy
    from rollwise.control.policies.uniform import UniformPolicy
    from rollwise.envs.base import Task
    from rollwise.types import Score

    tasks = [Task(id=f"t{i}", prompt=f"q{i}", answer=None) for i in range(3)]
    encode = {t.id: p for t, p in zip(tasks, PROMPTS)}

    def scorer(items):  # t0: always wrong (decided); the others: the parity of the last token (mixed)
        return [Score(0.0 if t.id == "t0" else float(ids[-1] % 2)) for t, _text, ids in items]

    # Stop tokens make the leaves end at different steps, as EOS does on a real model.
    params = SamplingParams(n=8, temperature=1.0, max_tokens=24, seed=5, stop_token_ids=list(range(3, 14)),
                            tree=TreeSpec(branch="fixed", segment_tokens=3))
    rule = EarlyStop(confidence=0.6, min_finished=2)
    res = {}
    for name, policy in (("stop", EarlyStopPolicy(confidence=0.6, min_finished=2)), ("full", UniformPolicy())):
        llm = LLM(tiny_ckpts["llama"], block_size=4, max_num_seqs=32)
        ctl = RolloutController(policy, None, None, encode=lambda t: encode[t.id], scorer=scorer)
        res[name] = ctl.run_step(llm.engine, lambda k: tasks[:k], params, step=1, batch_groups=3)
    full = {g.rollouts[0].group_id: g for g in res["full"].groups}
    acc = res["stop"].accounting
    assert acc.rollouts["aborted"] > 0 and acc.aborted_tokens >= 0
    assert acc.generated_tokens < res["full"].accounting.generated_tokens
    for g in res["stop"].groups:
        rs = g.rollouts
        ended = [r for r in rs if r.status != "aborted"]
        aborted = [r for r in rs if r.status == "aborted"]
        if g.prompt_id == "t0":
            assert aborted, "a group rewarded 0 everywhere is decided and stopped"
        if aborted:
            rewards = {r.reward for r in ended}
            assert len(rewards) == 1 and len(ended) >= rule.min_finished
        other = full[rs[0].group_id].rollouts
        for r in ended:  # the leaves that ended are the full tree's own
            assert r.completion_token_ids == other[r.sample_index].completion_token_ids
        for r in aborted:  # a running sample cut short, or an unborn branch: a copy of its parent so far
            o = other[r.sample_index].completion_token_ids
            assert r.completion_token_ids == o[:len(r.completion_token_ids)]
    assert any(r.status == "aborted" and r.tree_fork == len(r.completion_token_ids)
               for g in res["stop"].groups for r in g.rollouts), "some unborn branch was aborted before it cost a token"


def test_a_longer_first_window_delays_the_first_branch(tiny_ckpts):
    """`first_segment_tokens`: the root's first branch point is there, later windows keep `segment_tokens`.
    One root, fanout 2: parents [-, 0, 0, 1, 0, 1, 2, 3]; the root forks at 5, 7, 9, slot 1 (born at 5) at 7 and 9,
    slots 2 and 3 (born at 7) at 9."""
    llm = LLM(tiny_ckpts["llama"], block_size=4, max_num_seqs=32)
    for first, want in ((5, [5, 7, 7, 9, 9, 9, 9]), (None, [2, 4, 4, 6, 6, 6, 6])):
        spec = TreeSpec(branch="fixed", segment_tokens=2, first_segment_tokens=first)
        out = llm.generate([PROMPTS[0]], SamplingParams(n=8, temperature=1.0, max_tokens=16, seed=1, ignore_eos=True,
                                                        tree=spec))[0]
        check_tree_shape(out, 8)
        assert sorted(o.tree_fork for o in out.outputs if o.tree_parent is not None) == want
    with pytest.raises(ValueError, match="first_segment_tokens"):
        TreeSpec(first_segment_tokens=0)
