"""Two threads against one when a core is busy: rollwise's bf16 rollouts (and optionally a training step) at 1 and 2
torch threads, under each OpenMP wait policy, with a busy process of the bench's own pinned to one core.

OpenMP's threads meet at a barrier after every parallel region (hundreds per decode step). With one core taken by
another process, the thread that shares it is descheduled for whole time slices; a thread that spins at the barrier
(libgomp's default spins a while before sleeping; ACTIVE spins for good) keeps its own core busy, so the scheduler
cannot move the descheduled thread there. A PASSIVE thread sleeps at once and frees its core. The wait policy is
read once, when the OpenMP runtime loads (with torch), so every variant runs in a fresh subprocess with its
environment set and its engine loaded once; the variants then take turns, one timed generate call each per round
(`--rounds`), so contention from the rest of the machine falls on all of them alike. Reported: the median seconds per
call of each variant, the ratio of each to 1 thread (median and spread over the rounds), and the machine's load
average at the start.

Workload: SmolLM2-135M-Instruct (`--model`), `--seqs` sequences x (40 prompt + `--tokens` generated) tokens, no EOS,
temperature 1, `--dtype` weights (bfloat16: the case that collapsed). `--no-competitor` runs the same on the
machine as it is.

    python bench/shared_core.py [--rounds 5] [--seqs 8] [--tokens 32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

VARIANTS = {  # name -> (threads, OMP_WAIT_POLICY or None = libgomp's default)
    "1": (1, None),
    "2": (2, None),
    "2-active": (2, "ACTIVE"),
    "2-passive": (2, "PASSIVE"),
}

CHILD = """
import json, sys, time
import torch
from rollwise import LLM, SamplingParams
from rollwise.models.convert import resolve_model
model, dtype, seqs, tokens, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
torch.set_num_threads(threads)
llm = LLM(str(resolve_model(model)), dtype=dtype, max_model_len=64 + tokens, max_num_seqs=seqs)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(100, 40000, (40,), generator=g).tolist() for _ in range(seqs)]
params = SamplingParams(n=1, temperature=1.0, max_tokens=tokens, ignore_eos=True, seed=0)
llm.generate(prompts[:2], SamplingParams(n=1, temperature=1.0, max_tokens=4, ignore_eos=True, seed=0))
print(json.dumps({"ready": True, "threads": torch.get_num_threads()}), flush=True)
for _ in sys.stdin:
    t = time.perf_counter()
    llm.generate(prompts, params)
    print(json.dumps({"s": time.perf_counter() - t}), flush=True)
"""


class Variant:
    """One child process with its own OpenMP environment and a loaded engine; `time()` runs one timed generate."""

    def __init__(self, args: argparse.Namespace, threads: int, policy: str | None) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        cmd = [sys.executable, "-c", CHILD, args.model, args.dtype, str(args.seqs), str(args.tokens), str(threads)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._read()
        if ready.get("threads") != threads:
            raise SystemExit(f"asked for {threads} threads, the child runs {ready.get('threads')}")

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a variant's process died (exit code {self.proc.wait()})")
        return json.loads(line)

    def time(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return float(self._read()["s"])

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def competitor(core: int) -> subprocess.Popen:
    """A busy loop pinned to `core` (Linux affinity), the bench's own."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    os.sched_setaffinity(p.pid, {core})
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--core", type=int, default=1, help="the core the competing busy process is pinned to")
    ap.add_argument("--no-competitor", action="store_true")
    ap.add_argument("--variants", default="1,2,2-passive", help="threads[-wait policy], comma-separated, from: " + ", ".join(VARIANTS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",")]
    if "1" not in names:
        names.insert(0, "1")
    load = os.getloadavg()[0]
    busy = None if args.no_competitor else competitor(args.core)
    times: dict[str, list[float]] = {n: [] for n in names}
    procs: list[Variant] = []
    try:
        procs = [Variant(args, *VARIANTS[n]) for n in names]  # loaded one after another, then timed in turn
        for r in range(args.rounds):
            for n, v in zip(names, procs):
                times[n].append(v.time())
                print(f"round {r + 1} {n:10s} {times[n][-1]:6.2f} s", flush=True)
    finally:
        for v in procs:
            v.close()
        if busy is not None:
            busy.kill()
            busy.wait()
    cpus = os.cpu_count()
    print(f"{cpus} CPUs, load average {load:.1f} at start; competitor {'none' if busy is None else f'on core {args.core}'};"
          f" {args.seqs} x (40 + {args.tokens}) tokens, {args.dtype}")
    res: dict = {"cpus": cpus, "load_avg": load, "competitor_core": None if busy is None else args.core,
                 "seqs": args.seqs, "tokens": args.tokens, "dtype": args.dtype, "s": times, "vs_1_thread": {}}
    for n in names:
        ratios = [a / b for a, b in zip(times[n], times["1"])]
        res["vs_1_thread"][n] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        print(f"{n:10s} {statistics.median(times[n]):6.2f} s  time / 1 thread {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
