"""The fused CPU paged-decode kernel against a naive per-sequence attention, and the engine with and without it."""

from __future__ import annotations

import pytest
import torch

from rollwise import LLM, SamplingParams
from rollwise.engine import cpu_kernels


def naive(q, k, v, bt, cl):
    b_, h, d = q.shape
    kvh = k.shape[0]
    out = torch.empty_like(q)
    for b in range(b_):
        kk = k[:, bt[b]].reshape(kvh, -1, d)[:, : cl[b]].repeat_interleave(h // kvh, 0)
        vv = v[:, bt[b]].reshape(kvh, -1, d)[:, : cl[b]].repeat_interleave(h // kvh, 0)
        s = torch.einsum("hd,htd->ht", q[b], kk) * d**-0.5
        out[b] = torch.einsum("ht,htd->hd", s.softmax(-1), vv)
    return out


def test_kernel_matches_naive_attention():
    fn = cpu_kernels.paged_decode_kernel()
    if fn is None:
        pytest.skip(f"CPU kernel unavailable here: {cpu_kernels._failed}")
    g = torch.Generator().manual_seed(0)
    for h, kvh, bs in [(8, 2, 16), (4, 4, 4), (6, 1, 8)]:
        nb, mb, b, d = 64, 5, 9, 32
        k = torch.randn(kvh, nb, bs, d, generator=g)
        v = torch.randn(kvh, nb, bs, d, generator=g)
        bt = torch.randperm(nb, generator=g)[: b * mb].view(b, mb).contiguous()
        cl = torch.randint(1, mb * bs + 1, (b,), generator=g)
        q = torch.randn(b, h, d, generator=g)
        assert (fn(q, k, v, bt, cl, d**-0.5) - naive(q, k, v, bt, cl)).abs().max().item() < 1e-5


def test_engine_same_outputs_with_and_without_kernel(tiny_ckpts, monkeypatch):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], list(range(20, 45))]
    sp = SamplingParams(n=3, temperature=1.0, max_tokens=20, seed=5, ignore_eos=True)
    with_k = LLM(tiny_ckpts["qwen3"], block_size=4).generate(prompts, sp)
    monkeypatch.setattr(cpu_kernels, "paged_decode_kernel", lambda: None)
    llm = LLM(tiny_ckpts["qwen3"], block_size=4)
    assert llm.engine.runner._kernel is None
    without = llm.generate(prompts, sp)
    for a, b in zip(with_k, without):
        for oa, ob in zip(a.outputs, b.outputs):
            assert oa.token_ids == ob.token_ids
            assert max(abs(x - y) for x, y in zip(oa.logprobs, ob.logprobs)) < 1e-5
