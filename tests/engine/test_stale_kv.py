"""Regression: KV computed under old weights must never be served from the prefix cache after `load_weights`.

Before the fix, a sequence still running across a weight load re-registered its old-weight prompt blocks when a
decode block filled up, and a later request with the same prompt reused them.
"""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from conftest import make_tiny_checkpoint
from rollwise.engine.block_manager import BlockManager
from rollwise.engine.core import EngineConfig, EngineCore
from rollwise.engine.sequence import Sequence
from rollwise.types import SamplingParams

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # 2 full blocks of 4 + 2 tokens


def _run(eng: EngineCore, rid: str, prompt: list[int], sp: SamplingParams):
    eng.add_request(rid, prompt, sp)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    return next(o for o in outs if o.request_id == rid).outputs[0]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prefix_cache_never_serves_kv_from_before_a_weight_load(tmp_path, arch):
    old = make_tiny_checkpoint(tmp_path / "old", arch, seed=0)
    new = make_tiny_checkpoint(tmp_path / "new", arch, seed=99)
    cfg = EngineConfig(block_size=4, enable_prefix_caching=True)
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eng = EngineCore.from_pretrained(old, config=cfg)
    eng.add_request("running", PROMPT, sp)
    for _ in range(2):  # prefill + one decode under the old weights
        eng.step()
    eng.load_weights(AutoModelForCausalLM.from_pretrained(new).state_dict())
    while eng.has_unfinished():  # decoding fills blocks of the sequence whose prompt KV is old
        eng.step()
    got = _run(eng, "later", PROMPT, sp)
    fresh = _run(EngineCore.from_pretrained(new, config=cfg), "ref", PROMPT, sp)
    assert got.token_ids == fresh.token_ids
    assert max(abs(a - b) for a, b in zip(got.logprobs, fresh.logprobs)) < 1e-5


def test_blocks_of_a_sequence_spanning_a_reset_are_not_registered():
    bm = BlockManager(num_blocks=16, block_size=4)
    sp = SamplingParams(max_tokens=16)
    s = Sequence("a", 0, list(range(10, 19)), 9, sp, seed=1)  # 2 full blocks + 1 token
    bm.allocate(s)
    assert len(bm.hash_to_block) == 2
    bm.reset_prefix_cache()  # weights changed: s keeps its (old) KV and keeps decoding
    s.token_ids += [30, 31, 32, 33]
    bm.append_slot(s)
    bm.register_full_blocks(s, 12)
    assert bm.hash_to_block == {}  # neither the old blocks nor the new one (it attended to old KV)
    fresh = Sequence("b", 0, list(range(10, 23)), 13, sp, seed=2)
    bm.allocate(fresh)
    assert fresh.num_cached_tokens == 0
    # A sequence admitted after the reset registers normally and is found by the next one.
    again = Sequence("c", 0, list(range(10, 23)), 13, sp, seed=3)
    bm.allocate(again)
    assert again.num_cached_tokens == 12
