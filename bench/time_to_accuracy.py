"""Time to accuracy on the real model: rollout-control policies against uniform sampling, SmolLM2-135M-Instruct.

What a user buys a rollout system for is the wall-clock time to a given accuracy. Each arm is a `control` (and
`rollout.speculative`) configuration; everything else is the task's recipe, unchanged, so a difference between
arms comes from the controller, not from the workload. Every run is a plain `rollwise train` in a subprocess
(one at a time), with these definitions, the same for every arm:

- accuracy: greedy held-out accuracy, evaluated before training, every 2 steps and after, on the same held-out set
  (`run.eval_every: 2`, `run.eval_samples: 1`);
- time: training wall-clock, the sum of the steps' `step_s` (evaluations excluded); generated tokens and the
  process's CPU seconds are summed beside it (sequential runs on a shared box drift: read both);
- target: the median over seeds of the uniform arm's final greedy accuracy; time-to-target is the cost at the first
  evaluation at or above it; a seed that never reaches it counts as infinitely slow in the median (the table's
  "never"), and an arm most of whose seeds never reach it has none ("not reached"); 90% of uniform's gain is a
  second, steadier target;
- every arm gets the recipe's step budget (`--steps`, default the recipe's).

Tasks: `hard` (the low-base-rate slice of the mixed set: 3-digit addition and subtraction, 1-by-2-digit
multiplication; `make_mixed_data.py --kinds add3,sub3,mul12 --prefix hard`), where a recipe must show it carries
over; `addition` (the addition recipe on a 64-problem training subset, so that every problem comes back about
twice in 20 steps) and `mixed` (recipes/smollm2-mixed.yaml: eight kinds of problem from one-digit addition to
two-digit multiplication, 64 training problems). A run whose summary.json exists is not run again, so the bench
resumes; `--summarize` only reads the stored runs and writes the results and the curves.

    python recipes/make_addition_data.py && python recipes/make_mixed_data.py
    python bench/time_to_accuracy.py --task mixed --arms uniform,posterior --seeds 0      # screening
    python bench/time_to_accuracy.py --task mixed --arms uniform,posterior --seeds 0,1,2  # the finals
    python bench/time_to_accuracy.py --summarize

Results: bench/results-time-to-accuracy.json and docs/time-to-accuracy-<task>.svg.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rollwise.report import svg  # noqa: E402
from rollwise.report.data import (AccuracyCurve, accuracy_curve, load_metrics, load_summary,  # noqa: E402
                                  time_split, time_split_totals)

TASKS: dict[str, dict[str, Any]] = {
    "addition": {"config": "recipes/smollm2-addition.yaml", "train_subset": ("recipes/data/addition-train.jsonl", 64)},
    "mixed": {"config": "recipes/smollm2-mixed.yaml"},
    "hard": {"config": "recipes/smollm2-mixed.yaml", "sets": ["env.kwargs.path=recipes/data/hard-train.jsonl",
                                                            "env.kwargs.test_path=recipes/data/hard-test.jsonl"]},
}
"""Task -> its recipe, and optionally a training subset (source file, rows) written next to the runs."""

ARMS: dict[str, list[str]] = {
    "uniform": ["control.select=all"],  # explicit: the recipes ship with the posterior selector
    "posterior": ["control.select=posterior"],
    "posterior-norefill": ["control.select=posterior", "control.refill=false"],
    "adaptive": ["control.policy=adaptive"],
    "early_stop": ["control.policy=early_stop"],
    "dynamic": ["control.policy=dynamic"],
    "adaptive+posterior": ["control.policy=adaptive", "control.select=posterior"],
    # the step's samples split by each prompt's chance of a mixed group: up to 16 where a success was seen
    "knapsack+posterior": ["control.policy=knapsack", "control.select=posterior", "control.oversample=2.0"],
    # a past success of the prompt (from up to 8 versions back: a prompt comes back every 8 steps) added to each
    # all-failed group, and no other replay
    "rescue+posterior": ["control.select=posterior", "replay.enabled=true", "replay.reuse_per_step=0",
                         "replay.max_age=8"],
    "knapsack+rescue+posterior": ["control.policy=knapsack", "control.select=posterior", "control.oversample=2.0",
                                  "replay.enabled=true", "replay.reuse_per_step=0", "replay.max_age=8"],
    "early_stop+posterior": ["control.policy=early_stop", "control.select=posterior"],
    "adaptive+early_stop+posterior": ["control.policy=[adaptive,early_stop]", "control.select=posterior"],
    "early_stop+posterior-norefill": ["control.policy=early_stop", "control.select=posterior", "control.refill=false"],
    # levers for a low base rate (the hard slice): where a success is rare, find the first ones sooner
    "posterior-lr2e-5": ["control.select=posterior", "train.lr=2e-5"],
    "posterior-t0.7": ["control.select=posterior", "rollout.temperature=0.7"],
    "posterior-t0.7-lr2e-5": ["control.select=posterior", "rollout.temperature=0.7", "train.lr=2e-5"],
    "posterior-k16x4": ["control.select=posterior", "rollout.samples_per_prompt=16", "rollout.prompts_per_step=4"],
    "async": ["control.async_staleness=1", "algo.tis_cap=2.0"],
    "async+posterior": ["control.async_staleness=1", "algo.tis_cap=2.0", "control.select=posterior"],
    "speculative": ["rollout.speculative.source=past"],
    # NOT a controller arm: half the batch (a workload change), run to test why the controller arms do not pay
    # (is learning per step limited by the number of informative groups, or by the number of steps?)
    "batch4": ["rollout.prompts_per_step=4"],
    "posterior+speculative": ["control.select=posterior", "rollout.speculative.source=past"],
    # tree rollouts (docs/tree.md): fixed binary branching every 8 tokens, with the tree's own credit or plain GRPO
    "tree": ["control.select=all", "rollout.tree.branch=fixed", "rollout.tree.segment_tokens=8", "algo.advantage=tree"],
    "tree-grpo": ["control.select=all", "rollout.tree.branch=fixed", "rollout.tree.segment_tokens=8"],
    # four independent roots, each branching once at 8 tokens: pairs share only their first 8 tokens
    "tree-roots4": ["control.select=all", "rollout.tree.branch=fixed", "rollout.tree.segment_tokens=8",
                    "rollout.tree.roots=4", "algo.advantage=tree"],
    # branching where the policy is unsure (3 nats: the threshold that shared most on the recipe, bench/tree.py)
    "tree-entropy": ["control.select=all", "rollout.tree.branch=entropy", "rollout.tree.entropy_threshold=3.0",
                     "rollout.tree.segment_tokens=8", "algo.advantage=tree"],
    "tree+posterior": ["control.select=posterior", "rollout.tree.branch=fixed", "rollout.tree.segment_tokens=8",
                       "algo.advantage=tree"],
    # decided trees stopped: the leaves are scored as they end inside their tree (control/policies/early_stop.py)
    "tree-roots4+early_stop": ["control.select=all", "rollout.tree.branch=fixed", "rollout.tree.segment_tokens=8",
                               "rollout.tree.roots=4", "algo.advantage=tree", "control.policy=early_stop"],
    "tree+early_stop": ["control.select=all", "rollout.tree.branch=fixed", "rollout.tree.segment_tokens=8",
                        "algo.advantage=tree", "control.policy=early_stop"],
}
"""Arm -> `--set` overrides of the task's recipe (control and speculative settings only; the async arms add the
truncated importance-sampling cap that corrects for their one-version staleness, docs/control.md)."""

COMMON = ["run.eval_every=2", "run.eval_samples=1", "run.checkpoint_every=0", "run.keep_checkpoints=1"]


def run_dir(runs: Path, task: str, arm: str, seed: int) -> Path:
    return runs / task / arm / f"seed{seed}"


def run_one(runs: Path, task: str, arm: str, seed: int, steps: int | None, extra: list[str]) -> dict[str, Any]:
    """One `rollwise train` (skipped when its summary exists); the subprocess's wall and CPU seconds."""
    out = run_dir(runs, task, arm, seed)
    spec = TASKS[task]
    sets = [*COMMON, f"train.seed={seed}", *spec.get("sets", []), *ARMS[arm], *extra]
    if steps is not None:
        sets.append(f"train.steps={steps}")
    if "train_subset" in spec and not (out / "summary.json").is_file():
        src, n = spec["train_subset"]
        sub = runs / task / f"train-{n}.jsonl"
        if not sub.is_file():
            sub.parent.mkdir(parents=True, exist_ok=True)
            lines = (ROOT / src).read_text().splitlines()[:n]
            if len(lines) < n:
                raise SystemExit(f"{src} has {len(lines)} rows, the {task} task needs {n}: write the data first")
            sub.write_text("\n".join(lines) + "\n")
        sets.append(f"env.kwargs.path={sub}")
    return launch(out, ROOT / spec["config"], sets, f"{task}/{arm}/seed{seed}")


def launch(out: Path, config: Path, sets: list[str], label: str) -> dict[str, Any]:
    """`rollwise train CONFIG --out OUT --set ...` in a subprocess of this checkout's rollwise, one at a time, its
    output in OUT's parent (`<seed dir>.log`); skipped when OUT/summary.json exists. Its wall and CPU seconds and
    exit code, also written to OUT/bench_run.json."""
    if (out / "summary.json").is_file():
        print(f"[bench] {label}: stored, not rerun", flush=True)
        return {}
    cmd = [sys.executable, "-m", "rollwise.cli", "train", str(config), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    print(f"[bench] {label}: {' '.join(cmd[3:])}", flush=True)
    paths = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.log"
    with open(log_path, "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = {"wall_s": time.perf_counter() - t0, "cpu_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
            "returncode": rc, "load_after": Path("/proc/loadavg").read_text().split()[:3]}
    if out.is_dir():
        (out / "bench_run.json").write_text(json.dumps(info, indent=1))
    if rc != 0:
        print(f"[bench] {label} failed (exit {rc}); see {log_path}", flush=True)
    return info


def load_curve(path: Path) -> AccuracyCurve | None:
    summary, _ = load_summary(path / "summary.json")
    return accuracy_curve(load_metrics(path / "metrics.jsonl"), summary) if summary else None


PHASES = {"generate": "time_generate_s", "wait_rollouts": "time_wait_rollouts_s", "train": "time_train_s",
          "sync": "time_sync_s"}


def phases(path: Path) -> dict[str, float]:
    """Seconds summed over the run's steps: generation, waiting for rollouts (async), training, weight sync; and the
    share of groups with zero reward variance, and drafts' acceptance where speculation ran."""
    rows = load_metrics(path / "metrics.jsonl").rows
    out = {k: sum(float(r.get(m, 0.0)) for r in rows) for k, m in PHASES.items()}
    out["zero_var_frac"] = sum(float(r.get("zero_var_frac", 0.0)) for r in rows) / max(len(rows), 1)
    out["groups"] = sum(float(r.get("control_groups", 0.0)) for r in rows)
    acc = [r["control_spec_acceptance"] for r in rows if "control_spec_acceptance" in r]
    if acc:
        out["spec_acceptance_mean"] = sum(acc) / len(acc)
        out["spec_steps"] = len(acc)
    split = time_split(load_metrics(path / "metrics.jsonl"))
    if split:  # the generate phase split into useful / filtered / tail seconds (docs/outputs.md)
        out.update({f"split_{k}": v for k, v in time_split_totals(split).items()})
    return out


def print_time_split(path: Path) -> None:
    """Per step, where the time went: the generate phase's useful / filtered / tail seconds, then scoring, training,
    syncing and the rest of the step (rollwise.report.data.time_split), and the run's totals."""
    steps = time_split(load_metrics(path / "metrics.jsonl"))
    if not steps:
        raise SystemExit(f"{path / 'metrics.jsonl'} has no step with a measured tail (time_tail_s): a batch engine, "
                         "or a run from before it was logged")
    names = list(steps[0].parts)
    print("| step | " + " | ".join(f"{n} s" for n in names) + " | step s | tail share of generate |")
    print("|---" * (len(names) + 3) + "|")
    for st in steps:
        step_s = "-" if st.step_s is None else f"{st.step_s:.2f}"
        print(f"| {st.step} | " + " | ".join(f"{st.parts[n]:.2f}" for n in names) + f" | {step_s} | "
              f"{st.tail_frac:.2f} |")
    tot = time_split_totals(steps)
    step_total = sum(st.step_s or 0.0 for st in steps)
    print("| all | " + " | ".join(f"{tot[n]:.1f}" for n in names) + f" | {step_total:.1f} | {tot['tail_frac']:.2f} |")


def _spread(xs: list[float]) -> dict[str, Any] | None:
    """Median, min, max and count; an infinite value (a seed that never got there) is stored as None (JSON has no
    infinity)."""
    if not xs:
        return None
    fin = lambda v: v if math.isfinite(v) else None  # noqa: E731
    return {"median": fin(statistics.median(xs)), "min": fin(min(xs)), "max": fin(max(xs)), "n": len(xs)}


def summarize(runs: Path, tasks: list[str]) -> dict[str, Any]:
    """Per task: the target, and per arm each seed's cost to the target and final accuracy, medians and spread."""
    out: dict[str, Any] = {}
    for task in tasks:
        arms = {a: {int(p.name[4:]): c for p in sorted((runs / task / a).glob("seed*")) if p.is_dir()
                    and (c := load_curve(p)) is not None} for a in ARMS if (runs / task / a).is_dir()}
        arms = {a: v for a, v in arms.items() if v}
        if "uniform" not in arms:
            continue
        target = statistics.median(c.greedy[-1] for c in arms["uniform"].values())
        start = statistics.median(c.greedy[0] for c in arms["uniform"].values())
        # NOTE: uniform's final accuracy often sits on a plateau, where the evaluation's noise (about 4.5 points at 120
        # problems) decides whether a run ever touches it; 90% of uniform's gain is on the rising part of the curve.
        targets = {"target": target, "target90": start + 0.9 * (target - start)}
        res: dict[str, Any] = {"target_greedy": target, "target90_greedy": targets["target90"], "arms": {}}
        for arm, curves in arms.items():
            per = []
            for seed, c in sorted(curves.items()):
                run: dict[str, Any] = {"seed": seed, "final_greedy": c.greedy[-1], "best_greedy": max(c.greedy),
                                       "start_greedy": c.greedy[0], "train_s": c.train_s[-1], "tokens": c.tokens[-1],
                                       "cpu_s": c.cpu_s[-1], "steps": c.steps[-1],
                                       "phases": phases(run_dir(runs, task, arm, seed)),
                                       "curve": {"steps": c.steps, "train_s": c.train_s, "tokens": c.tokens,
                                                 "cpu_s": c.cpu_s, "greedy": c.greedy}}
                for name, t in targets.items():
                    i = c.first_reaching(t)
                    run[f"to_{name}"] = None if i is None else {"step": c.steps[i], "train_s": c.train_s[i],
                                                                "tokens": c.tokens[i], "cpu_s": c.cpu_s[i]}
                per.append(run)
            r: dict[str, Any] = {"runs": per, "final_greedy": _spread([p["final_greedy"] for p in per]),
                                 "train_s": _spread([p["train_s"] for p in per])}
            for name in targets:
                hits = [p[f"to_{name}"] for p in per]
                r[f"reached_{name}"] = f"{sum(h is not None for h in hits)}/{len(per)}"
                for unit, key in (("s", "train_s"), ("tokens", "tokens"), ("cpu_s", "cpu_s")):
                    # a run that never reached the target counts as infinitely slow: the median stays finite while
                    # most seeds reach it; None when it does not
                    vals = [math.inf if h is None or h[key] is None else float(h[key]) for h in hits]
                    spread = _spread(vals)
                    r[f"to_{name}_{unit}"] = spread if spread is not None and spread["median"] is not None else None
            res["arms"][arm] = r
        base = res["arms"]["uniform"]
        for arm, r in res["arms"].items():
            for name in targets:
                for unit in ("s", "tokens", "cpu_s"):
                    mine, theirs = r[f"to_{name}_{unit}"], base[f"to_{name}_{unit}"]
                    if mine and theirs:
                        r[f"speedup_{name}_{unit}"] = theirs["median"] / max(mine["median"], 1e-9)
        out[task] = res
        draw(task, arms, target)
    return out


def signal(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Groups sampled, those with reward variance (the ones that carry a gradient) and prompts the selector skipped,
    summed over the run's steps: what a policy bought with its tokens."""
    def total(key: str) -> int:
        return int(sum(float(r.get(key, 0.0)) for r in rows if "step_s" in r))

    groups = total("control_groups")
    return {"groups": groups, "informative_groups": groups - total("control_zero_variance_groups"),
            "skipped_prompts": total("control_skipped_prompts")}


def gains(runs: Path, task: str) -> dict[str, Any]:
    """Per arm and seed of `task`: greedy accuracy before and after, the gain, the groups sampled and those with a
    signal, and the samples trained on; the median gain per arm. What a low base rate is judged by (points gained in
    the recipe's steps), so it needs no uniform run beside the arms."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        per = []
        for p in sorted((runs / task / arm).glob("seed*")):
            if not (p / "summary.json").is_file():
                continue
            summ = json.loads((p / "summary.json").read_text())
            rows = [r for r in load_metrics(p / "metrics.jsonl").rows if "step_s" in r]
            before, after = summ["eval_before"]["accuracy_greedy"], summ["eval_after"]["accuracy_greedy"]
            sig = signal(rows)
            per.append({"seed": int(p.name[4:]), "before": before, "after": after, "gain": after - before,
                        "groups": sig["groups"], "informative_groups": sig["informative_groups"],
                        "kept_samples": sum(int(r.get("rollouts/kept", 0)) for r in rows),
                        "train_s": sum(float(r["step_s"]) for r in rows)})
        if per:
            out[arm] = {"runs": per, "gain": _spread([r["gain"] for r in per])}
    return out


def draw(task: str, arms: dict[str, dict[int, AccuracyCurve]], target: float) -> None:
    """docs/time-to-accuracy-<task>.svg: every run's greedy curve against training time, and the target."""
    series = [svg.Series(f"{arm} s{seed}", [x / 60 for x in c.train_s], c.greedy)
              for arm, curves in arms.items() for seed, c in sorted(curves.items())]
    t_max = max(x for s in series for x in s.xs)
    series.append(svg.Series(f"target {target:.2f}", [0.0, t_max], [target, target]))
    chart = svg.line_chart(series, x_label="training wall-clock (min, evaluations excluded)",
                           y_label="greedy held-out accuracy", y_zero=True)
    if chart:
        (ROOT / "docs" / f"time-to-accuracy-{task}.svg").write_text(chart)


def table(results: dict[str, Any]) -> str:
    """Markdown: per task and arm, medians (min-max) of time and tokens to each target, speed-ups, final accuracy."""
    lines = []

    def f(s: dict[str, float] | None, d: int = 0) -> str:
        if s is None:
            return "not reached"
        hi = "never" if s["max"] is None else f"{s['max']:.{d}f}"
        return f"{s['median']:.{d}f} ({s['min']:.{d}f}-{hi})"

    def x(r: dict[str, Any], name: str) -> str:
        return " / ".join(f"{r[k]:.2f}x" if (k := f"speedup_{name}_{u}") in r else "-" for u in ("s", "tokens", "cpu_s"))

    for task, res in results.items():
        lines += [f"\n{task}: target {100 * res['target_greedy']:.1f}% greedy (uniform's final, median over seeds); "
                  f"90% of uniform's gain: {100 * res['target90_greedy']:.1f}%\n",
                  "| arm | seeds | to target: s | tokens | speed-up s / tokens / CPU | to 90% of the gain: s | "
                  "speed-up s / tokens / CPU | final greedy % |", "|---|---|---|---|---|---|---|---|"]
        for arm, r in res["arms"].items():
            fin = r["final_greedy"]
            lines.append(f"| {arm} | {r['reached_target']} | {f(r['to_target_s'])} | {f(r['to_target_tokens'])} | "
                         f"{x(r, 'target')} | {f(r['to_target90_s'])} | {x(r, 'target90')} | "
                         f"{100 * fin['median']:.1f} ({100 * fin['min']:.1f}-{100 * fin['max']:.1f}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=sorted(TASKS), action="append", help="default: every task")
    ap.add_argument("--arms", default="uniform", help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=None, help="default: the recipe's train.steps")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more KEY=VALUE for every run")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "tta"))
    ap.add_argument("--summarize", action="store_true", help="only read the stored runs")
    ap.add_argument("--time-split", metavar="RUN_DIR", default=None,
                    help="print where one run's time went per step (useful / filtered / tail generation, scoring, "
                         "training, syncing) and stop")
    ap.add_argument("--gains", action="store_true",
                    help="only read the stored runs of each --task: every arm's greedy gain per seed (no uniform run "
                         "needed; the low-base-rate table)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results-time-to-accuracy.json"))
    args = ap.parse_args()
    if args.gains:
        res = {task: gains(Path(args.runs), task) for task in args.task or sorted(TASKS)}
        Path(args.json).write_text(json.dumps({"runs_dir": str(args.runs), "results": res}, indent=1))
        for task, arms in res.items():
            for arm, r in arms.items():
                print(f"{task} {arm}: gain " + " / ".join(f"{100 * x['gain']:+.1f}" for x in r["runs"]) +
                      f" (median {100 * r['gain']['median']:+.1f}), informative groups "
                      + " / ".join(str(x["informative_groups"]) for x in r["runs"]))
        return
    if args.time_split:
        print_time_split(Path(args.time_split))
        return
    runs, tasks = Path(args.runs), args.task or sorted(TASKS)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    if not args.summarize:
        for seed in (int(s) for s in args.seeds.split(",")):
            for task in tasks:
                for arm in arms:
                    run_one(runs, task, arm, seed, args.steps, args.extra)
    results = summarize(runs, sorted(TASKS))
    Path(args.json).write_text(json.dumps({"runs_dir": str(runs), "results": results}, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
