"""Shared-prompt training rows: each group's prompt runs once and its completions attend to it through per-segment
attention. Log-probs and gradients must equal the unshared packed path and a naive per-sequence forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.config import TrainConfig
from rollwise.train.batch import TrainBatch
from rollwise.train.trainer import Trainer
from rollwise.types import Rollout

from .conftest import build_tiny_llama, naive_logprobs
from .synthetic import SPEC, _groups


def _ro(prompt, comp):
    n = len(comp)
    return Rollout(prompt_id="p", group_id="g", sample_index=0, prompt_token_ids=list(prompt),
                   completion_token_ids=list(comp), logprobs=[-0.5] * n, weight_versions=[0] * n, loss_mask=[1] * n,
                   advantage=0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 5), st.lists(st.integers(0, 6), min_size=1, max_size=4)),
                min_size=1, max_size=8), st.integers(4, 30))
def test_segment_rows_cover_every_sequence(shapes, cap):
    ros = [_ro([100 + pid] * p, range(10 * i, 10 * i + c)) for i, (pid, p, cs) in enumerate(shapes) for c in cs]
    batch = TrainBatch.from_rollouts(ros, cap)
    assert batch.share_prompt
    seen = []
    for mb in batch.micro_batches:
        assert mb.segments is not None
        o = 0
        for sg in mb.segments:
            assert sg.start == o  # segments tile the row
            assert mb.num_tokens <= cap or len(mb.segments) == 1
            assert sg.length <= cap or len(sg.seq_ids) == 1  # a group is split rather than overflow a row
            prompt = batch.tokens[sg.seq_ids[0]][:sg.prompt_len]
            assert mb.input_ids[o:o + sg.prompt_len].tolist() == prompt
            assert mb.position_ids[o:o + sg.prompt_len].tolist() == list(range(sg.prompt_len))
            # NOTE: the completions of one shape (range(10 * i, 10 * i + c) for each c) are prefixes of each other, so
            # since shared prefixes are laid out as a trie they are no longer back to back: each distinct prefix is
            # one node, at position = depth, under its parent (this used to check contiguous completions)
            comps = [batch.tokens[sid][sg.prompt_len:] for sid in sg.seq_ids]
            for sid in sg.seq_ids:
                assert batch.tokens[sid][:sg.prompt_len] == prompt
            assert sg.length == sg.prompt_len + len({tuple(c[:k + 1]) for c in comps for k in range(len(c))})
            depth = []
            for j, par in enumerate(sg.parent):
                assert par < j
                depth.append(depth[par] + 1 if par >= 0 else 0)
            assert mb.position_ids[o:o + sg.length].tolist() == depth
            anc = torch.zeros(sg.length, sg.length, dtype=torch.bool)
            for j in range(sg.length):
                a = j
                while a >= 0:
                    anc[j, a] = True
                    a = sg.parent[a]
            assert torch.equal(sg.mask(), anc)  # ancestor-or-self
            o += sg.length
            seen.extend(sg.seq_ids)
        assert o == mb.num_tokens
        assert mb.seq_ids == [s for sg in mb.segments for s in sg.seq_ids]
        for pos, t_seq, t_tok, t_id in zip(mb.pred_positions.tolist(), mb.target_seq.tolist(), mb.target_tok.tolist(),
                                           mb.target_ids.tolist()):
            assert ros[t_seq].completion_token_ids[t_tok] == t_id
            # the predicting position holds the token just before the target in its own sequence
            seq = batch.tokens[t_seq]
            assert mb.input_ids[pos].item() == seq[batch.prompt_lens[t_seq] + t_tok - 1]
            assert mb.position_ids[pos].item() == batch.prompt_lens[t_seq] + t_tok - 1
            # ... and sits under the node that predicts the token before it: the targets walk one trie path
            sg = next(g for g in mb.segments if g.start <= pos < g.start + g.length)
            prev = [p for p, s_, k in zip(mb.pred_positions.tolist(), mb.target_seq.tolist(), mb.target_tok.tolist())
                    if s_ == t_seq and k == t_tok - 1]
            want_parent = prev[0] - sg.start if t_tok else sg.prompt_len - 2
            assert sg.parent[pos - sg.start] == want_parent
    assert sorted(seen) == list(range(len(ros)))
    # the shared layout never runs more tokens than the unshared one, and fewer as soon as a prompt is shared
    assert batch.row_tokens <= batch.num_tokens


def test_segment_mask_structure():
    ros = [_ro([1, 2], [5, 6]), _ro([1, 2], [7])]
    mb = TrainBatch.from_rollouts(ros, 64).micro_batches[0]
    assert mb.input_ids.tolist() == [1, 2, 5, 6, 7] and mb.position_ids.tolist() == [0, 1, 2, 3, 2]
    m = mb.attention_mask()[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 1, 1, 0, 0],
                 [1, 1, 1, 1, 0],
                 [1, 1, 0, 0, 1]]  # the second completion sees the prompt, not the first completion
    assert mb.pred_positions.tolist() == [1, 2, 1]  # both first tokens come from the prompt's last position


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def trainer(request, tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("shared_" + request.param), seed=3, tie=True, attn=request.param)
    tr = Trainer(path, TrainConfig(lr=1e-3), device="cpu", attn_implementation=request.param)
    assert tr.share_prompt
    return tr


def test_shared_logprobs_equal_unshared_and_naive(trainer):
    ros = _groups(SPEC)
    shared = TrainBatch.from_rollouts(ros, 24)
    plain = TrainBatch.from_rollouts(ros, 24, share_prompt=False)
    assert shared.row_tokens < plain.row_tokens
    a = trainer.compute_logprobs(shared)
    b = trainer.compute_logprobs(plain)
    with torch.no_grad():
        c = naive_logprobs(trainer.model, ros, a.shape[1])
    assert torch.allclose(a, b, atol=1e-5, rtol=0) and torch.allclose(a, c, atol=1e-5, rtol=0)
    assert (a != 0).sum() == sum(len(r.completion_token_ids) for r in ros)


def _grads(tr, batch, weights):
    tr.model.zero_grad(set_to_none=True)
    for mb in batch.micro_batches:
        lp, _ = tr._row_logprobs(tr.model, mb, need_entropy=False)
        full = tr._scatter(lp, mb, weights.shape[1])
        (full * weights[torch.tensor(mb.seq_ids)]).sum().backward()
    g = {n: p.grad.detach().clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    tr.model.zero_grad(set_to_none=True)
    return g


def test_shared_gradients_equal_unshared_and_naive(trainer):
    ros = _groups(SPEC, seed=1)
    shared = TrainBatch.from_rollouts(ros, 20)
    plain = TrainBatch.from_rollouts(ros, 20, share_prompt=False)
    w = torch.randn(len(ros), shared.max_completion_len, generator=torch.Generator().manual_seed(2))
    gs, gp = _grads(trainer, shared, w), _grads(trainer, plain, w)
    trainer.model.zero_grad(set_to_none=True)
    (naive_logprobs(trainer.model, ros, w.shape[1]) * w).sum().backward()
    gn = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    assert gs.keys() == gp.keys() == gn.keys() and len(gs) > 5
    for n in gs:
        scale = max(gn[n].abs().max().item(), 1.0)
        assert (gs[n] - gp[n]).abs().max().item() <= 1e-5 * scale, n
        assert (gs[n] - gn[n]).abs().max().item() <= 1e-5 * scale, n


def test_group_split_over_rows_is_still_exact(trainer):
    ros = _groups([(6, [5, 5, 5, 5, 5])], seed=4)
    split = TrainBatch.from_rollouts(ros, 17)  # the prompt plus two completions per segment
    assert len([sg for mb in split.micro_batches for sg in mb.segments]) == 3
    a = trainer.compute_logprobs(split)
    b = trainer.compute_logprobs(TrainBatch.from_rollouts(ros, 17, share_prompt=False))
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


def test_train_step_runs_shared_and_reports_forward_tokens(tmp_path):
    path = build_tiny_llama(tmp_path / "m", seed=5)
    from rollwise.train.losses import LOSSES, LossConfig

    ros = _groups(SPEC, seed=6)
    metrics = {}
    for share in (True, False):
        tr = Trainer(path, TrainConfig(lr=1e-3), device="cpu")
        tr.skip_zero_advantage = False  # every sequence runs: forward_tokens is the rows' length
        m = tr.train_step(TrainBatch.from_rollouts(ros, 32, share_prompt=share), LOSSES["grpo"], LossConfig())
        metrics[share] = (m, {n: p.detach().clone() for n, p in tr.model.named_parameters()})
    (ms, ps), (mp, pp) = metrics[True], metrics[False]
    assert ms["forward_tokens"] < mp["forward_tokens"] == ms["train_tokens"]
    assert ms["loss"] == pytest.approx(mp["loss"], abs=1e-5)
    assert ms["grad_norm"] == pytest.approx(mp["grad_norm"], rel=1e-4)
    for n in ps:
        assert torch.allclose(ps[n], pp[n], atol=1e-6), n


def test_model_without_segment_attention_gets_unshared_rows(trainer):
    ros = _groups(SPEC, seed=7)
    want = trainer.compute_logprobs(TrainBatch.from_rollouts(ros, 24))
    trainer.share_prompt = False  # what a flash-attention model reports
    try:
        got = trainer.compute_logprobs(TrainBatch.from_rollouts(ros, 24))
    finally:
        trainer.share_prompt = True
    assert torch.allclose(want, got, atol=1e-5, rtol=0)


def test_zero_advantage_sequences_are_skipped_exactly(tmp_path):
    """Sequences with zero advantage carry no gradient without a KL term: skipping their forward changes nothing,
    also when a whole update has nothing left (AdamW still steps on zeros, moving weights by its momentum)."""
    from rollwise.train.losses import LOSSES, LossConfig

    path = build_tiny_llama(tmp_path / "m", seed=11)
    ros = _groups(SPEC, seed=12)
    for r in ros:
        if r.group_id in ("1", "3"):
            r.advantage = 0.0
    zero = _groups(SPEC, seed=13)
    for r in zero:
        r.advantage = 0.0
    runs = {}
    for skip in (True, False):
        tr = Trainer(path, TrainConfig(lr=1e-2), device="cpu")
        tr.skip_zero_advantage = skip
        m1 = tr.train_step(TrainBatch.from_rollouts(ros, 32), LOSSES["grpo"], LossConfig())
        m2 = tr.train_step(TrainBatch.from_rollouts(zero, 32), LOSSES["grpo"], LossConfig())
        runs[skip] = (m1, m2, {n: p.detach().clone() for n, p in tr.model.named_parameters()})
    (a1, a2, pa), (b1, b2, pb) = runs[True], runs[False]
    assert a1["zero_adv_sequences"] == 6 and a2["zero_adv_sequences"] == len(zero) - 1 and b1["zero_adv_sequences"] == 0
    # with nothing carrying gradient, the shortest sequence still runs for the entropy / log-prob-gap metrics
    assert a1["forward_tokens"] < b1["forward_tokens"] and 0 < a2["forward_tokens"] < b2["forward_tokens"]
    assert "entropy" in a2 and a2["logprob_diff_max"] > 0
    assert a1["loss"] == pytest.approx(b1["loss"], abs=1e-6) and a1["grad_norm"] == pytest.approx(b1["grad_norm"], rel=1e-5)
    assert a2["grad_norm"] == b2["grad_norm"] == 0.0
    for n in pa:
        assert torch.allclose(pa[n], pb[n], atol=1e-6), n
