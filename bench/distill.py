"""On-policy distillation against GRPO from the same start: SmolLM2-135M-Instruct on 2-digit addition.

The question: does a teacher's per-token signal bring the student to the teacher's accuracy in fewer steps (and less
wall-clock) than the reward alone? Two arms of recipes/smollm2-distill.yaml, everything else equal (model, data,
batch, learning rate, seed):

- `distill`: the recipe: the teacher (the addition recipe's trained checkpoint) scores every sampled token, the
  reverse KL is the advantage, the reward does not train (`algo.distill.reward_weight: 0`);
- `grpo`: the same recipe without the teacher (`algo.distill.teacher: null`): GRPO on the reward.

Definitions, the same for both arms:

- teacher accuracy: `rollwise eval --config RECIPE --model TEACHER`, greedy, on the held-out problems training
  evaluates on; the target is 90% of it (`--target`);
- curve: greedy held-out accuracy before training, every `--eval-every` steps and after (`run.eval_samples: 1`);
  cost: steps, and training wall-clock (the sum of the steps' `step_s`: evaluations excluded, the teacher's forward
  included); steps and seconds to the target are those of the first evaluation at or above it (None: never);
- `--seeds 0,1`: one run per arm and seed, `rollwise train` in a subprocess, one at a time (a SmolLM2 run holds
  about 9 GB); a run whose summary.json exists is not run again, so the bench resumes; `--summarize` only reads.

    python recipes/make_addition_data.py
    rollwise train recipes/smollm2-addition.yaml                 # the teacher (about 10-15 minutes on 2 cores)
    python bench/distill.py --seeds 0,1                          # 4 runs, each several minutes
    python bench/distill.py --smoke                              # tiny random models, 2 steps: the plumbing only

Results: bench/results-distill.json (the smoke run writes beside its runs, never there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rollwise.report.data import AccuracyCurve, accuracy_curve, load_metrics, load_summary  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-distill.yaml"
TEACHER = ROOT / "runs" / "smollm2-addition" / "checkpoints" / "step-20"
ARMS: dict[str, list[str]] = {
    "distill": [],
    "grpo": ["algo.distill.teacher=null"],
}
"""Arm -> `--set` overrides of the recipe."""


def run_one(runs: Path, arm: str, seed: int, sets: list[str]) -> None:
    """One `rollwise train` (skipped when its summary exists), with its subprocess wall and CPU seconds beside it
    (`time_to_accuracy.launch`)."""
    from time_to_accuracy import launch  # bench/ is this script's directory

    out = runs / arm / f"seed{seed}"
    info = launch(out, RECIPE, [*sets, f"train.seed={seed}", *ARMS[arm]], f"{arm}/seed{seed}")
    if info and info["returncode"] != 0:
        raise SystemExit(f"[distill] {arm}/seed{seed} failed (exit {info['returncode']}); see {out.parent / f'seed{seed}.log'}")


def teacher_accuracy(runs: Path, teacher: Path, sets: list[str]) -> dict[str, Any]:
    """The teacher's held-out accuracy, evaluated as training evaluates (stored in RUNS/teacher_eval.json)."""
    path = runs / "teacher_eval.json"
    if path.is_file():
        return json.loads(path.read_text())
    cmd = [sys.executable, "-m", "rollwise.cli", "eval", "--config", str(RECIPE), "--model", str(teacher),
           "--samples", "1", "--json"]
    for s in sets:
        if s.split("=", 1)[0] in ("env.eval_size", "run.eval_size", "rollout.max_tokens", "engine.kv_cache_gb"):
            cmd += ["--set", s]
    print(f"[distill] teacher: {' '.join(cmd[3:])}", flush=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"[distill] evaluating the teacher failed: {r.stderr.strip()}")
    res = json.loads(r.stdout)
    runs.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    return res


def load_curve(path: Path) -> AccuracyCurve | None:
    summary, _ = load_summary(path / "summary.json")
    return accuracy_curve(load_metrics(path / "metrics.jsonl"), summary) if summary else None


def _median(xs: list[float | None]) -> float | None:
    """Median over seeds, a seed that never got there counting as infinitely slow; None when most never did."""
    vals = sorted(float("inf") if x is None else x for x in xs)
    if not vals:
        return None
    m = statistics.median(vals)
    return None if m == float("inf") else m


def summarize(runs: Path, target: float) -> dict[str, Any]:
    """Per arm, per seed: the curve, steps and training seconds to the target, the final accuracy; then medians; and
    `speedup_steps` / `speedup_train_s` (GRPO's median over distillation's) when both arms ran."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        per = []
        for d in sorted((runs / arm).glob("seed*")):
            c = load_curve(d) if d.is_dir() else None
            if c is None:
                continue
            rows = load_metrics(d / "metrics.jsonl").rows
            i = c.first_reaching(target)
            bench = json.loads((d / "bench_run.json").read_text()) if (d / "bench_run.json").is_file() else {}
            kl = [r["distill_reverse_kl"] for r in rows if "distill_reverse_kl" in r]
            per.append({
                "seed": int(d.name[4:]), "steps_to_target": None if i is None else c.steps[i],
                "train_s_to_target": None if i is None else c.train_s[i], "final_greedy": c.greedy[-1],
                "best_greedy": max(c.greedy), "train_s": c.train_s[-1], "run_wall_s": bench.get("wall_s"),
                "teacher_s": sum(float(r.get("time_teacher_s", 0.0)) for r in rows),
                "reverse_kl_first_last": [kl[0], kl[-1]] if kl else None,
                "curve": {"steps": c.steps, "train_s": c.train_s, "greedy": c.greedy, "sampled": c.sampled},
            })
        if per:
            out[arm] = {"runs": per,
                        "median_steps_to_target": _median([p["steps_to_target"] for p in per]),
                        "median_train_s_to_target": _median([p["train_s_to_target"] for p in per]),
                        "median_final_greedy": statistics.median(p["final_greedy"] for p in per)}
    d, g = out.get("distill"), out.get("grpo")
    if d and g:
        for unit in ("steps", "train_s"):
            a, b = d[f"median_{unit}_to_target"], g[f"median_{unit}_to_target"]
            out[f"speedup_{unit}"] = None if a is None or b is None else b / max(a, 1e-9)
    return out


def smoke_models(runs: Path) -> tuple[Path, Path]:
    """Two tiny random Llamas with SmolLM2's tokenizer and chat template (student, teacher): the real prompts and
    tokens, seconds a step."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rollwise.models.convert import resolve_model

    smol = resolve_model("smollm2-135m")
    made = []
    for name, seed in (("student", 0), ("teacher", 1)):
        d = runs / "models" / name
        if not (d / "model.safetensors").is_file():
            cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                              bos_token_id=1, eos_token_id=2, pad_token_id=2)
            torch.manual_seed(seed)
            LlamaForCausalLM(cfg).save_pretrained(d)
            for f in smol.iterdir():
                if f.name.startswith(("tokenizer", "chat_template", "special_tokens_map", "generation_config")):
                    shutil.copy(f, d / f.name)
        made.append(d)
    return made[0], made[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="distill,grpo", help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--teacher", default=str(TEACHER), help="the teacher checkpoint (default: the addition recipe's)")
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.9, help="fraction of the teacher's greedy accuracy")
    ap.add_argument("--set", dest="extra", action="append", default=[], help="more KEY=VALUE for every run")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "distill-bench"))
    ap.add_argument("--json", default=str(ROOT / "bench" / "results-distill.json"))
    ap.add_argument("--summarize", action="store_true", help="only read the stored runs")
    ap.add_argument("--smoke", action="store_true", help="tiny random models, 2 steps, 4 held-out problems")
    ap.add_argument("--note", default=None, help="a line stored with the results (how the runs were made)")
    args = ap.parse_args()
    runs, teacher = Path(args.runs), Path(args.teacher)
    sets = [f"run.eval_every={args.eval_every}", "run.eval_samples=1", "run.checkpoint_every=0",
            "run.keep_checkpoints=1", *args.extra]
    if args.smoke:
        runs = Path(args.runs) if args.runs != ap.get_default("runs") else ROOT / "runs" / "distill-smoke"
        args.json = str(runs / "results.json")
        student, teacher = smoke_models(runs)
        sets = [f"model.path={student}", f"algo.distill.teacher={teacher}", "train.steps=2", "run.eval_every=1",
                "run.eval_samples=1", "env.eval_size=4", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2",
                "rollout.max_tokens=4", "model.device=cpu", *args.extra]
    elif not args.summarize and not (teacher / "config.json").is_file():
        raise SystemExit(f"no teacher checkpoint at {teacher}: run `rollwise train recipes/smollm2-addition.yaml` "
                         "first, or pass --teacher DIR")
    if not args.smoke:
        sets.append(f"algo.distill.teacher={teacher}")
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(ARMS)}")
    if args.summarize:
        t_eval = json.loads((runs / "teacher_eval.json").read_text())
    else:
        t_eval = teacher_accuracy(runs, teacher, sets)
        for seed in (int(s) for s in args.seeds.split(",")):
            for arm in arms:
                run_one(runs, arm, seed, sets)
    t_greedy = float(t_eval["accuracy_greedy"])
    target = args.target * t_greedy
    arms_res = summarize(runs, target)
    speedups = {k: arms_res.pop(k) for k in list(arms_res) if k.startswith("speedup_")}
    res = {"teacher": str(teacher), "teacher_greedy": t_greedy, "teacher_sampled": t_eval.get("accuracy"),
           "target_greedy": target, "target_fraction": args.target, "runs_dir": str(runs), "sets": sets,
           "arms": arms_res, **speedups, **({"note": args.note} if args.note else {})}
    Path(args.json).write_text(json.dumps(res, indent=1))
    print(f"teacher greedy {t_greedy:.3f}; target {target:.3f}")
    for arm, r in arms_res.items():
        print(f"{arm}: median steps to target {r['median_steps_to_target']}, training s "
                  f"{r['median_train_s_to_target']}, final greedy {r['median_final_greedy']:.3f}")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
