"""TrainBatch layout and first-fit-decreasing packing: every token exactly once, no padding, rows within the cap,
positions restarting per sequence, targets pointing at the right logits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.train.batch import TrainBatch, pack_first_fit_decreasing
from rollwise.types import Rollout


def _ro(prompt, comp, adv=0.5, mask=None, lps=None):
    n = len(comp)
    return Rollout(prompt_id="p", group_id="g", sample_index=0, prompt_token_ids=list(prompt),
                   completion_token_ids=list(comp), logprobs=lps if lps is not None else [-0.5] * n,
                   weight_versions=[3] * n, loss_mask=mask if mask is not None else [1] * n, advantage=adv)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(1, 60))
def test_ffd_packing_properties(lengths, cap):
    bins = pack_first_fit_decreasing(lengths, cap)
    flat = sorted(i for b in bins for i in b)
    assert flat == list(range(len(lengths)))  # each item exactly once
    loads = [sum(lengths[i] for i in b) for b in bins]
    for b, load in zip(bins, loads):
        assert load <= cap or len(b) == 1  # only an oversize item may exceed the cap, alone
    # first-fit: no two bins could have been merged
    for i in range(len(bins)):
        for j in range(i + 1, len(bins)):
            assert loads[i] + loads[j] > cap


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 7)), min_size=1, max_size=12), st.integers(4, 30))
def test_packed_rows_cover_every_sequence(shapes, cap):
    ros = [_ro(range(100 + 10 * i, 100 + 10 * i + p), range(10 * i, 10 * i + c), adv=float(i)) for i, (p, c) in enumerate(shapes)]
    batch = TrainBatch.from_rollouts(ros, cap, share_prompt=False)
    assert sum(mb.num_tokens for mb in batch.micro_batches) == batch.num_tokens == sum(p + c for p, c in shapes)
    seen = []
    for mb in batch.micro_batches:
        assert mb.num_tokens <= cap or len(mb.seq_ids) == 1
        start = 0
        for sid in mb.seq_ids:
            seq = batch.tokens[sid]
            n = len(seq)
            assert mb.input_ids[start:start + n].tolist() == seq
            assert mb.position_ids[start:start + n].tolist() == list(range(n))
            assert mb.seq_index[start:start + n].tolist() == [sid] * n
            start += n
        seen.extend(mb.seq_ids)
        # each target is the input token one position after its predicting logit
        assert torch.equal(mb.input_ids[mb.pred_positions + 1], mb.target_ids)
        assert torch.equal(mb.seq_index[mb.pred_positions + 1], mb.target_seq)
        for t_seq, t_tok, t_id in zip(mb.target_seq.tolist(), mb.target_tok.tolist(), mb.target_ids.tolist()):
            assert ros[t_seq].completion_token_ids[t_tok] == t_id
    assert sorted(seen) == list(range(len(ros)))
    assert batch.advantages.tolist() == [float(i) for i in range(len(ros))]


def test_layout_and_masks():
    ros = [_ro([1, 2], [5, 6, 7], adv=1.0, mask=[1, 0, 1], lps=[-0.1, -9.0, -0.3]), _ro([3], [8], adv=-1.0)]
    b = TrainBatch.from_rollouts(ros, 16)
    assert b.old_logprobs.shape == b.loss_mask.shape == (2, 3)
    # the env token's stray "log-prob" is zeroed; padding is zero
    assert b.old_logprobs.tolist() == [[pytest.approx(-0.1), 0.0, pytest.approx(-0.3)], [-0.5, 0.0, 0.0]]
    assert b.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0]]
    assert b.completion_lens.tolist() == [3, 1] and b.prompt_lens == [2, 1]
    assert len(b.micro_batches) == 1
    mask = b.micro_batches[0].attention_mask()
    assert mask.shape == (1, 1, 7, 7)
    sub = b.subset([1])
    assert sub.num_sequences == 1 and sub.old_logprobs.shape == (1, 1) and sub.advantages.tolist() == [-1.0]


def test_bad_rollouts_fail_with_one_line():
    with pytest.raises(ValueError, match="no advantage"):
        TrainBatch.from_rollouts([_ro([1], [2], adv=None)], 8)
    with pytest.raises(ValueError, match="1 completion tokens but 2 logprobs"):
        TrainBatch.from_rollouts([_ro([1], [2], lps=[-1.0, -1.0])], 8)
    with pytest.raises(ValueError, match="empty prompt"):
        TrainBatch.from_rollouts([_ro([], [2])], 8)
    with pytest.raises(ValueError, match="no rollouts"):
        TrainBatch.from_rollouts([], 8)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        pack_first_fit_decreasing([3], 0)
