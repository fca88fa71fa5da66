"""Two threads against one when a core is busy: rollwise's bf16 rollouts (and optionally a training step) at 1 and 2
torch threads, under each OpenMP wait policy, with a busy process of the bench's own pinned to one core.

OpenMP's threads meet at a barrier after every parallel region (hundreds per decode step). With one core taken by
another process, the thread that shares it is descheduled for whole time slices; a thread that spins at the barrier
(libgomp's default spins a while before sleeping; ACTIVE spins for good) keeps its own core busy, so the scheduler
cannot move the descheduled thread there. A PASSIVE thread sleeps at once and frees its core. The wait policy is
read once, when the OpenMP runtime loads (with torch), so every variant runs in a fresh subprocess with its
environment set; the variants alternate round by round (`--rounds`), each timing `--repeats` generate calls after a
warm-up, so contention from the rest of the machine falls on all of them alike. Reported: the median seconds per
call of each variant, the ratio of each to 1 thread (median and spread over the rounds), and the machine's load
average at the start.

Workload: SmolLM2-135M-Instruct (`--model`), `--seqs` sequences x (40 prompt + `--tokens` generated) tokens, no EOS,
temperature 1, `--dtype` weights (bfloat16: the case that collapsed). `--no-competitor` runs the same on the
machine as it is.

    python bench/shared_core.py [--rounds 3] [--repeats 2] [--seqs 8] [--tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = {  # name -> (threads, OMP_WAIT_POLICY or None = libgomp's default)
    "1 thread": (1, None),
    "2 threads, default wait": (2, None),
    "2 threads, ACTIVE": (2, "ACTIVE"),
    "2 threads, PASSIVE": (2, "PASSIVE"),
}

CHILD = """
import json, statistics, sys, time
import torch
from rollwise import LLM, SamplingParams
from rollwise.models.convert import resolve_model
model, dtype, seqs, tokens, repeats, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
torch.set_num_threads(threads)
llm = LLM(str(resolve_model(model)), dtype=dtype)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(100, 40000, (40,), generator=g).tolist() for _ in range(seqs)]
params = SamplingParams(n=1, temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=0)
llm.generate(prompts[:2], SamplingParams(n=1, temperature=1.0, max_tokens=4, ignore_eos=True, seed=0))
times = []
for _ in range(repeats):
    t = time.perf_counter()
    llm.generate(prompts, params)
    times.append(time.perf_counter() - t)
print(json.dumps({"s": statistics.median(times), "threads": torch.get_num_threads()}))
"""


def competitor(core: int) -> subprocess.Popen:
    """A busy loop pinned to `core` (Linux affinity), the bench's own."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(p.pid, {core})
    return p


def run_variant(args: argparse.Namespace, threads: int, policy: str | None) -> float:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("OMP_NUM_THREADS", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    cmd = [sys.executable, "-c", CHILD, args.model, args.dtype, str(args.seqs), str(args.tokens), str(args.repeats),
           str(threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"variant failed: {out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["threads"] != threads:
        raise SystemExit(f"asked for {threads} threads, ran {res['threads']}")
    return float(res["s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--core", type=int, default=1, help="the core the competing busy process is pinned to")
    ap.add_argument("--no-competitor", action="store_true")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names from: " + ", ".join(VARIANTS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",")]
    if "1 thread" not in names:
        names.insert(0, "1 thread")
    load = os.getloadavg()[0]
    busy = None if args.no_competitor else competitor(args.core)
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        time.sleep(0.5)
        for r in range(args.rounds):
            for n in names:
                times[n].append(run_variant(args, *VARIANTS[n]))
                print(f"round {r + 1} {n:26s} {times[n][-1]:6.2f} s", flush=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    cpus = os.cpu_count()
    print(f"{cpus} CPUs, load average {load:.1f} at start; competitor {'none' if busy is None else f'on core {args.core}'};"
          f" {args.seqs} x (40 + {args.tokens}) tokens, {args.dtype}")
    res: dict = {"cpus": cpus, "load_avg": load, "competitor_core": None if busy is None else args.core,
                 "seqs": args.seqs, "tokens": args.tokens, "dtype": args.dtype, "s": times, "vs_1_thread": {}}
    for n in names:
        ratios = [a / b for a, b in zip(times[n], times["1 thread"])]
        res["vs_1_thread"][n] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        print(f"{n:26s} {statistics.median(times[n]):6.2f} s  time / 1 thread {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
