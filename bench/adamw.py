"""One AdamW step over SmolLM2-135M-shaped float32 parameters: torch's default implementation, `foreach` and the
fused kernel `rollwise.train.optim.adamw` picks, in one process, median of `--repeats` steps each.

    python bench/adamw.py [--threads 2] [--repeats 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from rollwise.train.optim import adamw

    torch.set_num_threads(args.threads)
    # SmolLM2-135M: tied 49152 x 576 embedding, 30 layers of q/o 576x576, k/v 576x192, gate/up/down 576x1536
    sizes = [49152 * 576] + [576 * 576] * 60 + [576 * 192] * 60 + [576 * 1536] * 90 + [576] * 61
    params = [torch.nn.Parameter(torch.randn(n)) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    makers = {"default": lambda: torch.optim.AdamW(params, lr=1e-5, foreach=False),
              "foreach": lambda: torch.optim.AdamW(params, lr=1e-5, foreach=True),
              "rollwise (fused)": lambda: adamw(params, lr=1e-5)}
    res: dict[str, dict[str, float]] = {}
    for name, make in makers.items():
        opt = make()
        opt.step()  # allocates the moments
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t)
        res[name] = {"median": statistics.median(times), "min": min(times), "max": max(times)}
        print(f"{name:18s} {res[name]['median']:.3f} s ({res[name]['min']:.3f}-{res[name]['max']:.3f})")
    from recipe_whole import cpu_name  # this script's own folder is first on sys.path

    out = {"cpu": cpu_name(), "params_m": sum(sizes) / 1e6, "threads": args.threads, "step_s": res,
           "load_avg": os.getloadavg()[0]}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
