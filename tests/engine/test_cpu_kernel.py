"""The fused CPU kernels (paged decode attention, sampling) against naive references, and the engine with and
without them."""

from __future__ import annotations

import pytest
import torch

from rollwise import LLM, SamplingParams
from rollwise.engine import cpu_kernels
from rollwise.engine.sampler import SamplingBatch, sample


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
        pytest.skip(f"CPU kernel unavailable here: {cpu_kernels._EXT.failed}")
    g = torch.Generator().manual_seed(0)
    # head_dim 32 and 320 run the generic loop, 64 and 128 the compiled-constant ones; mb * bs up to 320 keys.
    for h, kvh, bs, d, mb in [(8, 2, 16, 32, 5), (4, 4, 4, 32, 5), (6, 1, 8, 32, 5), (9, 3, 16, 64, 20), (4, 2, 16, 128, 7), (2, 1, 4, 320, 3)]:
        nb, b = 200, 9
        k = torch.randn(kvh, nb, bs, d, generator=g)
        v = torch.randn(kvh, nb, bs, d, generator=g)
        bt = torch.randperm(nb, generator=g)[: b * mb].view(b, mb).contiguous()
        cl = torch.randint(1, mb * bs + 1, (b,), generator=g)
        q = torch.randn(b, h, d, generator=g)
        assert (fn(q, k, v, bt, cl, d**-0.5) - naive(q, k, v, bt, cl)).abs().max().item() < 1e-5


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], list(range(20, 45))]


def _same_outputs(a_outs, b_outs):
    for a, b in zip(a_outs, b_outs):
        for oa, ob in zip(a.outputs, b.outputs):
            assert oa.token_ids == ob.token_ids
            assert max(abs(x - y) for x, y in zip(oa.logprobs, ob.logprobs)) < 1e-5


def test_engine_same_outputs_with_and_without_kernel(tiny_ckpts, monkeypatch):
    sp = SamplingParams(n=3, temperature=1.0, max_tokens=20, seed=5, ignore_eos=True)
    with_k = LLM(tiny_ckpts["qwen3"], block_size=4).generate(PROMPTS, sp)
    monkeypatch.setattr(cpu_kernels, "paged_decode_kernel", lambda: None)
    llm = LLM(tiny_ckpts["qwen3"], block_size=4)
    assert llm.engine.runner._kernel is None
    _same_outputs(with_k, llm.generate(PROMPTS, sp))


def _kernels_or_skip():
    fn = cpu_kernels.sample_kernel()
    if fn is None:
        pytest.skip(f"CPU kernels unavailable here: {cpu_kernels._EXT.failed}")
    return fn


def _batch(temps, pos=0, seeds=None):
    b = len(temps)
    return SamplingBatch(temperature=torch.tensor(temps, dtype=torch.float32), top_p=torch.ones(b),
                         top_k=torch.zeros(b, dtype=torch.long),
                         seeds=torch.arange(b) * 7919 + 3 if seeds is None else seeds,
                         positions=torch.full((b,), pos, dtype=torch.long), all_greedy=all(t <= 0 for t in temps),
                         any_truncation=False)


CDF_ROUNDING = 64 * 2.0**-24
"""How far the draw may sit from a CDF boundary for the kernel and the torch path to pick different tokens: a few
float32 roundings of the cumulative mass (1.0). A wrong kernel misses by a token's probability (~1/vocab = 2e-5)."""


def test_sample_kernel_draws_what_the_torch_path_draws():
    """Same draw u, same distribution: the token is the torch path's except where the draw falls within float32
    rounding of a CDF boundary (how often depends on the CPU's kernels: each such draw is checked to be one), and
    the log-prob is log_softmax(logits / T) at the token, greedy rows at T = 1."""
    from rollwise.engine.sampler import uniform_from_counter

    fn = _kernels_or_skip()
    g = torch.Generator().manual_seed(0)
    temps = [1.0, 0.7, 0.0, 1.3] * 8
    logits = torch.randn(len(temps), 49152, generator=g) * 3
    differ = total = 0
    for pos in range(40):
        sb = _batch(temps, pos)
        t_ref, _ = sample(logits, sb)
        t_k, lp_k = sample(logits, sb, fused=fn)
        total += len(temps)
        tt = torch.tensor(temps)
        lps = torch.log_softmax(logits / torch.where(tt > 0, tt, 1.0)[:, None], -1)
        ref_lp = lps.gather(1, t_k[:, None])[:, 0]
        assert (lp_k - ref_lp).abs().max().item() < 2e-5
        greedy = tt <= 0
        assert torch.equal(t_k[greedy], logits[greedy].argmax(-1))
        cdf = lps.exp().double().cumsum(-1)
        u = uniform_from_counter(sb.seeds, sb.positions)
        for i in torch.nonzero(t_ref != t_k).flatten().tolist():
            differ += 1
            target, k = float(u[i] * cdf[i, -1]), int(t_k[i])
            lo, hi = (float(cdf[i, k - 1]) if k > 0 else 0.0), float(cdf[i, k])
            miss = max(lo - target, target - hi, 0.0)
            assert miss <= CDF_ROUNDING, f"row {i} at position {pos}: the kernel drew {k}, {miss:.2e} outside its CDF slot"
    assert differ <= total // 100, f"{differ} of {total} draws differ"


def test_sample_kernel_distribution_and_determinism():
    """Frequencies over many positions follow softmax(logits / T); the draw depends on (seed, position) only."""
    fn = _kernels_or_skip()
    logits = torch.tensor([[2.0, 0.5, -1.0, 1.0, 0.0, -3.0, 1.5]])
    for temp in (1.0, 0.5):
        counts = torch.zeros(7)
        for pos in range(4000):
            tok, _ = sample(logits, _batch([temp], pos, seeds=torch.tensor([12345])), fused=fn)
            counts[tok] += 1
        p = torch.softmax(logits[0] / temp, -1)
        # 4000 draws: the standard error of a frequency is at most 0.008; 0.03 is far outside noise.
        assert (counts / 4000 - p).abs().max().item() < 0.03
    big = torch.randn(5, 1000, generator=torch.Generator().manual_seed(1))
    a, _ = sample(big, _batch([1.0] * 5, 7), fused=fn)
    b, _ = sample(torch.cat([big, big[:2]]), _batch([1.0] * 7, 7, seeds=torch.tensor([3, 7922, 15841, 23760, 31679, 3, 7922])), fused=fn)
    assert torch.equal(a, b[:5]) and torch.equal(b[5:], a[:2])


def test_sample_kernel_non_finite_rows_like_the_torch_path():
    fn = _kernels_or_skip()
    logits = torch.randn(3, 50)
    logits[1, 7] = float("nan")
    logits[2, 3] = float("inf")
    tok, lp = sample(logits, _batch([1.0, 1.0, 1.0]), fused=fn)
    assert tok[1].item() == 49 and tok[2].item() == 49 and lp[1].isnan() and lp[2].isnan()
    assert lp[0].isfinite()


def test_sample_kernel_left_out_where_it_does_not_apply():
    """top-k/top-p and raw log-probs take the torch path (the kernel would be wrong there)."""
    calls = []

    def spy(*a):
        calls.append(1)
        raise AssertionError("kernel used")

    logits = torch.randn(2, 30)
    sb = _batch([1.0, 1.0])
    sb.top_k = torch.tensor([5, 0])
    sb.any_truncation = True
    sample(logits, sb, fused=spy)
    sample(logits, _batch([1.0, 1.0]), "raw", fused=spy)
    assert not calls


def test_engine_same_outputs_with_and_without_sample_kernel(tiny_ckpts, monkeypatch):
    sp = SamplingParams(n=3, temperature=0.8, max_tokens=16, seed=9, ignore_eos=True)
    if cpu_kernels.sample_kernel() is None:
        pytest.skip(f"CPU kernels unavailable here: {cpu_kernels._EXT.failed}")
    llm = LLM(tiny_ckpts["llama"], block_size=4)
    assert llm.engine.runner._sample_kernel is not None
    with_k = llm.generate(PROMPTS, sp)
    monkeypatch.setattr(cpu_kernels, "sample_kernel", lambda: None)
    llm = LLM(tiny_ckpts["llama"], block_size=4)
    assert llm.engine.runner._sample_kernel is None
    _same_outputs(with_k, llm.generate(PROMPTS, sp))


def test_layer_ops_match_the_torch_ops():
    """The fused per-layer ops against the torch arithmetic they replace (models/decoder.py)."""
    ops = cpu_kernels.layer_ops()
    if ops is None:
        pytest.skip(f"CPU kernels unavailable here: {cpu_kernels._EXT.failed}")
    from rollwise.models.decoder import RMSNorm, rotate_half

    g = torch.Generator().manual_seed(0)
    # residual add + RMSNorm, in place on the residual stream
    x, r = torch.randn(37, 576, generator=g), torch.randn(37, 576, generator=g)
    norm = RMSNorm(576, 1e-5)
    norm.weight.data = torch.rand(576, generator=g) + 0.5
    ref_x = x + r
    with torch.no_grad():
        ref_h = norm(ref_x)
    h = ops.add_rmsnorm_(x, r, norm.weight.detach(), 1e-5)
    assert torch.allclose(x, ref_x, atol=0) and (h - ref_h).abs().max().item() < 1e-5
    # SiLU(gate) * up over large |x| too (exp of both signs)
    gu = torch.randn(5, 2 * 1536, generator=g) * 8
    gu[0, :4] = torch.tensor([0.0, -100.0, 100.0, -1e-8])
    ref = torch.nn.functional.silu(gu[:, :1536]) * gu[:, 1536:]
    assert torch.allclose(ops.silu_mul(gu), ref, rtol=1e-5, atol=1e-5)
    # RoPE + K/V cache write at given slots
    n, h_, kvh, d, nb, bs = 6, 9, 3, 64, 10, 4
    qkv = torch.randn(n, (h_ + 2 * kvh) * d, generator=g)
    ang = torch.rand(n, d // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    cache = torch.zeros(2, kvh, nb, bs, d)
    slots = torch.tensor([3, 17, 0, 39, 22, 5])
    q = ops.rope_store(qkv, cos, sin, cache, slots, h_, kvh)
    qr, kr, vr = qkv.split([h_ * d, kvh * d, kvh * d], -1)
    qr, kr, vr = qr.view(n, h_, d), kr.view(n, kvh, d), vr.view(n, kvh, d)
    c, s = cos[:, None], sin[:, None]
    assert (q - (qr * c + rotate_half(qr) * s)).abs().max().item() < 1e-5
    flat = cache.view(2, kvh, -1, d)
    assert (flat[0][:, slots].transpose(0, 1) - (kr * c + rotate_half(kr) * s)).abs().max().item() < 1e-5
    assert torch.equal(flat[1][:, slots].transpose(0, 1), vr)
    untouched = torch.ones(nb * bs, dtype=torch.bool)
    untouched[slots] = False
    assert flat[:, :, untouched].abs().sum().item() == 0


def test_kernels_on_a_bf16_cache_match_the_widened_cache():
    """A bfloat16 KV cache: `rope_store` rounds K and V as torch rounds (bit for bit, NaN kept a NaN), and the
    attention over it equals the float32 reference on the widened cache."""
    ops = cpu_kernels.layer_ops()
    fn = cpu_kernels.paged_decode_kernel()
    if ops is None or fn is None:
        pytest.skip(f"CPU kernels unavailable here: {cpu_kernels._EXT.failed}")
    g = torch.Generator().manual_seed(1)
    n, h_, kvh, d, nb, bs = 7, 9, 3, 64, 12, 4
    qkv = torch.randn(n, (h_ + 2 * kvh) * d, generator=g) * 3
    qkv[0, (h_ + kvh) * d] = float("nan")  # a NaN in a V row
    qkv[1, (h_ + kvh) * d + 1] = 1.0 + 2**-8  # exactly halfway between two bf16 values: rounds to even
    ang = torch.rand(n, d // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    slots = torch.tensor([3, 17, 0, 39, 22, 5, 44])
    c32 = torch.zeros(2, kvh, nb, bs, d)
    c16 = torch.zeros(2, kvh, nb, bs, d, dtype=torch.bfloat16)
    q32 = ops.rope_store(qkv, cos, sin, c32, slots, h_, kvh)
    q16 = ops.rope_store(qkv, cos, sin, c16, slots, h_, kvh)
    assert torch.equal(q32, q16)
    f32, f16 = c32.view(2, kvh, -1, d), c16.view(2, kvh, -1, d)
    want, got = f32[:, :, slots].to(torch.bfloat16), f16[:, :, slots]
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan) and int(nan.sum()) == 1, "a NaN stays a NaN (its payload bits may differ)"
    assert torch.equal(want.view(torch.int16)[~nan], got.view(torch.int16)[~nan]), "rounded as torch rounds"
    # attention over a bf16 cache = the naive float32 attention on the widened values
    for h, kv, bsz, dd, mb in [(9, 3, 16, 64, 6), (4, 2, 8, 128, 5), (6, 2, 4, 32, 5)]:
        k = torch.randn(kv, 50, bsz, dd, generator=g).bfloat16()
        v = torch.randn(kv, 50, bsz, dd, generator=g).bfloat16()
        bt = torch.randperm(50, generator=g)[: 5 * mb].view(5, mb).contiguous()
        cl = torch.randint(1, mb * bsz + 1, (5,), generator=g)
        q = torch.randn(5, h, dd, generator=g)
        got = fn(q, k, v, bt, cl, dd**-0.5)
        assert (got - naive(q, k.float(), v.float(), bt, cl)).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype, setting, want", [
    ("float32", "auto", torch.float32), ("bfloat16", "auto", torch.bfloat16), ("int8", "auto", torch.bfloat16),
    ("float32", "bfloat16", torch.bfloat16), ("bfloat16", "float32", torch.float32)])
def test_kv_cache_dtype_follows_the_engine_precision(tiny_ckpts, dtype, setting, want):
    llm = LLM(tiny_ckpts["qwen3"], dtype=dtype, kv_cache_dtype=setting, block_size=4)
    assert llm.engine.runner.kv_dtype == want and all(c.dtype == want for c in llm.engine.runner.kv_caches)


def test_kv_cache_dtype_refuses_unknown_values(tiny_ckpts):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(tiny_ckpts["qwen3"], kv_cache_dtype="fp8")


def test_bf16_cache_same_outputs_with_and_without_kernels(tiny_ckpts, monkeypatch):
    """The fused kernels on a bfloat16 cache and the torch paths (which round on index_copy_ and widen the gather)
    give the same samples and log-probs; both stay close to the float32 cache."""
    sp = SamplingParams(n=3, temperature=1.0, max_tokens=20, seed=5, ignore_eos=True)
    with_k = LLM(tiny_ckpts["llama"], block_size=4, kv_cache_dtype="bfloat16").generate(PROMPTS, sp)
    f32 = LLM(tiny_ckpts["llama"], block_size=4).generate(PROMPTS, sp)
    monkeypatch.setattr(cpu_kernels, "paged_decode_kernel", lambda: None)
    llm = LLM(tiny_ckpts["llama"], block_size=4, kv_cache_dtype="bfloat16")
    assert llm.engine.runner._kernel is None
    _same_outputs(with_k, llm.generate(PROMPTS, sp))
    gaps = [abs(x - y) for a, b in zip(with_k, f32) for oa, ob in zip(a.outputs, b.outputs) if oa.token_ids == ob.token_ids
            for x, y in zip(oa.logprobs, ob.logprobs)]
    assert gaps and max(gaps) < 0.05


def test_kernels_read_bf16_inputs_as_their_widened_copy():
    """A bf16 engine's oneDNN matmuls write bfloat16; the fused ops and the sampler read it directly. Each gives what
    it gives on the float32 copy (`.float()` is exact): bit for bit, except the sums (a norm's sum of squares, the sampler's
    chunk sums), which the compiler may vectorise in another order for the other input type."""
    from rollwise.engine.sampler import uniform_from_counter

    ops = cpu_kernels.layer_ops()
    fn = cpu_kernels.sample_kernel()
    if ops is None or fn is None:
        pytest.skip(f"CPU kernels unavailable here: {cpu_kernels._EXT.failed}")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(33, 576, generator=g)
    r = (torch.randn(33, 576, generator=g) * 2).bfloat16()
    w = torch.rand(576, generator=g) + 0.5
    x16, x32 = x.clone(), x.clone()
    h16, h32 = ops.add_rmsnorm_(x16, r, w, 1e-5), ops.add_rmsnorm_(x32, r.float(), w, 1e-5)
    assert torch.equal(x16, x32) and (h16 - h32).abs().max().item() <= 1e-6 * h32.abs().max().item()
    gu = (torch.randn(9, 2 * 1536, generator=g) * 6).bfloat16()
    out = ops.silu_mul(gu)
    assert out.dtype == torch.float32 and torch.equal(out, ops.silu_mul(gu.float()))
    n, h_, kvh, d, nb, bs = 6, 9, 3, 64, 10, 4
    qkv = (torch.randn(n, (h_ + 2 * kvh) * d, generator=g) * 3).bfloat16()
    ang = torch.rand(n, d // 2, generator=g) * 6
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    slots = torch.tensor([3, 17, 0, 39, 22, 5])
    for cdt in (torch.float32, torch.bfloat16):
        ca, cb = torch.zeros(2, kvh, nb, bs, d, dtype=cdt), torch.zeros(2, kvh, nb, bs, d, dtype=cdt)
        qa, qb = ops.rope_store(qkv, cos, sin, ca, slots, h_, kvh), ops.rope_store(qkv.float(), cos, sin, cb, slots, h_, kvh)
        assert qa.dtype == torch.float32 and torch.equal(qa, qb) and torch.equal(ca.view(torch.int16) if cdt != torch.float32
                                                                                  else ca, cb.view(torch.int16) if cdt != torch.float32 else cb)
    temps = [1.0, 0.7, 0.0, 1.3] * 4
    logits = (torch.randn(len(temps), 49152, generator=g) * 3).bfloat16()
    sb = _batch(temps, 3)
    u = uniform_from_counter(sb.seeds, sb.positions)
    ta, la = fn(logits, sb.temperature, u)
    tb, lb = fn(logits.float(), sb.temperature, u)
    assert torch.equal(ta, tb) and (la - lb).abs().max().item() < 1e-5  # the chunk sums' order, as above
    ts, ls = sample(logits, sb, fused=fn)
    assert torch.equal(ts, ta) and torch.equal(ls, la)
