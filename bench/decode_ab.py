"""Engine decode throughput, this tree against another rollwise source tree (e.g. a commit checked out with
`git worktree add /tmp/before <commit>`), alternating in fresh subprocesses so that both see the same machine load.

Workload: SmolLM2-135M-Instruct, 8 chat-template prompts x 8 samples x 128 new tokens, temperature 1, float32,
ignore_eos (equal work: 8,192 tokens per run). Reported per thread count: every run's tokens/s, the medians and their
ratio (after / before).

    python bench/decode_ab.py --before /tmp/before/src [--threads 1,2] [--repeats 3] [--json out.json]
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
outs = llm.generate(ps, SamplingParams(n=8, temperature=1.0, max_tokens=128, ignore_eos=True, seed=0))
dt = time.perf_counter() - t
print(sum(len(o.token_ids) for r in outs for o in r.outputs) / dt)
"""


def run_once(src: Path, threads: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    code = CHILD.format(bench=str(Path(__file__).parent), threads=threads)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run with {src} failed: {p.stderr.strip().splitlines()[-1]}")
    return float(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the src/ directory of the baseline tree")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    after = Path(__file__).resolve().parent.parent / "src"
    res: dict = {"before": args.before, "workload": "smollm2-135m, 8 x 8 x 128, T=1, ignore_eos", "threads": {}}
    for th in (int(x) for x in args.threads.split(",")):
        runs: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            for name, src in (("before", Path(args.before)), ("after", after)):
                runs[name].append(run_once(src, th))
                print(f"[{th} thr] {name} {runs[name][-1]:.1f} tok/s", flush=True)
        b, a = statistics.median(runs["before"]), statistics.median(runs["after"])
        res["threads"][str(th)] = {"before_tok_s": runs["before"], "after_tok_s": runs["after"],
                                   "before_median": b, "after_median": a, "ratio": a / b}
        print(f"[{th} thr] median before {b:.1f} | after {a:.1f} tok/s | {a / b:.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
