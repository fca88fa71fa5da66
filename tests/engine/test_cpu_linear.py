"""The packed CPU linear kernels (engine/cpu_linear.py) against the torch path, and the engine's precision modes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rollwise.engine import cpu_linear as cl
from rollwise.engine.model_runner import engine_precision

needs_kernels = pytest.mark.skipif(not cl.available(), reason="packed CPU kernels unavailable (no AVX-512 BF16)")

# (rows, in, out): decode rows below and above the 8-row register block, a prefill beyond the 192-row block, odd K
# (bf16 k-pairs padded), out not a multiple of 32 (tiles padded), and SmolLM2's own shapes.
SHAPES = [(1, 576, 960), (8, 576, 3072), (13, 1536, 576), (17, 577, 100), (64, 64, 48), (300, 96, 200)]


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double()).float()


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_float32_tiles_match_f_linear(shape, bias):
    n, k, m = shape
    g = torch.Generator().manual_seed(n + k + m)
    x, w = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) * 0.05
    b = torch.randn(m, generator=g) if bias else None
    p = cl.pack(w, b, "float32")
    y = p(x)
    assert y.shape == (n, m) and y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(x, w, b), rtol=1e-5, atol=2e-5)
    assert torch.equal(p.dequantized(), w)


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES)
def test_bfloat16_tiles_are_bf16_inputs_with_float32_accumulation(shape):
    n, k, m = shape
    g = torch.Generator().manual_seed(7 * n + k)
    x, w, b = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) * 0.05, torch.randn(m, generator=g)
    p = cl.pack(w, b, "bfloat16")
    assert torch.equal(p.dequantized(), w.bfloat16().float())
    want = _ref(x.bfloat16().float(), w.bfloat16().float(), b)  # bf16-rounded inputs, exact accumulation
    torch.testing.assert_close(p(x), want, rtol=1e-5, atol=2e-5)
    # and within bf16 rounding of the float32 layer
    torch.testing.assert_close(p(x), F.linear(x, w, b), rtol=0.0, atol=0.05 * float(F.linear(x, w, b).abs().max()))


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES)
def test_int8_tiles_match_dequantized_weights(shape):
    n, k, m = shape
    g = torch.Generator().manual_seed(11 * n + m)
    x, w, b = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) * 0.05, torch.randn(m, generator=g)
    p = cl.pack(w, b, "int8", max_rows=16)
    q, s = cl.quantize_int8(w)
    assert torch.equal(p.dequantized(), q.float() * s[:, None])
    assert (p.dequantized() - w).abs().max() <= s.max() / 2 + 1e-7  # round-to-nearest per channel
    want = _ref(x.bfloat16().float(), p.dequantized(), b)
    y = p(x)
    if n <= 16:  # the packed kernel: float32 results
        torch.testing.assert_close(y, want, rtol=1e-5, atol=2e-5)
    else:  # the wide path: the bf16 matmul rounds its result to bf16
        torch.testing.assert_close(y, want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


def test_int8_quantization_is_per_channel_symmetric():
    w = torch.tensor([[0.5, -1.0, 0.25], [100.0, 0.0, -50.0]])
    q, s = cl.quantize_int8(w)
    torch.testing.assert_close(s, torch.tensor([1.0 / 127, 100.0 / 127]))
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127


def test_bf16_and_dequant_fallbacks_match_their_definition():
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(5, 40, generator=g), torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    f = cl.Bf16Weight(w.bfloat16(), b)
    want = F.linear(x.bfloat16(), w.bfloat16()).float() + b
    torch.testing.assert_close(f(x), want)
    q, s = cl.quantize_int8(w)
    d = cl.DequantWeight(q.float() * s[:, None], b)
    torch.testing.assert_close(d(x), _ref(x.bfloat16().float(), q.float() * s[:, None], b), rtol=1e-5, atol=1e-4)


def test_engine_precision_modes():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert engine_precision("float32", cpu) == (torch.float32, "float32")
    assert engine_precision("bfloat16", cpu) == (torch.float32, "bfloat16")
    assert engine_precision("bf16", cpu) == (torch.float32, "bfloat16")
    assert engine_precision("int8", cpu) == (torch.float32, "int8")
    assert engine_precision(torch.float16, cpu) == (torch.float16, None)
    assert engine_precision("bfloat16", cuda) == (torch.bfloat16, None)
    with pytest.raises(ValueError, match="CPU only"):
        engine_precision("int8", cuda)
    with pytest.raises(ValueError, match="unknown dtype"):
        engine_precision("int4", cpu)


def _tiny_llama(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_engine_modes_generate_and_follow_load_weights(tmp_path, dtype):
    """Each mode generates; its log-probs are close to the float32 engine's; after load_weights the packed weights
    are rebuilt (the output follows the new weights exactly as a fresh engine on them does)."""
    from rollwise import LLM, SamplingParams

    path = _tiny_llama(tmp_path)
    sp = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=5, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15]]
    ref = LLM(path, dtype="float32", kv_cache_gb=0.01)
    llm = LLM(path, dtype=dtype, kv_cache_gb=0.01)
    a, r = llm.generate(prompts, sp), ref.generate(prompts, sp)
    for x, y in zip(a, r):
        for ox, oy in zip(x.outputs, y.outputs):
            assert len(ox.token_ids) == 12
            if ox.token_ids == oy.token_ids:  # same tokens: log-probs within the mode's rounding
                tol = 1e-4 if dtype == "float32" else 0.1
                assert max(abs(p - q) for p, q in zip(ox.logprobs, oy.logprobs)) < tol
    from transformers import AutoModelForCausalLM

    sd = {k: (v * 1.5 if "mlp" in k else v) for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}
    llm.load_weights(sd)
    moved = LLM(path, dtype=dtype, kv_cache_gb=0.01)
    moved.load_weights(sd)
    assert [o.token_ids for q in llm.generate(prompts, sp) for o in q.outputs] == \
        [o.token_ids for q in moved.generate(prompts, sp) for o in q.outputs]
    assert [o.token_ids for q in llm.generate(prompts, sp) for o in q.outputs] != \
        [o.token_ids for q in a for o in q.outputs]


@needs_kernels
def test_float32_mode_greedy_matches_the_torch_path(tmp_path):
    """The float32 packed tiles change only the summation order: greedy tokens equal the plain F.linear engine's."""
    from rollwise import SamplingParams
    from rollwise.engine.core import EngineCore

    path = _tiny_llama(tmp_path)
    fast = EngineCore.from_pretrained(path, dtype="float32")
    plain = EngineCore.from_pretrained(path, dtype="float32")
    plain.runner.linear_kind = None
    for mod in plain.model.modules():
        if hasattr(mod, "fast"):
            mod.fast = None
    sp = SamplingParams(n=1, temperature=0.0, max_tokens=20, ignore_eos=True)

    def run(core):
        core.add_request("a", list(range(3, 30)), sp)
        outs = []
        while core.has_unfinished():
            outs.extend(core.step())
        return outs[0].outputs[0]

    a, b = run(fast), run(plain)
    assert a.token_ids == b.token_ids
    assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-4


def test_low_precision_engine_turns_tis_on_by_default():
    from rollwise.config import LOW_PRECISION_TIS_CAP, load_config

    assert load_config(None, ["model.dtype=bfloat16"]).algo.tis_cap == LOW_PRECISION_TIS_CAP
    assert load_config(None, ["model.dtype=int8"]).algo.tis_cap == LOW_PRECISION_TIS_CAP
    assert load_config(None, []).algo.tis_cap is None
    assert load_config(None, ["model.dtype=bfloat16", "algo.tis_cap=5"]).algo.tis_cap == 5
    c = load_config(None, ["model.dtype=bfloat16", "algo.decoupled=true"])
    assert c.algo.decoupled and c.algo.tis_cap is None


def test_int8_needs_the_local_cpu_engine():
    from rollwise.config import load_config

    with pytest.raises(ValueError, match="int8"):
        load_config(None, ["model.dtype=int8", "engine.backend=remote", "engine.remote_urls=[http://x:1]"])


@needs_kernels
def test_bf16_mode_switches_layout_by_rows_with_the_same_numbers():
    g = torch.Generator().manual_seed(9)
    w, b = torch.randn(96, 64, generator=g) * 0.1, torch.randn(96, generator=g)
    f = cl.make_fast(w, b, "bfloat16", max_rows=16)
    assert isinstance(f, cl.Bf16Dual)
    for n in (16, 17):
        x = torch.randn(n, 64, generator=g)
        want = _ref(x.bfloat16().float(), w.bfloat16().float(), b)
        torch.testing.assert_close(f(x), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()))


def test_bf16_rows_are_bucketed_without_changing_results():
    assert [cl.bucket_rows(n) for n in (1, 16, 17, 64, 250, 257, 300)] == [16, 16, 32, 64, 256, 384, 384]
    g = torch.Generator().manual_seed(4)
    w = torch.randn(40, 24, generator=g).bfloat16()
    for n in (1, 17, 300):
        x = torch.randn(n, 24, generator=g)
        torch.testing.assert_close(cl.bf16_matmul(x, w), F.linear(x.bfloat16(), w).float())


def test_prepacked_bf16_weights_give_the_plain_matmul_bit_for_bit():
    """`prepack_bf16` (oneDNN's own layout, so a call does not reorder the weight) changes the speed, not the numbers:
    equal to F.linear on the plain bf16 weight at decode, bucket-edge and prefill row counts; the engine's bf16 and
    int8 formats use it above their packed-kernel rows."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(96, 40, generator=g)
    packed = cl.prepack_bf16(w)
    assert packed.is_mkldnn == cl._ONEDNN_PREPACK and tuple(packed.shape) == (96, 40)
    for n in (1, 6, 16, 17, 64, 300):
        x = torch.randn(n, 40, generator=g)
        assert torch.equal(cl.bf16_matmul(x, packed), F.linear(x.bfloat16(), w.bfloat16()).float())
    f = cl.make_fast(w, None, "bfloat16")
    wide = f.wide if isinstance(f, cl.Bf16Dual) else f
    assert wide.weight.is_mkldnn == cl._ONEDNN_PREPACK


@pytest.mark.parametrize("isa, rows", [("amx_bf16", cl.PACKED_MAX_ROWS_AMX), ("avx512_bf16", cl.PACKED_MAX_ROWS_AVX512),
                                       (None, cl.PACKED_MAX_ROWS_AVX512)])
def test_packed_row_limit_follows_the_cpu(isa, rows):
    """With AMX oneDNN's tiles beat the packed kernels past 16 rows; without, the packed kernels run the whole decode
    batch. The choice is the CPU's (and ONEDNN_MAX_CPU_ISA's), made once per weight load."""
    assert cl.packed_max_rows(isa) == rows


def test_packed_row_limit_honours_the_onednn_cap(monkeypatch):
    from rollwise import cpu_features

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16", "amx_tile"}))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert cl.packed_max_rows() == cl.PACKED_MAX_ROWS_AMX
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert cl.packed_max_rows() == cl.PACKED_MAX_ROWS_AVX512


@needs_kernels
def test_make_fast_carries_the_row_limit_to_both_formats():
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(64, 32, generator=g) * 0.1, torch.randn(64, generator=g)
    f = cl.make_fast(w, b, "bfloat16", max_rows=200)
    assert isinstance(f, cl.Bf16Dual) and f.max_rows == 200
    q = cl.make_fast(w, b, "int8", max_rows=200)
    assert isinstance(q, cl.PackedWeight) and q.max_rows == 200
    x = torch.randn(150, 32, generator=g)  # past the AMX limit, inside this one: the packed tiles, float32 results
    torch.testing.assert_close(q(x), _ref(x.bfloat16().float(), q.dequantized(), b), rtol=1e-5, atol=2e-5)


def test_describe_names_the_kernels_each_cpu_gets(monkeypatch):
    """The run log and the benches name what ran: the packed tiles' row limit follows the CPU (AMX: 16), and without
    the packed kernels the torch path is named with the reason."""
    from rollwise import cpu_features

    if cl.available():
        monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_bf16", "amx_tile"}))
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        assert "up to 16 rows" in cl.describe("bfloat16") and "amx_bf16" in cl.describe("bfloat16")
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
        assert f"up to {cl.PACKED_MAX_ROWS_AVX512} rows" in cl.describe("int8")
    monkeypatch.setattr(cl, "available", lambda: False)
    monkeypatch.setattr(cl._EXT, "failed", "this CPU or compiler has no AVX-512 BF16")
    assert cl.describe("float32") == ("linear layers: torch F.linear (MKL) (packed kernels unavailable: this CPU or "
                                      "compiler has no AVX-512 BF16)")
    assert "oneDNN bf16 matmul at every batch size" in cl.describe("bfloat16")


def test_engine_describe_names_precision_kernels_and_cache(tiny_ckpts):
    from rollwise import LLM

    d = LLM(tiny_ckpts["llama"], dtype="bfloat16", block_size=4).describe()
    assert d.startswith("bfloat16 on cpu; linear layers:") and "KV cache bfloat16" in d
    assert "KV cache float32" in LLM(tiny_ckpts["llama"], block_size=4).describe()
