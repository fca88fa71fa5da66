"""What killable tools cost: tool calls in each episode's own process (`ToolEnv.isolation: process`) against threads.

    python bench/tools.py [--ballast-mib 600] [--episodes 30] [--out bench/results-tools.json]

Per episode: a reset, a pause standing in for the policy's first turn (the episode's process is forked meanwhile),
one call, ten more calls, then scoring (get_reward in the episode's process and its state back). Reports the median
latency of the first call, of later calls and of scoring, and the CPU seconds per episode (parent and children), with
`--ballast-mib` of resident memory to stand in for a loaded model (fork copies page tables, not pages). Then how long a
call whose C code holds the GIL (`pow(3, 15_000_000)`, about 5 s) keeps the caller with `tool_timeout_s: 0.5`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from rollwise.envs.agent import ToolEnv
from rollwise.envs.base import Task
from rollwise.models.tool_calls import render_tool_call


class Calc:
    def reset(self, **row):
        self.n = 0

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        self.n += 1
        return a + b

    def power(self, a: int, b: int) -> str:
        """Raise a to the power b.

        Args:
            a: The base.
            b: The exponent.
        """
        return "done" if pow(a, b) else "zero"

    def get_reward(self) -> float:
        return float(self.n)


class Data:
    name = "bench"

    def load(self, split="train", n=None, seed=0):
        return [Task("0", "q", None)]


def run(isolation: str, episodes: int, pause_s: float) -> dict:
    env = ToolEnv(Data(), Calc, "Calc", None, isolation=isolation, tool_timeout_s=0.5)
    call = render_tool_call("add", {"a": 1, "b": 2})
    first, later, score = [], [], []
    cpu0 = os.times()
    for _ in range(episodes):
        st = env.reset(Data().load()[0])
        time.sleep(pause_s)  # the policy's first turn
        t0 = time.perf_counter()
        env.step(st, call)
        t1 = time.perf_counter()
        for _ in range(10):
            env.step(st, call)
        t2 = time.perf_counter()
        env.score_episodes([st])
        t3 = time.perf_counter()
        env.teardown(st)
        first.append(t1 - t0)
        later.append((t2 - t1) / 10)
        score.append(t3 - t2)
    time.sleep(0.2)  # children reaped
    cpu1 = os.times()
    cpu = (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system
           - cpu0.user - cpu0.system - cpu0.children_user - cpu0.children_system)
    st = env.reset(Data().load()[0])
    t0 = time.perf_counter()
    env.step(st, render_tool_call("power", {"a": 3, "b": 15_000_000}))
    held = time.perf_counter() - t0
    env.teardown(st)
    return {"isolation": isolation, "first_call_ms": 1e3 * statistics.median(first),
            "later_call_us": 1e6 * statistics.median(later), "score_ms": 1e3 * statistics.median(score),
            "cpu_ms_per_episode": 1e3 * cpu / episodes, "gil_holding_call_held_caller_s": held}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ballast-mib", type=int, default=600)
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--pause-s", type=float, default=0.05)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ballast = np.ones(args.ballast_mib * (1 << 20) // 8)  # resident, as a loaded model's weights are
    rows = [run(iso, args.episodes, args.pause_s) for iso in ("thread", "process")]
    for r in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"ballast_mib": args.ballast_mib, "episodes": args.episodes, "rows": rows}, fh, indent=1)
    del ballast


if __name__ == "__main__":
    main()
