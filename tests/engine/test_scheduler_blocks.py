"""Scheduler and block manager with hand-made inputs: no model, no torch."""

from __future__ import annotations

import pytest

from rollwise.engine.block_manager import BlockManager, NoFreeBlocksError
from rollwise.engine.scheduler import Scheduler, SchedulerConfig
from rollwise.engine.sequence import Sequence, SeqStatus
from rollwise.types import SamplingParams


def seq(tokens, rid="r", j=0, max_tokens=8):
    return Sequence(rid, j, list(tokens), len(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True), seed=j)


def test_allocate_and_free_return_every_block():
    bm = BlockManager(10, 4)
    s = seq(range(10))
    bm.allocate(s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7
    bm.free_seq(s)
    assert bm.num_free_blocks == 10 and s.block_table == []
    assert all(r == 0 for r in bm.ref_count)


def test_prefix_hits_share_full_blocks_only_and_leave_one_token():
    bm = BlockManager(10, 4)
    a = seq(range(9))  # blocks [0..3] [4..7] [8]
    bm.allocate(a)
    b = seq(list(range(8)) + [99, 100])
    bm.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.num_cached_tokens == 8
    assert b.block_table[2] != a.block_table[2]
    assert bm.ref_count[a.block_table[0]] == 2
    # Exactly the cached prefix as a prompt: the last block is recomputed to produce logits.
    c = seq(range(8))
    bm.allocate(c)
    assert c.num_cached_tokens == 4 and c.block_table[0] == a.block_table[0] and c.block_table[1] != a.block_table[1]


def test_freed_blocks_stay_findable_until_reused_and_reset_forgets():
    bm = BlockManager(4, 4)
    a = seq(range(9))
    bm.allocate(a)
    blocks = list(a.block_table)
    bm.free_seq(a)
    b = seq(range(9))
    assert bm.blocks_to_allocate(b) == 3  # hits on free blocks still take them out of the pool
    bm.allocate(b)
    assert b.block_table[:2] == blocks[:2] and b.num_cached_tokens == 8
    bm.free_seq(b)
    bm.reset_prefix_cache()
    c = seq(range(9))
    bm.allocate(c)
    assert c.num_cached_tokens == 0


def test_fork_shares_full_blocks_and_copies_partial():
    bm = BlockManager(10, 4)
    p = seq(range(6))
    bm.allocate(p)
    child = seq(range(6), j=1)
    cp = bm.fork(p, child)
    assert child.block_table[0] == p.block_table[0]
    assert cp == (p.block_table[1], child.block_table[1]) and child.block_table[1] != p.block_table[1]
    q = seq(range(8))
    bm.allocate(q)
    c2 = seq(range(8), j=1)
    assert bm.fork(q, c2) is None and c2.block_table == q.block_table


def test_append_slot_allocates_at_block_boundary_and_runs_out():
    bm = BlockManager(2, 4)
    s = seq(range(4))
    bm.allocate(s)
    s.token_ids.append(50)  # 5 tokens: the 5th needs a new block
    assert bm.can_append(s)
    bm.append_slot(s)
    assert len(s.block_table) == 2 and bm.num_free_blocks == 0
    s.token_ids += [51, 52, 53, 54]
    assert not bm.can_append(s)
    with pytest.raises(NoFreeBlocksError):
        bm.append_slot(s)


def make_sched(num_blocks=16, block_size=4, max_num_seqs=4, budget=64, max_len=64):
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(SchedulerConfig(max_num_seqs, budget, max_len), bm), bm


def test_prefill_then_decode_and_group_fork():
    sch, bm = make_sched()
    leader = seq(range(6), rid="g", j=0)
    leader.pending_forks = [seq(range(6), rid="g", j=k) for k in (1, 2)]
    sch.add(leader)
    out = sch.schedule()
    assert out.is_prefill and out.seqs == [leader] and out.num_batched_tokens == 6
    assert len(out.sample_seqs) == 3 and out.sample_rows == [0, 0, 0]
    assert len(out.block_copies) == 2 and len(sch.running) == 3
    for s in out.sample_seqs:
        sch.append_token(s, 70, -1.0, 0)
    out = sch.schedule()
    assert not out.is_prefill and len(out.seqs) == 3 and out.num_batched_tokens == 3


def test_token_budget_and_seq_limit_bound_a_prefill_step():
    sch, _ = make_sched(budget=10, max_num_seqs=2)
    for i in range(3):
        sch.add(seq(range(10 * i, 10 * i + 6), rid=f"r{i}"))  # distinct: no prefix hits
    out = sch.schedule()
    assert [s.request_id for s in out.seqs] == ["r0"]  # r1 would exceed the 10-token budget
    out = sch.schedule()
    assert [s.request_id for s in out.seqs] == ["r1"]
    out = sch.schedule()
    assert not out.is_prefill and len(out.seqs) == 2  # r2 waits for a sequence slot


def test_finished_sequence_slot_is_refilled_next_step():
    sch, bm = make_sched(max_num_seqs=1)
    a, b = seq(range(3), rid="a"), seq(range(3), rid="b")
    sch.add(a)
    sch.add(b)
    assert sch.schedule().seqs == [a]
    sch.append_token(a, 9, 0.0, 0)
    sch.finish(a, "stop")
    assert a.status is SeqStatus.FINISHED and a.block_table == []
    out = sch.schedule()
    assert out.is_prefill and out.seqs == [b]


def test_preemption_when_blocks_run_out_requeues_latest_with_its_tokens():
    sch, bm = make_sched(num_blocks=3, block_size=4)
    a, b = seq(range(4), rid="a"), seq(range(4), rid="b")
    sch.add(a)
    sch.add(b)
    out = sch.schedule()
    assert out.seqs == [a, b] and bm.num_free_blocks == 1
    for s in (a, b):
        sch.append_token(s, 7, 0.0, 0)  # both now need a second block; only one is free
    out = sch.schedule()
    assert out.seqs == [a] and sch.num_preemptions == 1
    assert b.status is SeqStatus.WAITING and sch.waiting[0] is b and b.block_table == []
    assert b.token_ids == [0, 1, 2, 3, 7]  # keeps what it generated; recomputed on readmission
    sch.finish(a, "stop")
    out = sch.schedule()
    # Its first block (full, hashed) is still cached: only the generated token is recomputed.
    assert out.is_prefill and out.seqs == [b] and out.num_batched_tokens == 1 and b.num_cached_tokens == 4


def test_request_that_can_never_fit_raises():
    sch, _ = make_sched(num_blocks=2, block_size=4)
    sch.add(seq(range(20)))
    with pytest.raises(RuntimeError, match="raise the KV cache size"):
        sch.schedule()


def test_stop_checks():
    sch, _ = make_sched()
    s = Sequence("r", 0, [1, 2], 2, SamplingParams(max_tokens=3, stop_token_ids=[42]), seed=0,
                 eos_token_ids=frozenset({2}))
    sch.add(s)
    sch.schedule()
    sch.append_token(s, 5, 0.0, 0)
    assert sch.check_stop(s) is None
    sch.append_token(s, 42, 0.0, 0)
    assert sch.check_stop(s) == "stop"
    s.token_ids[-1] = 2
    assert sch.check_stop(s) == "stop"
    s.token_ids[-1] = 6
    sch.append_token(s, 7, 0.0, 0)
    assert sch.check_stop(s) == "length"


# ---------------------------------------------------------------------------------------------- chunked prefill

def test_long_prompt_is_prefilled_in_chunks_then_sampled():
    sch, bm = make_sched(budget=8, block_size=4)
    long = seq(range(20))
    sch.add(long)
    out = sch.schedule()
    assert out.is_prefill and out.seqs == [long] and out.prefill_ranges == [(0, 8)] and out.sample_seqs == []
    assert sch.prefilling is long and sch.has_unfinished() and sch.num_unfinished_seqs == 1
    out = sch.schedule()
    assert out.prefill_ranges == [(8, 16)] and out.sample_seqs == [] and out.num_batched_tokens == 8
    out = sch.schedule()  # the last chunk samples
    assert out.prefill_ranges == [(16, 20)] and out.sample_seqs == [long] and sch.prefilling is None
    assert long in sch.running


def test_chunks_alternate_with_decode_and_share_the_last_step():
    sch, bm = make_sched(budget=8, block_size=4)
    short = seq(range(3), rid="s")
    sch.add(short)
    out = sch.schedule()
    assert out.seqs == [short]
    sch.append_token(short, 7, -0.1, 0)
    long, other = seq(range(18), rid="l"), seq(range(2), rid="o")
    sch.add(long)
    sch.add(other)
    kinds = []
    for _ in range(6):
        out = sch.schedule()
        kinds.append(("chunk" if out.is_prefill and not out.sample_seqs else "prefill" if out.is_prefill else "decode",
                      out.prefill_ranges))
        for s in out.sample_seqs:
            sch.append_token(s, 5, -0.2, 0)
    # chunk, decode, chunk, decode, then the last chunk (2 tokens) batched with the other prompt, then decode
    assert kinds[0] == ("chunk", [(0, 8)]) and kinds[1][0] == "decode"
    assert kinds[2] == ("chunk", [(8, 16)]) and kinds[3][0] == "decode"
    assert kinds[4] == ("prefill", [(16, 18), (0, 2)]) and kinds[5][0] == "decode"


def test_chunked_blocks_enter_the_prefix_cache_only_once_computed():
    sch, bm = make_sched(budget=8, block_size=4)
    a = seq(range(20), rid="a")
    sch.add(a)
    sch.schedule()  # chunk [0, 8): blocks 0-1 computed
    registered = [bm.block_hash[b] is not None for b in a.block_table]
    assert registered == [True, True, False, False, False]
    b = seq(range(20), rid="b")
    bm2_hits = bm._prefix_hits(b)
    assert len(bm2_hits) == 2  # a second copy of the prompt finds only the computed blocks


def test_abort_between_chunks_frees_everything():
    sch, bm = make_sched(budget=8, block_size=4)
    free0 = bm.num_free_blocks
    a = seq(range(20), rid="a")
    sch.add(a)
    sch.schedule()
    assert sch.prefilling is a and bm.num_free_blocks < free0
    sch.finish(a, "abort")
    assert sch.prefilling is None and not sch.has_unfinished() and bm.num_free_blocks == free0
    assert a.status is SeqStatus.FINISHED
