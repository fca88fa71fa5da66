"""The decode step's linear layers alone: torch's F.linear (float32 MKL, bf16 oneDNN) against the packed kernels of
engine/cpu_linear.py, at SmolLM2-135M's shapes, side by side in one process.

One "pass" runs one layer's four projections (qkv [960, 576], o [576, 576], gate_up [3072, 576], down [576, 1536])
for each of 30 layers (distinct weights, 540 MB in float32: every pass streams them from memory as a decode step
does) plus the LM head [49152, 576]. The formats are interleaved within each repeat; reported per (threads, rows):
milliseconds per pass, median of --repeats (min-max), and the weight bytes per second it implies.

    PYTHONPATH=src python bench/linear_kernels.py [--threads 1,2] [--rows 8,64] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rollwise.engine import cpu_linear as cl

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
LAYERS, VOCAB, HIDDEN = 30, 49152, 576


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="8,64")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    assert cl.available(), "the packed kernels are unavailable here"
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(m, k, generator=g) * 0.05 for _ in range(LAYERS) for m, k in SHAPES]
    ws.append(torch.randn(VOCAB, HIDDEN, generator=g) * 0.05)
    fmts = {
        "torch_float32": (ws, lambda w, x: F.linear(x, w), 4),
        "packed_float32": ([cl.pack(w, None, "float32") for w in ws], lambda p, x: p(x), 4),
        "torch_bfloat16": ([w.bfloat16() for w in ws], lambda w, x: F.linear(x.bfloat16(), w).float(), 2),
        "packed_bfloat16": ([cl.pack(w, None, "bfloat16") for w in ws], lambda p, x: p(x), 2),
        "packed_int8": ([cl.pack(w, None, "int8") for w in ws], lambda p, x: p(x), 1),
    }
    nparams = sum(w.numel() for w in ws)
    res: dict = {"params": nparams, "load_1m_start": os.getloadavg()[0], "cells": {}}
    for th in [int(x) for x in a.threads.split(",")]:
        torch.set_num_threads(th)
        for rows in [int(x) for x in a.rows.split(",")]:
            xs = {k: torch.randn(rows, k, generator=g) for k in (576, 1536)}
            times: dict[str, list[float]] = {f: [] for f in fmts}
            for r in range(a.repeats + 1):
                for name, (weights, fn, _) in fmts.items():
                    t = time.perf_counter()
                    for w in weights:
                        fn(w, xs[w.in_features if isinstance(w, cl.PackedWeight) else w.shape[1]])
                    if r:  # the first round warms up
                        times[name].append((time.perf_counter() - t) * 1e3)
            cell = {}
            for name, v in times.items():
                med = statistics.median(v)
                cell[name] = {"ms": v, "median_ms": med, "min_ms": min(v), "max_ms": max(v),
                              "weight_gb_s": nparams * fmts[name][2] / (med / 1e3) / 1e9}
            base = cell["torch_float32"]["median_ms"]
            for name in cell:
                cell[name]["speedup_vs_torch_float32"] = base / cell[name]["median_ms"]
            cell["load_1m"] = os.getloadavg()[0]
            res["cells"][f"{th}thr_{rows}rows"] = cell
            print(f"[{th} thr, {rows} rows, load {cell['load_1m']:.1f}] " + " | ".join(
                f"{n} {c['median_ms']:.1f} ms ({c['min_ms']:.1f}-{c['max_ms']:.1f}, {c['weight_gb_s']:.1f} GB/s, "
                f"{c['speedup_vs_torch_float32']:.2f}x)" for n, c in cell.items() if isinstance(c, dict)), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
