"""Rollout generation throughput: rollwise's engine vs `transformers` `generate` (the path TRL uses without
vLLM), side by side in one process, on the GRPO-shaped workload.

Workload: 16 prompts x 8 samples, max_tokens 128, temperature 1, EOS on (so lengths vary), on two tiny
random Llama models (~4M and ~25M parameters, char-level vocab of 61). Reported: useful tokens/s (tokens up
to and including EOS), median of --repeats runs each, and the ratio. With --ignore-eos as well: achieved
FLOP/s (2 x non-embedding params x tokens + attention) as a fraction of this machine's measured float32
matmul FLOP/s.

    python bench/generate.py [--repeats 3] [--device cpu] [--dtype float32] [--sizes 4m,25m]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SIZES = {
    "4m": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4),
    "25m": dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8),
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
}
VOCAB = 61
EOS = 2


def make_model(size: str, path: Path) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    spec = dict(SIZES[size])
    vocab = spec.pop("vocab_size", VOCAB)
    cls = Qwen2Config if size.startswith("qwen") else LlamaConfig
    cfg = cls(vocab_size=vocab, max_position_embeddings=1024, bos_token_id=1, eos_token_id=EOS, pad_token_id=0, **spec)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(path)
    return path


def prompts(n: int = 16, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(4, vocab, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def matmul_flops(device: str, dtype: torch.dtype) -> float:
    a = torch.randn(1024, 1024, device=device, dtype=dtype)
    b = torch.randn(1024, 1024, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(10):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / 10)
    return 2 * 1024**3 / best


def run_ours(path: Path, ps, n: int, max_tokens: int, ignore_eos: bool, device: str, dtype: str, seed: int):
    from rollwise import LLM, SamplingParams

    llm = LLM(path, device=device, dtype=dtype, max_num_seqs=len(ps) * n)
    sp = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed)
    llm.generate(ps[:2], SamplingParams(n=2, max_tokens=4))  # warm-up
    steps0 = llm.engine.stats.steps
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = llm.generate(ps, sp)
    if device == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    lens = [len(o.token_ids) for r in outs for o in r.outputs]
    run_ours.last_steps = llm.engine.stats.steps - steps0  # type: ignore[attr-defined]
    return sum(lens), dt, lens


def run_hf(path: Path, ps, n: int, max_tokens: int, ignore_eos: bool, device: str, dtype: str, seed: int):
    from transformers import AutoModelForCausalLM

    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=tdtype).to(device).eval()
    width = max(len(p) for p in ps)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in ps], device=device)
    mask = (torch.arange(width, device=device)[None, :] >= torch.tensor([width - len(p) for p in ps], device=device)[:, None]).long()
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens, num_return_sequences=n,
              pad_token_id=0)
    if ignore_eos:
        kw.update(eos_token_id=None, min_new_tokens=max_tokens)
    else:
        kw.update(eos_token_id=EOS)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], **dict(kw, max_new_tokens=4, min_new_tokens=None))
        torch.manual_seed(seed)
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t
    gen = out[:, width:].tolist()
    lens = []
    for row in gen:
        L = len(row)
        if not ignore_eos and EOS in row:
            L = row.index(EOS) + 1
        lens.append(L)
    return sum(lens), dt, lens


def model_flops_per_token(path: Path, avg_ctx: float) -> float:
    cfg = json.loads((path / "config.json").read_text())
    h, L, inter = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"]
    heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // heads
    per_layer = h * (heads * hd) + 2 * h * (kvh * hd) + (heads * hd) * h + 3 * h * inter
    lm_head = h * cfg["vocab_size"]
    attn = L * 2 * heads * hd * avg_ctx  # QK^T and PV
    return 2 * (L * per_layer + lm_head) + 2 * attn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sizes", default="4m,25m")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = {}
    peak = matmul_flops(args.device, {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype])
    print(f"matmul peak (1024^3, {args.dtype}, {args.device}, {torch.get_num_threads()} threads): {peak / 1e9:.0f} GFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            path = make_model(size, Path(tmp) / size)
            vocab = json.loads((path / "config.json").read_text())["vocab_size"]
            ps = prompts(args.prompts, min(vocab, VOCAB))
            row = {}
            for mode, ignore in (("eos", False), ("ignore_eos", True)):
                ours, hf = [], []
                for r in range(args.repeats):
                    tok, dt, lens = run_ours(path, ps, args.n, args.max_tokens, ignore, args.device, args.dtype, r)
                    ours.append((tok / dt, tok, dt, lens))
                    if not args.skip_hf:
                        tok, dt, lens_hf = run_hf(path, ps, args.n, args.max_tokens, ignore, args.device, args.dtype, r)
                        hf.append((tok / dt, tok, dt, lens_hf))
                o = statistics.median(x[0] for x in ours)
                res = {"ours_tok_s": o, "ours_tokens": statistics.median(x[1] for x in ours)}
                if hf:
                    h = statistics.median(x[0] for x in hf)
                    res.update(hf_tok_s=h, hf_tokens=statistics.median(x[1] for x in hf), speedup=o / h)
                if args.device == "cuda":
                    # Each decode step reads every weight once: steps/s x weight bytes is the achieved bandwidth.
                    nbytes = sum(f.stat().st_size for f in path.glob("*.safetensors"))
                    if args.dtype != "float32":
                        nbytes //= 2  # checkpoints are saved in float32
                    med = sorted(ours, key=lambda x: x[0])[len(ours) // 2]
                    steps_per_s = run_ours.last_steps / med[2]
                    res["ours_steps_per_s"] = steps_per_s
                    res["ours_weight_bandwidth_gb_s"] = steps_per_s * nbytes / 1e9
                if ignore:
                    avg_ctx = statistics.mean(len(p) for p in ps) + args.max_tokens / 2
                    fpt = model_flops_per_token(path, avg_ctx)
                    res["ours_gflop_s"] = o * fpt / 1e9
                    res["fraction_of_matmul_peak"] = o * fpt / peak
                    if hf:
                        res["hf_gflop_s"] = res["hf_tok_s"] * fpt / 1e9
                row[mode] = res
                msg = f"[{size} {mode}] ours {o:,.0f} tok/s"
                if hf:
                    msg += f" | HF generate {res['hf_tok_s']:,.0f} tok/s | speedup {res['speedup']:.2f}x"
                if ignore:
                    msg += f" | ours {res['ours_gflop_s']:.1f} GFLOP/s = {100 * res['fraction_of_matmul_peak']:.0f}% of matmul peak"
                print(msg, flush=True)
            results[size] = row
    results["matmul_peak_gflop_s"] = peak / 1e9
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
