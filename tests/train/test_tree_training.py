"""Tree rollouts on the training side: shared completion prefixes run once (a trie per shared-prompt segment) and give
the per-sequence log-probs and gradients; per-token advantages travel through TrainBatch and the trainer; the `tree`
estimator's credit against hand-computed numbers."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.config import ConfigError, TrainConfig, load_config
from rollwise.filter import FilterRules
from rollwise.train.advantages import assign_advantages, grpo, tree
from rollwise.train.batch import TrainBatch
from rollwise.train.losses import LOSSES, LossConfig
from rollwise.train.trainer import Trainer
from rollwise.types import Rollout, RolloutGroup

from .conftest import build_tiny_llama, naive_logprobs


def _ro(prompt, comp, *, gid="g", k=0, adv=0.5, mask=None, lps=None, tok_adv=None, reward=None, status="kept"):
    n = len(comp)
    return Rollout(prompt_id=gid, group_id=gid, sample_index=k, prompt_token_ids=list(prompt),
                   completion_token_ids=list(comp), logprobs=list(lps) if lps is not None else [-0.5] * n,
                   weight_versions=[0] * n, loss_mask=list(mask) if mask is not None else [1] * n, advantage=adv,
                   token_advantages=tok_adv, reward=reward, status=status, finish_reason="stop")


def _distinct_prefixes(comps):
    return len({tuple(c[:k + 1]) for c in comps for k in range(len(c))})


def _tree_rollouts(seed=0, vocab=64):
    """Two groups. Group 'g': a 10-token trunk; leaves branching off it at depths 3, 10 and 12; a leaf that is a
    full copy of another; a leaf that ends inside the trunk (a strict prefix); env tokens (loss_mask 0) inside one
    leaf; an independent sample with its own first token. Group 'h': another prompt, two leaves sharing 2 tokens."""
    g = torch.Generator().manual_seed(seed)

    def rand(n, avoid=None):
        out = torch.randint(3, vocab, (n,), generator=g).tolist()
        if avoid is not None and n and out[0] == avoid:
            out[0] = 3 + (avoid - 3 + 1) % (vocab - 3)  # a branch's first token differs from where it branches off
        return out

    prompt = rand(5)
    trunk = rand(10)
    a_tail = rand(6)
    leaf_a = trunk + a_tail
    comps = [
        leaf_a,
        trunk + rand(4, avoid=a_tail[0]),  # branches at depth 10
        trunk[:3] + rand(8, avoid=trunk[3]),  # branches at depth 3
        list(leaf_a),  # a full copy
        leaf_a[:12] + rand(5, avoid=leaf_a[12]),  # branches at depth 12; env tokens inside (below)
        trunk[:6],  # ends inside the trunk
        rand(7, avoid=trunk[0]),  # an independent sample
    ]
    ros = []
    for k, c in enumerate(comps):
        mask = [1] * len(c)
        if k == 4:
            mask[13] = mask[14] = 0
        lps = [-1.0 - 0.1 * j if m else 0.0 for j, m in enumerate(mask)]
        ros.append(_ro(prompt, c, gid="g", k=k, mask=mask, lps=lps, adv=0.25 * k - 0.75))
    prompt_h = rand(3)
    stem = rand(2)
    for k, c in enumerate([stem + rand(3), stem + rand(4)]):
        ros.append(_ro(prompt_h, c, gid="h", k=k, lps=[-1.5] * len(c), adv=1.0 - 2 * k))
    return ros


# ------------------------------------------------------------------------------------------------ layout


def test_tree_rows_hold_each_prefix_once():
    ros = _tree_rollouts()
    b = TrainBatch.from_rollouts(ros, 4096)
    g = [r.completion_token_ids for r in ros if r.group_id == "g"]
    h = [r.completion_token_ids for r in ros if r.group_id == "h"]
    # hand count, group g: trunk 10 + leaf a's tail 6 + 4 + 8 + (copy: 0) + 5 + (prefix: 0) + 7 = 40 nodes
    assert _distinct_prefixes(g) == 40 and _distinct_prefixes(h) == 2 + 3 + 4
    assert b.row_tokens == (5 + 40) + (3 + 9)  # against 7 x 5 + 87 + 2 x 3 + 11 = 139 unshared
    assert b.num_tokens == sum(len(r.prompt_token_ids) + len(r.completion_token_ids) for r in ros) == 139
    plain = TrainBatch.from_rollouts(ros, 4096, share_prompt=False)
    assert plain.row_tokens == plain.num_tokens == 139
    assert b.with_layout(False).row_tokens == 139 and b.with_layout(False).with_layout(True).row_tokens == 57


def _segment_paths(mb, sg):
    """Row contents of each node's root-to-node path (prompt included), by following `parent`."""
    paths = []
    for j in range(sg.length):
        p = sg.parent[j]
        paths.append((paths[p] if p >= 0 else ()) + (int(mb.input_ids[sg.start + j]),))
    return paths


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.lists(st.integers(3, 5), max_size=6), min_size=1, max_size=6)),
                min_size=1, max_size=4), st.integers(3, 40))
def test_trie_layout_properties(groups, cap):
    """Random groups over a 3-token alphabet (so completions share prefixes often): every node's row path is a
    prefix of its segment's sequences, no prefix appears twice in a segment, positions are depths, the mask is
    ancestor-or-self, every target is predicted by the node of the token before it, and a group that fits in a row
    takes exactly prompt + distinct completion prefixes."""
    ros = [_ro([40 + pid] * (pid + 1), comp, gid=str(gi), k=k) for gi, (pid, comps) in enumerate(groups)
           for k, comp in enumerate(comps)]
    b = TrainBatch.from_rollouts(ros, cap)
    seen = []
    for mb in b.micro_batches:
        for sg in mb.segments:
            assert sg.length <= cap or len(sg.seq_ids) == 1
            paths = _segment_paths(mb, sg)
            full = {tuple(b.tokens[s]) for s in sg.seq_ids}
            assert len(set(paths)) == len(paths)  # each prefix once
            assert all(any(f[:len(q)] == q for f in full) for q in paths)
            assert mb.position_ids[sg.start:sg.start + sg.length].tolist() == [len(q) - 1 for q in paths]
            want = torch.tensor([[paths[i][:len(paths[j])] == paths[j] for j in range(sg.length)]
                                 for i in range(sg.length)])
            assert torch.equal(sg.mask(), want)
            seen.extend(sg.seq_ids)
        for pos, s, k, t in zip(mb.pred_positions.tolist(), mb.target_seq.tolist(), mb.target_tok.tolist(),
                                mb.target_ids.tolist()):
            sg = next(x for x in mb.segments if x.start <= pos < x.start + x.length)
            p = b.prompt_lens[s]
            assert _segment_paths(mb, sg)[pos - sg.start] == tuple(b.tokens[s][:p + k]) and b.tokens[s][p + k] == t
    assert sorted(seen) == list(range(len(ros)))
    by_prompt = {}
    for r in ros:
        by_prompt.setdefault(tuple(r.prompt_token_ids), []).append(r.completion_token_ids)
    if cap >= max(len(p) + _distinct_prefixes(c) for p, c in by_prompt.items()):
        assert b.row_tokens == sum(len(p) + _distinct_prefixes(c) for p, c in by_prompt.items())


def test_binary_tree_saving():
    """The figure docs/tree.md quotes: 8 leaves of 32 tokens, binary, branching every 8 tokens (the plan
    TreeSpec(branch='fixed', fanout=2, segment_tokens=8) gives): 8 + 16 + 32 + 64 = 120 completion tokens run
    instead of 256; with a 128-token prompt, 248 row tokens instead of 8 x 160 = 1280 (384 sharing the prompt only)."""
    g = torch.Generator().manual_seed(0)
    comps = [[]]
    for _ in range(4):  # four 8-token levels; below the first one every node splits in two
        comps = [c + torch.randint(3, 64, (8,), generator=g).tolist() for c in comps for _ in range(1 if not c else 2)]
    assert len(comps) == 8 and all(len(c) == 32 for c in comps)
    prompt = torch.randint(3, 64, (128,), generator=g).tolist()
    b = TrainBatch.from_rollouts([_ro(prompt, c, k=k) for k, c in enumerate(comps)], 4096)
    assert b.row_tokens == 128 + 120 and b.num_tokens == 1280
    assert TrainBatch.from_rollouts([_ro(prompt, c) for c in comps], 4096, share_prompt=False).row_tokens == 1280


# ------------------------------------------------------------------------------------------------ exactness


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def trainer(request, tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tree_" + request.param), seed=3, tie=True, attn=request.param)
    tr = Trainer(path, TrainConfig(lr=1e-3), device="cpu", attn_implementation=request.param)
    assert tr.share_prompt
    return tr


@pytest.mark.parametrize("cap", [4096, 24])  # one segment per group; the tree split over several segments
def test_tree_logprobs_equal_naive(trainer, cap):
    ros = _tree_rollouts(seed=1)
    shared = TrainBatch.from_rollouts(ros, cap)
    if cap == 24:
        assert len([sg for mb in shared.micro_batches for sg in mb.segments]) > 2
    a = trainer.compute_logprobs(shared)
    with torch.no_grad():
        c = naive_logprobs(trainer.model, ros, a.shape[1])
    assert torch.allclose(a, c, atol=1e-5, rtol=0)
    assert (a != 0).sum() == sum(len(r.completion_token_ids) for r in ros)


def test_tree_gradients_equal_naive(trainer):
    """Random per-token weights on the log-probs: the parameter gradient of the trie rows equals the naive one."""
    ros = _tree_rollouts(seed=2)
    batch = TrainBatch.from_rollouts(ros, 4096)
    w = torch.randn(len(ros), batch.max_completion_len, generator=torch.Generator().manual_seed(2))
    tr = trainer
    tr.model.zero_grad(set_to_none=True)
    for mb in batch.micro_batches:
        lp, _ = tr._row_logprobs(tr.model, mb, need_entropy=False)
        (tr._scatter(lp, mb, w.shape[1]) * w[torch.tensor(mb.seq_ids)]).sum().backward()
    gs = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    tr.model.zero_grad(set_to_none=True)
    (naive_logprobs(tr.model, ros, w.shape[1]) * w).sum().backward()
    gn = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    tr.model.zero_grad(set_to_none=True)
    assert gs.keys() == gn.keys() and len(gs) > 5
    for n in gs:
        scale = max(gn[n].abs().max().item(), 1.0)
        assert (gs[n] - gn[n]).abs().max().item() <= 1e-5 * scale, n


def _sgd(tr):
    """Plain SGD with lr 1: a step's parameter change IS the (clipped) gradient."""
    tr.optimizer = torch.optim.SGD([p for p in tr.model.parameters() if p.requires_grad], lr=1.0)
    tr.scheduler = torch.optim.lr_scheduler.LambdaLR(tr.optimizer, lambda s: 1.0)
    return tr


@pytest.mark.parametrize("loss_name, cap", [("grpo", 4096), ("dapo", 24)])
def test_tree_train_step_equals_naive_update(tmp_path, loss_name, cap):
    """The real Trainer.train_step on a tree batch with `tree` per-token advantages: its parameter change (SGD, lr 1)
    is the gradient of the loss on naive per-sequence log-probs, to 1e-5."""
    path = build_tiny_llama(tmp_path / "m", seed=8)
    tr = _sgd(Trainer(path, TrainConfig(grad_clip=100.0), device="cpu"))
    tr.skip_zero_advantage = False
    ros = _tree_rollouts(seed=3)
    with torch.no_grad():  # behaviour log-probs near the current policy's, so the ratios are not all clipped
        base = naive_logprobs(tr.model, ros, max(len(r.completion_token_ids) for r in ros))
    noise = torch.Generator().manual_seed(4)
    rewards = {"g": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0], "h": [1.0, 0.0]}
    for i, r in enumerate(ros):
        n = len(r.completion_token_ids)
        r.logprobs = [float(base[i, j] + 0.05 * torch.randn(1, generator=noise)) if r.loss_mask[j] else 0.0
                      for j in range(n)]
        r.reward = rewards[r.group_id][r.sample_index]
    groups = [RolloutGroup(gid, gid, [r for r in ros if r.group_id == gid]) for gid in ("g", "h")]
    assign_advantages(groups, "tree", eps=1e-6)
    assert all(r.token_advantages is not None for r in ros)
    naive = copy.deepcopy(tr.model)
    before = [p.detach().clone() for p in tr.model.parameters()]
    lcfg = LossConfig.from_algo(load_config(None, [f"algo.loss={loss_name}"]).algo, max_length=32)
    m = tr.train_step(TrainBatch.from_rollouts(ros, cap), LOSSES[loss_name], lcfg)
    assert m["forward_tokens"] == TrainBatch.from_rollouts(ros, cap).row_tokens < m["train_tokens"]

    full = TrainBatch.from_rollouts(ros, 10_000, share_prompt=False)
    assert full.advantages.shape == full.loss_mask.shape
    loss, _ = LOSSES[loss_name](naive_logprobs(naive, ros, full.max_completion_len), full.old_logprobs,
                                full.advantages, full.loss_mask, cfg=lcfg)
    loss.backward()
    assert m["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-6)
    for (name, a), b0, b in zip(tr.model.named_parameters(), before, naive.parameters()):
        scale = max(b.grad.abs().max().item(), 1.0)
        assert (b0 - a - b.grad).abs().max().item() <= 1e-5 * scale, name


# ------------------------------------------------------------------------------------------------ per-token advantages


def test_token_advantages_layout_subset_and_errors():
    ros = [_ro([1, 2], [5, 6, 7], k=0, adv=None, tok_adv=[0.1, 0.2, 0.3]),
           _ro([1, 2], [5, 8], k=1, tok_adv=[0.1, -0.4]),
           _ro([3], [9], k=2, tok_adv=[0.0])]
    b = TrainBatch.from_rollouts(ros, 64)
    assert b.advantages.shape == (3, 3)
    assert b.advantages.tolist() == [[pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)],
                                     [pytest.approx(0.1), pytest.approx(-0.4), 0.0], [0.0, 0.0, 0.0]]
    sub = b.subset([1, 2])
    assert sub.advantages.shape == (2, 2) and sub.advantages.tolist() == [[pytest.approx(0.1), pytest.approx(-0.4)],
                                                                         [0.0, 0.0]]
    assert torch.equal(b.with_layout(False).advantages, b.advantages)
    with pytest.raises(ValueError, match=r"rollout g/1 has no token_advantages but rollout g/0 has"):
        TrainBatch.from_rollouts([ros[0], _ro([1, 2], [5], k=1)], 64)
    with pytest.raises(ValueError, match=r"rollout g/1 has token_advantages but rollout g/0 has none"):
        TrainBatch.from_rollouts([_ro([1, 2], [5]), ros[1]], 64)
    with pytest.raises(ValueError, match=r"rollout g/0: 3 completion tokens but 2 token_advantages"):
        TrainBatch.from_rollouts([_ro([1, 2], [5, 6, 7], tok_adv=[0.1, 0.2])], 64)


def test_token_advantages_train_like_scalars_and_skip_exactly(tmp_path):
    """Per-token advantages equal to a sequence's scalar on every token give the scalar update (two shuffled
    mini-batches: subset slicing); sequences whose loss tokens all have 0 advantage are skipped without changing it."""
    path = build_tiny_llama(tmp_path / "m", seed=9)
    ros = _tree_rollouts(seed=5)
    for r in ros:
        if r.group_id == "h":
            r.advantage = 0.0
    ros[4].advantage = 0.0
    tokened = [copy.deepcopy(r) for r in ros]
    for r in tokened:
        r.token_advantages = [r.advantage] * len(r.completion_token_ids)
    tokened[4].token_advantages = [0.0] * 13 + [5.0, 5.0] + [0.0] * 2  # nonzero on its env tokens only
    runs = []
    for rs, skip in ((ros, False), (tokened, True), (tokened, False)):
        tr = _sgd(Trainer(path, TrainConfig(updates_per_step=2), device="cpu"))  # SGD: no AdamW sign amplification
        tr.skip_zero_advantage = skip
        m = tr.train_step(TrainBatch.from_rollouts(rs, 32), LOSSES["grpo"], LossConfig(),
                          generator=torch.Generator().manual_seed(0))
        runs.append((m, torch.cat([p.detach().flatten() for p in tr.model.parameters()])))
    (m0, p0), (m1, p1), (m2, p2) = runs
    # group h, rollout g/4 (env tokens only) and g/3 (its scalar, 0.25 x 3 - 0.75, is 0)
    assert m1["zero_adv_sequences"] == 4 and m2["zero_adv_sequences"] == 0
    assert m1["forward_tokens"] < m2["forward_tokens"]
    assert m1["loss"] == pytest.approx(m0["loss"], abs=1e-6) and m2["loss"] == pytest.approx(m0["loss"], abs=1e-6)
    assert torch.allclose(p0, p2, atol=1e-6, rtol=0) and torch.allclose(p1, p2, atol=1e-6, rtol=0)
    start = torch.cat([p.detach().flatten() for p in Trainer(path, device="cpu").model.parameters()])
    assert (p1 - start).abs().max() > 1e-3  # the update is not trivially zero


# ------------------------------------------------------------------------------------------------ tree advantages


SIGMA = math.sqrt(0.3)


def test_tree_advantages_hand_computed():
    """Leaves (tokens -> value): c0 1 2 3 4 -> 1; c1 1 2 3 5 -> 0; c2 = c3 = 1 2 6 -> 1; c4 7 8 -> 0; c6 1 -> 0;
    c5 1 2 3 4 errored (left out with errored_reward null). Valid values 1 0 1 1 0 0: mean 0.5, unbiased var
    6 x 0.25 / 5 = 0.3. Segments and V (the mean value of the valid leaves through them):
      [1]: c0 c1 c2 c3 c6 -> 3/5 = 0.6 (c6 ends here)   A = ((0.6 - 0.5) + (0.6 - 0.5)) / 2   =  0.1
      [2]: c0 c1 c2 c3 -> 0.75, parent [1]              A = ((0.75 - 0.5) + (0.75 - 0.6)) / 2 =  0.2
      [3]: c0 c1 -> 0.5, parent [2]                     A = ((0.5 - 0.5) + (0.5 - 0.75)) / 2  = -0.125
      [4]: c0 -> 1, parent [3]                          A = ((1 - 0.5) + (1 - 0.5)) / 2       =  0.5
      [5]: c1 -> 0, parent [3]                          A = ((0 - 0.5) + (0 - 0.5)) / 2       = -0.5
      [6]: c2 c3 -> 1, parent [2]                       A = ((1 - 0.5) + (1 - 0.75)) / 2      =  0.375
      [7 8]: c4 -> 0, parent root                       A = ((0 - 0.5) + (0 - 0.5)) / 2       = -0.5
    all over sigma = sqrt(0.3); the scalar advantage is GRPO's: (v - 0.5) / sigma = +-0.5 / sigma."""
    spec = [([1, 2, 3, 4], 1.0), ([1, 2, 3, 5], 0.0), ([1, 2, 6], 1.0), ([1, 2, 6], 1.0), ([7, 8], 0.0),
            ([1, 2, 3, 4], None), ([1], 0.0)]
    ros = [_ro([9], c, k=k, adv=None, reward=v, status="kept" if v is not None else "errored")
           for k, (c, v) in enumerate(spec)]
    group = RolloutGroup("g", "g", ros)
    adv = assign_advantages([group], "tree", rules=FilterRules(errored_reward=None), eps=0.0, baseline="group")
    want = [[0.1, 0.2, -0.125, 0.5], [0.1, 0.2, -0.125, -0.5], [0.1, 0.2, 0.375], [0.1, 0.2, 0.375], [-0.5, -0.5],
            [0.0, 0.0, 0.0, 0.0], [0.1]]
    for r, w in zip(ros, want):
        assert r.token_advantages == pytest.approx([x / SIGMA for x in w], abs=1e-12), r.sample_index
    assert [r.advantage for r in ros] == pytest.approx([0.5 / SIGMA, -0.5 / SIGMA, 0.5 / SIGMA, 0.5 / SIGMA,
                                                        -0.5 / SIGMA, 0.0, -0.5 / SIGMA], abs=1e-12)
    assert adv.shape == (1, 7)
    # with errored_reward 0.0 (the default) c5 is a wrong answer with a value: it enters the trie and the V's
    assign_advantages([group], "tree", eps=0.0)
    assert ros[5].token_advantages != [0.0] * 4 and ros[0].token_advantages[3] != pytest.approx(0.5 / SIGMA)


def test_independent_samples_get_grpo_on_every_token():
    g = torch.Generator().manual_seed(0)
    values = torch.rand(6, generator=g).tolist()
    comps = [[10 + k] + torch.randint(3, 64, (int(torch.randint(0, 9, (1,), generator=g)),), generator=g).tolist()
             for k in range(6)]
    tok = tree(comps, values, eps=1e-6)
    scalar = grpo(torch.tensor([values], dtype=torch.float64), eps=1e-6)[0].tolist()
    for c, t, a in zip(comps, tok, scalar):
        assert len(t) == len(c) and t == pytest.approx([a] * len(c), rel=1e-12, abs=1e-15)


def test_invalid_leaves_get_zeros_and_stay_out_of_the_values():
    comps = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3, 6]]
    with_bad = tree(comps, [1.0, 0.0, 0.0, None])
    without = tree(comps[:3], [1.0, 0.0, 0.0])
    assert with_bad[3] == [0.0] * 4 and with_bad[:3] == without
    # zero variance (or one valid value): no signal, 0 everywhere
    assert tree(comps, [1.0, 1.0, 1.0, None]) == [[0.0] * len(c) for c in comps]
    assert tree(comps, [None, None, 2.0, None]) == [[0.0] * len(c) for c in comps]
    with pytest.raises(ValueError, match="4 completions but 3 values"):
        tree(comps, [1.0, 0.0, 0.0])


def test_table_estimators_clear_token_advantages_and_config():
    ros = [_ro([9], [1, 2], k=0, reward=1.0), _ro([9], [1, 3], k=1, reward=0.0)]
    group = RolloutGroup("g", "g", ros)
    assign_advantages([group], "tree")
    assert ros[0].token_advantages is not None
    assign_advantages([group], "grpo")
    assert ros[0].token_advantages is None and ros[0].advantage > 0
    assert load_config(None, ["algo.advantage=tree"]).algo.advantage == "tree"
    with pytest.raises(ConfigError, match="algo.advantage 'tree' gives one advantage per token.*gspo") as e:
        load_config(None, ["algo.advantage=tree", "algo.loss=gspo"])
    assert "\n" not in str(e.value)


def test_tree_batch_on_two_ranks_equals_one_rank(tiny_llama_tied):
    """Per-token advantages travel with the rollouts to every rank (`cluster/ranks.py` pickles them whole); each rank
    runs its share's tries; 2 ranks (DDP, gloo) give the 1-rank weights."""
    from rollwise.cluster.ranks import LocalRanks
    from rollwise.cluster.trainer_handle import TrainerSpec

    ros = _tree_rollouts(seed=6)
    rewards = {"g": [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], "h": [0.0, 1.0]}
    for r in ros:
        r.reward = rewards[r.group_id][r.sample_index]
    assign_advantages([RolloutGroup(gid, gid, [r for r in ros if r.group_id == gid]) for gid in ("g", "h")], "tree")

    def spec(world, mbt=32):
        return TrainerSpec(model_path=str(tiny_llama_tied), train=TrainConfig(lr=1e-2, micro_batch_tokens=mbt),
                           loss_name="grpo", loss_cfg=LossConfig(), device="cpu", threads=1, world_size=world,
                           parallel="ddp", total_steps=1)

    one = spec(1).build()
    m1 = one.train_step(ros)
    w1 = {k: v.detach().clone() for k, v in one.weights().items()}
    ranks = LocalRanks(spec(2))
    try:
        m2 = ranks.train_step(ros)
        w2 = ranks.weights()
    finally:
        ranks.shutdown()
    assert m1["forward_tokens"] == m2["forward_tokens"] == TrainBatch.from_rollouts(ros, 32).row_tokens
    # the yardstick of float rounding on this CPU: the same step on one rank, its rows packed under another cap
    # (AdamW's first step magnifies rounding for weights whose gradient is near 0, by an amount set by the kernels)
    pack = spec(1, mbt=64).build()
    m_pack = pack.train_step(ros)
    w_pack = pack.weights()
    d_pack = max(float((w1[k] - w_pack[k]).abs().max()) for k in w1)
    assert m1["loss"] == pytest.approx(m2["loss"], abs=max(1e-5, 4 * abs(m1["loss"] - m_pack["loss"])))
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= max(1e-5, 4 * d_pack)
