"""A whole recipe run end to end in several configurations, side by side: wall time, CPU seconds, time per phase
and held-out accuracy before and after, per configuration and seed.

Each arm is a named list of `--set` overrides on one recipe (`--recipe`). Within a repeat the arms run back to back
(the order rotates per repeat), one process at a time, so the load of a shared machine falls on all alike. Reported
per arm: wall seconds (median, min-max), CPU seconds of the run's process (user + system), the sum of the loop's
step_s, time_generate_s and time_train_s, and the greedy and sampled held-out accuracy before and after; and each arm's wall-time
ratio to the first arm per repeat (median, min-max).

    python bench/recipe_whole.py --recipe recipes/smollm2-addition.yaml \\
        --arm "before=model.dtype=float32,train.bf16=false" --arm "after=" [--repeats 3] [--seeds 0]
        [--out /tmp/recipe-whole] [--json bench/results-recipe-whole.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_arm(text: str) -> tuple[str, list[str]]:
    name, _, sets = text.partition("=")
    return name, [s for s in sets.split(",") if s.strip()]


def run_arm(recipe: str, sets: list[str], seed: int, out: Path) -> dict:
    if out.exists():
        shutil.rmtree(out)
    from time_to_accuracy import launch  # bench/ is this script's directory

    info = launch(out, Path(recipe), [f"train.seed={seed}", *sets], out.name)
    if info["returncode"] != 0:
        raise SystemExit(f"{out.name} failed (exit {info['returncode']}); see {out.parent / f'{out.name}.log'}")
    summary = json.loads((out / "summary.json").read_text())
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [m for m in steps if "step_s" in m]
    return {"wall_s": info["wall_s"], "cpu_s": info["cpu_s"],
            "step_s": sum(m["step_s"] for m in steps), "gen_s": sum(m.get("time_generate_s", 0.0) for m in steps),
            "train_s": sum(m.get("time_train_s", 0.0) for m in steps),
            "greedy_before": summary["eval_before"]["accuracy_greedy"],
            "greedy_after": summary["eval_after"]["accuracy_greedy"],
            "sampled_before": summary["eval_before"]["accuracy"], "sampled_after": summary["eval_after"]["accuracy"]}


def med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="recipes/smollm2-addition.yaml")
    ap.add_argument("--arm", action="append", required=True, help="NAME=key=value,key=value (the first is the baseline)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seeds", default="0", help="one seed per repeat, cycled (e.g. 0,1,2)")
    ap.add_argument("--out", default="/tmp/recipe-whole")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    arms = [parse_arm(x) for x in a.arm]
    seeds = [int(s) for s in a.seeds.split(",")]
    res: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "recipe": a.recipe, "arms": dict(arms), "runs": []}
    by_arm: dict[str, list[dict]] = {n: [] for n, _ in arms}
    for r in range(a.repeats):
        seed = seeds[r % len(seeds)]
        order = arms[r % len(arms):] + arms[: r % len(arms)]
        for name, sets in order:
            info = run_arm(a.recipe, sets, seed, Path(a.out) / f"{name}-{r}")
            info.update(arm=name, repeat=r, seed=seed, load_1m=os.getloadavg()[0])
            by_arm[name].append(info)
            res["runs"].append(info)
            print(f"[rep {r} seed {seed}] {name}: {info['wall_s']:.0f} s wall, {info['cpu_s']:.0f} CPU s, greedy "
                  f"{info['greedy_before']:.2f} -> {info['greedy_after']:.2f}, load {info['load_1m']:.1f}", flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps(res, indent=1))
    base = arms[0][0]
    res["summary"] = {}
    for name, runs in by_arm.items():
        s = {k: med([x[k] for x in runs]) for k in ("wall_s", "cpu_s", "step_s", "gen_s", "train_s", "greedy_after",
                                                   "sampled_after")}
        s["greedy_gain"] = med([x["greedy_after"] - x["greedy_before"] for x in runs])
        if name != base:
            s["wall_speedup_vs_" + base] = med([b["wall_s"] / x["wall_s"] for b, x in zip(by_arm[base], runs)])
        res["summary"][name] = s
        print(name, json.dumps(s), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
