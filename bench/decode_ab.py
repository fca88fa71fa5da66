"""Engine decode throughput, this tree against another rollwise source tree (e.g. a commit checked out with
`git worktree add /tmp/before <commit>`), alternating in fresh subprocesses so that both see the same machine load.

Workload: SmolLM2-135M-Instruct, 8 chat-template prompts x `--n` samples (8: 64 sequences; 1: 8, the small batch
of an RL step's tail) x 128 new tokens, temperature 1, float32, ignore_eos (equal work). Reported per thread count:
every run's tokens/s, the medians and their ratio (after / before), and per tree the 2-thread / 1-thread scaling.

    python bench/decode_ab.py --before /tmp/before/src [--threads 1,2] [--n 8] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, time, torch
sys.path.insert(0, {bench!r})
torch.set_num_threads({threads})
from generate import chat_prompts
from rollwise import LLM, SamplingParams
from rollwise.models.convert import resolve_model
path = resolve_model("smollm2-135m")
ps, _ = chat_prompts(path, 8)
llm = LLM(path, device="cpu", dtype="float32", max_num_seqs=64, kv_cache_gb=1.0)
llm.generate(ps[:2], SamplingParams(n=2, max_tokens=4))
t = time.perf_counter()
outs = llm.generate(ps, SamplingParams(n={n}, temperature=1.0, max_tokens=128, ignore_eos=True, seed=0))
dt = time.perf_counter() - t
print(sum(len(o.token_ids) for r in outs for o in r.outputs) / dt)
"""


def run_once(src: Path, threads: int, n: int = 8) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    code = CHILD.format(bench=str(Path(__file__).parent), threads=threads, n=n)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run with {src} failed: {p.stderr.strip().splitlines()[-1]}")
    return float(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the src/ directory of the baseline tree")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (8 prompts): 8 = 64 sequences, 1 = 8")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    after = Path(__file__).resolve().parent.parent / "src"
    res: dict = {"before": args.before, "workload": f"smollm2-135m, 8 x {args.n} x 128, T=1, ignore_eos", "threads": {}}
    for th in (int(x) for x in args.threads.split(",")):
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            for name, src in (("before", Path(args.before)), ("after", after)):
                runs[name].append(run_once(src, th, args.n))
                print(f"[{th} thr] {name} {runs[name][-1]:.1f} tok/s", flush=True)
        b, a = statistics.median(runs["before"]), statistics.median(runs["after"])
        res["threads"][str(th)] = {"before_tok_s": runs["before"], "after_tok_s": runs["after"],
                                   "before_median": b, "after_median": a, "ratio": a / b}
        print(f"[{th} thr] median before {b:.1f} | after {a:.1f} tok/s | {a / b:.2f}x", flush=True)
    t = res["threads"]
    if "1" in t and "2" in t:
        res["scaling_2_over_1"] = {k: t["2"][f"{k}_median"] / t["1"][f"{k}_median"] for k in ("before", "after")}
        print("2-thread / 1-thread: " + ", ".join(f"{k} {v:.2f}x" for k, v in res["scaling_2_over_1"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
