"""Rollout control where generations are long: the controller's arms on the long-tail task, SmolLM2-135M-Instruct.

The earlier measurements (docs/control.md) were on answers of at most 32 tokens, where a step has no tail to cut.
Here every arm trains recipes/smollm2-longtail.yaml (multi-step arithmetic with its working, up to 256 tokens; a
few samples of each step run to the limit while the median ends near 70) and changes only its `control`,
`rollout.speculative` or `rollout.tree` settings. Each run is a plain `rollwise train` in a subprocess, one at a
time, with bench/time_to_accuracy.py's definitions: greedy held-out accuracy every `--eval-every` steps, time = the
sum of the steps' `step_s`, target = uniform's final greedy accuracy (median over seeds). Beside time to target each
arm reports where its time went (docs/outputs.md): the generate phase's useful, filtered and tail seconds, and
training, from metrics.jsonl (`rollwise.report.data.time_split`). A run whose summary.json exists is not run again.

    python recipes/make_longtail_data.py
    python bench/longtail.py --arms uniform,partial --seeds 0            # hours on a 2-core CPU: about a minute a step
    python bench/longtail.py --summarize
    python bench/longtail.py --smoke                                     # every arm, 2 steps, a tiny random model

`--smoke` checks the arms, not the task: a randomly initialised model of the built-in architecture (a character
tokenizer over the data's characters, hidden 32) on a few of the task's problems, 2 steps of 2 prompts x 8 samples,
up to 24 tokens, every arm once; it checks that each run finished and logged the tail. It takes a few minutes of CPU.

Results: bench/results-longtail.json (not written by --smoke).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import string
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from time_to_accuracy import _spread, launch, load_curve, phases, signal  # noqa: E402

from rollwise.report.data import load_metrics, time_split  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-longtail.yaml"

ARMS: dict[str, list[str]] = {
    "uniform": ["control.select=all", "control.policy=uniform"],
    # partial rollouts: keep 1.5x / 2x the groups in flight, stop the step once enough are complete, carry the rest
    "partial": ["control.select=all", "control.policy=partial", "control.over_provision=0.5", "algo.tis_cap=2.0"],
    "partial-1.0": ["control.select=all", "control.policy=partial", "control.over_provision=1.0", "algo.tis_cap=2.0"],
    "early_stop": ["control.select=all", "control.policy=early_stop"],
    "posterior": ["control.select=posterior", "control.policy=uniform"],
    "posterior-norefill": ["control.select=posterior", "control.policy=uniform", "control.refill=false"],
    "adaptive": ["control.select=all", "control.policy=adaptive"],
    # compositions: skip predicted zero-variance prompts, and cut the tail of what is sampled
    "posterior+partial": ["control.select=posterior", "control.policy=partial", "control.over_provision=0.5",
                          "algo.tis_cap=2.0"],
    # GRESO's trade: skipped prompts are not replaced, so a step samples fewer groups and costs less
    "posterior-norefill+partial": ["control.select=posterior", "control.refill=false", "control.policy=partial",
                                   "control.over_provision=0.5", "algo.tis_cap=2.0"],
    "posterior+early_stop": ["control.select=posterior", "control.policy=early_stop"],
    "posterior+knapsack": ["control.select=posterior", "control.policy=knapsack", "control.oversample=2.0"],
    "adaptive+posterior": ["control.select=posterior", "control.policy=adaptive"],
    "async": ["control.select=all", "control.policy=uniform", "control.async_staleness=1", "algo.tis_cap=2.0"],
    # drafts from the prompt's completions the last time it came back (an epoch ago: 8 steps on this recipe)
    "speculative": ["control.select=all", "control.policy=uniform", "rollout.speculative.source=past"],
    # tree rollouts: binary branching every 16 tokens (a working line), the tree's own credit; four roots
    "tree": ["control.select=all", "control.policy=uniform", "rollout.tree.branch=fixed",
             "rollout.tree.segment_tokens=16", "algo.advantage=tree"],
    "tree-roots4": ["control.select=all", "control.policy=uniform", "rollout.tree.branch=fixed",
                    "rollout.tree.segment_tokens=16", "rollout.tree.roots=4", "algo.advantage=tree"],
}
"""Arm -> `--set` overrides of the recipe. Each names its selector and policy (the recipe ships the posterior without
refill + partial, so every arm starts from RESET, the selector's defaults, and says what it changes); the partial and
async arms name the importance-sampling cap their staleness needs even when the engine runs in
float32."""

RESET = ["control.refill=true"]
"""Applied before every arm's overrides: the recipe's `refill: false` back to the default (inert under select=all)."""

SMOKE = ["model.dtype=float32", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=8", "rollout.max_tokens=24",
         "env.eval_size=4", "run.eval_samples=1", "train.steps=2", "run.eval_every=0", "run.loggers=[jsonl]",
         "engine.kv_cache_gb=0.05", "train.bf16=false", "algo.skip_zero_variance=false"]
"""What --smoke changes besides the model and the data: a run of seconds."""


def common(eval_every: int) -> list[str]:
    return [f"run.eval_every={eval_every}", "run.eval_samples=1", "run.checkpoint_every=0", "run.keep_checkpoints=1"]


def summarize(runs: Path, target: float | None = None) -> dict[str, Any]:
    """Per arm and seed: final greedy accuracy, training time, time to `target` (default: uniform's median final
    accuracy over the uniform runs under `runs`), and where the time went (generate: useful / filtered / tail; train);
    medians over seeds."""
    arms = {a: {int(p.name[4:]): p for p in sorted((runs / a).glob("seed*")) if (p / "summary.json").is_file()}
            for a in ARMS if (runs / a).is_dir()}
    curves = {a: {s: c for s, p in seeds.items() if (c := load_curve(p)) is not None} for a, seeds in arms.items()}
    base = curves.get("uniform") or {}
    if target is None and base:
        target = statistics.median(c.greedy[-1] for c in base.values())
    out: dict[str, Any] = {"target_greedy": target, "arms": {}}
    for arm, seeds in curves.items():
        per = []
        for seed, c in sorted(seeds.items()):
            ph = phases(arms[arm][seed])
            hit = c.first_reaching(target) if target is not None else None
            rows = load_metrics(arms[arm][seed] / "metrics.jsonl").rows
            steps = len(rows)
            per.append({"seed": seed, "final_greedy": c.greedy[-1], "train_s": c.train_s[-1], "tokens": c.tokens[-1],
                        "tokens_per_step": c.tokens[-1] / max(steps, 1),
                        "tail_step_frac": ph.get("split_tail", 0.0) / c.train_s[-1] if c.train_s[-1] else None,
                        "to_target_s": None if hit is None else c.train_s[hit],
                        **signal(rows),
                        **{k: v for k, v in ph.items()
                           if k.startswith("split_") or k in ("generate", "train", "spec_acceptance_mean")}})
        out["arms"][arm] = {"runs": per, **{k: _spread(_values(per, k))
                                            for k in ("final_greedy", "train_s", "to_target_s", "split_useful",
                                                      "split_filtered", "split_tail", "split_tail_frac",
                                                      "tail_step_frac", "tokens_per_step", "train", "informative_groups")}}
    return out


def _values(per: list[dict[str, Any]], key: str) -> list[float]:
    """One number per seed; a seed that never reaches the target counts as infinitely slow (the rule of
    bench/time_to_accuracy.py), other missing values are left out."""
    if key == "to_target_s":
        return [math.inf if r[key] is None else float(r[key]) for r in per]
    return [float(r[key]) for r in per if r.get(key) is not None]


def table(res: dict[str, Any]) -> str:
    def med(r: dict[str, Any], k: str, fmt: str = "{:.1f}") -> str:
        v = r.get(k)
        return "-" if not v or v["median"] is None else fmt.format(v["median"])

    t = res["target_greedy"]
    lines = [f"target: {'-' if t is None else f'{100 * t:.1f}%'} greedy (uniform's final, median over seeds)",
             "| arm | seeds | train s | to target s | speed-up | generate: useful / filtered / tail s | tail share of "
             "generate / of step | tokens per step | informative groups | training s | final greedy |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = res["arms"].get("uniform", {}).get("to_target_s") or {}
    for arm, r in res["arms"].items():
        gen = " / ".join(med(r, k) for k in ("split_useful", "split_filtered", "split_tail"))
        own = (r.get("to_target_s") or {}).get("median")
        speed = f"{base['median'] / own:.2f}x" if own and base.get("median") else "-"
        lines.append(f"| {arm} | {len(r['runs'])} | {med(r, 'train_s')} | {med(r, 'to_target_s')} | {speed} | {gen} | "
                     f"{med(r, 'split_tail_frac', '{:.2f}')} / {med(r, 'tail_step_frac', '{:.2f}')} | "
                     f"{med(r, 'tokens_per_step', '{:.0f}')} | {med(r, 'informative_groups', '{:.0f}')} | {med(r, 'train')} | {med(r, 'final_greedy', '{:.1%}')} |")
    return "\n".join(lines)


def smoke(runs: Path, arms: list[str]) -> None:
    """Every arm for 2 steps on a tiny random model over a few of the task's problems; fails unless each run
    finished and logged the tail of its generate phase."""
    from rollwise.models.builtin import build_builtin_model

    spec = importlib.util.spec_from_file_location("make_longtail_data", ROOT / "recipes" / "make_longtail_data.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    data = runs / "data"
    data.mkdir(parents=True, exist_ok=True)
    mix = gen.parse_mix(gen.DEFAULT_MIX)
    for name, test, n in (("train", False, 8), ("test", True, 4)):
        rows = gen.draw(n, mix, gen.DEFAULT_LARGE, test, 0, 2)
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = runs / "model"
    if not (model / "config.json").is_file():
        build_builtin_model(model, string.printable, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=2,
                            intermediate_size=64, max_position_embeddings=1024)
    sets = [f"model.path={model}", f"env.kwargs.path={data / 'train.jsonl'}",
            f"env.kwargs.test_path={data / 'test.jsonl'}", *SMOKE]
    bad = []
    for arm in arms:
        out = runs / arm / "seed0"
        launch(out, RECIPE, [*sets, *RESET, *ARMS[arm]], f"smoke/{arm}")
        rows = load_metrics(out / "metrics.jsonl").rows
        if not (out / "summary.json").is_file():
            bad.append(f"{arm}: no summary.json (see {out.parent / 'seed0.log'})")
        elif len(time_split(load_metrics(out / "metrics.jsonl"))) != len(rows):
            bad.append(f"{arm}: a step without time_tail_s in {out / 'metrics.jsonl'}")
    print(table(summarize(runs)))
    if bad:
        raise SystemExit("smoke failed:\n  " + "\n  ".join(bad))
    print(f"smoke: {len(arms)} arms ran and logged their tail")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=None, help=f"comma-separated, of: {', '.join(ARMS)}; 'all' for every arm "
                                                 "(default: uniform; with --smoke, all)")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=None, help="default: the recipe's train.steps")
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more KEY=VALUE for every run")
    ap.add_argument("--runs", default=None, help="default runs/longtail (runs/longtail-smoke with --smoke)")
    ap.add_argument("--summarize", action="store_true", help="only read the stored runs")
    ap.add_argument("--smoke", action="store_true", help="every arm (or --arms), 2 steps, a tiny random model")
    ap.add_argument("--target", type=float, default=None,
                    help="greedy accuracy to time each arm to (default: the median final of the uniform runs under "
                         "--runs; give it when those runs are elsewhere)")
    ap.add_argument("--json", default=str(ROOT / "bench" / "results-longtail.json"))
    args = ap.parse_args()
    spec = args.arms or ("all" if args.smoke else "uniform")
    arms = list(ARMS) if spec == "all" else [a.strip() for a in spec.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    if args.smoke:
        smoke(Path(args.runs or ROOT / "runs" / "longtail-smoke"), arms)
        return
    runs = Path(args.runs or ROOT / "runs" / "longtail")
    if not args.summarize:
        if not (ROOT / "recipes" / "data" / "longtail-train.jsonl").is_file():
            raise SystemExit("recipes/data/longtail-train.jsonl not found: run `python recipes/make_longtail_data.py`")
        for seed in (int(s) for s in args.seeds.split(",")):
            for arm in arms:
                sets = [*common(args.eval_every), f"train.seed={seed}", *RESET, *ARMS[arm], *args.extra]
                if args.steps is not None:
                    sets.append(f"train.steps={args.steps}")
                launch(runs / arm / f"seed{seed}", RECIPE, sets, f"longtail/{arm}/seed{seed}")
    res = summarize(runs, args.target)
    Path(args.json).write_text(json.dumps({"runs_dir": str(runs), "results": res}, indent=1))
    print(table(res))


if __name__ == "__main__":
    main()
