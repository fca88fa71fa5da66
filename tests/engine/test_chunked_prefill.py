"""Chunked prefill end to end: a prompt longer than the token budget is split, and the samples are the same as
with a budget that holds it whole (same seed: same tokens; log-probs to float32 rounding)."""

from __future__ import annotations

import torch

from rollwise import LLM, SamplingParams


def _tiny(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=512)
    torch.manual_seed(1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    return tmp_path


def test_prompt_over_the_budget_is_chunked_with_the_same_samples(tmp_path):
    path = _tiny(tmp_path)
    g = torch.Generator().manual_seed(0)
    long = torch.randint(3, 100, (150,), generator=g).tolist()  # 150 tokens against a 32-token budget
    short = torch.randint(3, 100, (9,), generator=g).tolist()
    sp = SamplingParams(n=3, temperature=1.0, max_tokens=10, seed=4, ignore_eos=True)
    whole = LLM(path, kv_cache_gb=0.02, max_num_batched_tokens=4096)
    chunked = LLM(path, kv_cache_gb=0.02, max_num_batched_tokens=32)
    a = whole.generate([short, long, short], sp)
    b = chunked.generate([short, long, short], sp)
    assert chunked.engine.stats.prefill_steps > whole.engine.stats.prefill_steps  # it really was split
    for x, y in zip(a, b):
        for ox, oy in zip(x.outputs, y.outputs):
            assert ox.token_ids == oy.token_ids and len(ox.token_ids) == 10
            assert max(abs(p - q) for p, q in zip(ox.logprobs, oy.logprobs)) < 1e-4


def test_chunked_prompt_with_prefix_cache_hits_matches(tmp_path):
    path = _tiny(tmp_path)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 100, (120,), generator=g).tolist()
    sp = SamplingParams(n=2, temperature=0.0, max_tokens=6, ignore_eos=True)
    llm = LLM(path, kv_cache_gb=0.02, max_num_batched_tokens=40)
    first = llm.generate([prompt], sp)[0]
    again = llm.generate([prompt + [7, 8]], sp)[0]  # the first 112 tokens (7 blocks) come from the prefix cache
    ref = LLM(path, kv_cache_gb=0.02, enable_prefix_caching=False)
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in ref.generate([prompt], sp)[0].outputs]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in ref.generate([prompt + [7, 8]], sp)[0].outputs]
