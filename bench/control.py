"""Rollout-control policies side by side at a fixed seed (rollwise.control).

(a) tokens: generated tokens per useful (non-zero-variance) group and per token with a non-zero advantage, on a
    mixed-difficulty arithmetic set (ArithmeticEnv levels 1-6 shuffled together), for uniform, dynamic sampling,
    adaptive group size, the posterior selector, and mixes. The warmed-up built-in model samples; its weights are
    reloaded unchanged after each step (so the weight version moves and the posterior decays as in training, but
    the policy itself stays fixed: pass rates are stationary).
(b) tail: rollout-phase time per step (generate + score) when response lengths are heavy-tailed - every
    sample's max_tokens drawn from a Pareto distribution, ignore_eos, a random built-in model - uniform vs
    partial rollouts (same batch target of groups per step; weights reloaded between steps so carried samples
    resume under a new version and staleness is measured).
(c) time to accuracy: the loop from the warmed-up model, uniform vs a policy mix, held-out sampled accuracy
    evaluated every few steps; wall-clock (sum of step times, evaluation excluded) to the first evaluation at or
    above the target, and the final accuracy.

    python bench/control.py [--part a|b|c|all] [--device cpu|cuda] [--json out.json]

Everything runs with one torch thread on CPU (the machine is shared); on a GPU, (b) uses a larger model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


# ------------------------------------------------------------------------------------------------- shared


def warmed_model(tmp: Path, model: str | None) -> Path:
    """The warmed-up built-in model: --model, else the most-trained cached one, else warm one up (90 s)."""
    if model:
        return Path(model)
    from rollwise.run.warmup import default_cache_dir

    cands = []
    for root in (Path("/tmp/wcache"), default_cache_dir()):
        for d in root.glob("*/warmup.json") if root.is_dir() else []:
            cands.append((json.loads(d.read_text()).get("warmup_steps", 0), d.parent))
    if cands:
        return max(cands)[1]
    from rollwise.config import load_config
    from rollwise.envs import get_env
    from rollwise.run.warmup import prepare_builtin_model

    cfg = load_config(None, [])
    env = get_env("arithmetic")
    out = tmp / "warm"
    prepare_builtin_model(out, env.charset, env.load("train", seed=0), cfg.model.builtin, cfg.warmup,
                          "arithmetic:{}:None", 0, log=print)
    return out


def make_llm(model_dir: Path, device: str, dtype: str = "float32", **kw: Any):
    from rollwise.engine.llm import LLM

    return LLM(model_dir, device=device, dtype=dtype, seed=0, **kw)


def reload_same_weights(llm, model_dir: Path) -> None:
    """Bump the engine's weight version without changing the policy (as a trainer's update would, minus the update)."""
    from safetensors.torch import load_file

    llm.load_weights(load_file(str(model_dir / "model.safetensors")))


class Stream:
    """A seeded, cycling data order over tasks (the loop's DataOrder in miniature)."""

    def __init__(self, tasks, seed: int) -> None:
        self.tasks = list(tasks)
        random.Random(seed).shuffle(self.tasks)
        self.pos = 0

    def __call__(self, k: int):
        out = [self.tasks[(self.pos + i) % len(self.tasks)] for i in range(k)]
        self.pos += k
        return out


def control_cfg(**kw: Any):
    from rollwise.config import ControlConfig

    return ControlConfig(**kw)


# ------------------------------------------------------------------------------------------------- (a)


def mixed_arithmetic(per_level: int, seed: int):
    from rollwise.envs.arithmetic import LEVELS, ArithmeticEnv

    tasks = []
    for lvl in sorted(LEVELS):
        tasks += ArithmeticEnv(level=lvl).load("train", n=per_level, seed=seed)
    return ArithmeticEnv(), tasks


def part_a_seeds(model_dir: Path, device: str, steps: int, seeds: list[int]) -> dict[str, Any]:
    """(a) at several seeds (task set, data order and sampling all change), totals summed over seeds."""
    runs = {s: part_a(model_dir, device, steps, 8, 8, 8, s) for s in seeds}
    tot: dict[str, Any] = {"seeds": seeds, "per_seed": runs}
    for name in runs[seeds[0]]["reduction_vs_uniform"]:
        g = sum(runs[s][name]["generated"] for s in seeds)
        u = sum(runs[s][name]["useful_groups"] for s in seeds)
        ut = sum(runs[s][name]["useful_tokens"] for s in seeds)
        tot[name] = {"generated": g, "useful_groups": u, "tokens_per_useful_group": g / max(u, 1),
                     "tokens_per_useful_token": g / max(ut, 1)}
    base = tot["uniform"]["tokens_per_useful_group"]
    tot["reduction_vs_uniform"] = {k: base / tot[k]["tokens_per_useful_group"] for k in runs[seeds[0]]["reduction_vs_uniform"]}
    print(f"(a) over seeds {seeds}: tokens per useful group, uniform / policy: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in tot["reduction_vs_uniform"].items()), flush=True)
    return tot


def part_a(model_dir: Path, device: str, steps: int, B: int, K: int, per_level: int, seed: int) -> dict[str, Any]:
    from rollwise.control import make_controller
    from rollwise.train.advantages import assign_advantages
    from rollwise.types import SamplingParams

    env, tasks = mixed_arithmetic(per_level, seed)
    mixes = {
        "uniform": control_cfg(),
        "dynamic": control_cfg(policy="dynamic"),
        "adaptive": control_cfg(policy="adaptive"),
        "early_stop": control_cfg(policy="early_stop"),
        "posterior": control_cfg(select="posterior"),
        "adaptive+posterior": control_cfg(policy="adaptive", select="posterior"),
        "early_stop+posterior": control_cfg(policy="early_stop", select="posterior"),
    }
    res: dict[str, Any] = {"setup": f"{len(tasks)} prompts (levels 1-6 x {per_level}), {steps} steps x {B} groups "
                                    f"x {K} samples target, max_tokens 16, T=1, seed {seed}"}
    for name, cc in mixes.items():
        llm = make_llm(model_dir, device)
        ctl = make_controller(cc, env, llm.tokenizer, seed=seed)
        src = Stream(tasks, seed)
        tot = {"generated": 0, "useful_groups": 0, "groups": 0, "useful_tokens": 0, "rollouts": 0, "skipped": 0,
               "aborted_tokens": 0}
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            sp = SamplingParams(n=K, temperature=1.0, max_tokens=16, seed=seed * 1_000_003 + step)
            cs = ctl.run_step(llm, src, sp, step=step, batch_groups=B)
            assign_advantages(cs.groups, "grpo")
            acc = ctl.finalize(cs, llm.weight_version)
            tot["generated"] += acc.generated_tokens
            tot["useful_groups"] += acc.groups - acc.zero_variance_groups
            tot["groups"] += acc.groups
            tot["useful_tokens"] += acc.useful_tokens
            tot["rollouts"] += acc.total_rollouts
            tot["skipped"] += acc.skipped_prompts
            tot["aborted_tokens"] += acc.aborted_tokens
            reload_same_weights(llm, model_dir)
        tot["wall_s"] = time.perf_counter() - t0
        tot["tokens_per_useful_group"] = tot["generated"] / max(tot["useful_groups"], 1)
        tot["tokens_per_useful_token"] = tot["generated"] / max(tot["useful_tokens"], 1)
        res[name] = tot
        print(f"(a) {name:22s} generated {tot['generated']:6d}  useful groups {tot['useful_groups']:3d}/{tot['groups']:3d}"
              f"  tokens/useful group {tot['tokens_per_useful_group']:7.1f}  tokens/useful token "
              f"{tot['tokens_per_useful_token']:5.2f}  skipped {tot['skipped']}  {tot['wall_s']:.1f}s", flush=True)
    u = res["uniform"]["tokens_per_useful_group"]
    res["reduction_vs_uniform"] = {k: u / v["tokens_per_useful_group"] for k, v in res.items()
                                   if isinstance(v, dict) and "tokens_per_useful_group" in v}
    print("(a) tokens per useful group, uniform / policy: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in res["reduction_vs_uniform"].items()), flush=True)
    return res


# ------------------------------------------------------------------------------------------------- (b)


def pareto_params(lmin: int, lmax: int, alpha: float, seed: int):
    """Per-sample max_tokens ~ Pareto(alpha) from lmin, capped at lmax; ignore_eos, so the length is exactly that.
    Deterministic per (task, sample): a carried sample resumes toward the same length."""

    def fn(task, j, sp):
        u = (zlib.crc32(f"{seed}/{task.id}/{j}".encode()) + 0.5) / 2**32
        n = int(min(lmax, lmin * u ** (-1.0 / alpha)))
        return dataclasses.replace(sp, max_tokens=max(1, n), ignore_eos=True)

    return fn


def part_b(device: str, steps: int, B: int, K: int, lmin: int, lmax: int, alpha: float, seed: int,
           size: dict[str, int], dtype: str, tmp: Path) -> dict[str, Any]:
    from rollwise.control import PartialRolloutPolicy, RolloutController, UniformPolicy
    from rollwise.envs.arithmetic import ArithmeticEnv
    from rollwise.models.builtin import build_builtin_model
    from rollwise.types import SamplingParams

    env = ArithmeticEnv(level=2)
    model_dir = build_builtin_model(tmp / "random", env.charset, seed=seed, max_position_embeddings=lmax + 32, **size)
    tasks = env.load("train", n=400, seed=seed)
    params_fn = pareto_params(lmin, lmax, alpha, seed)
    res: dict[str, Any] = {"setup": f"random built-in model {size}, {dtype} on {device}; {steps} steps x {B} groups x "
                                    f"{K} samples; max_tokens ~ Pareto(alpha={alpha}) from {lmin}, capped at {lmax}, "
                                    "ignore_eos; first step excluded from the medians (warm-up)"}
    # Policies built directly (no pydantic config): the GPU image runs this part with its own python.
    for name, make in {"uniform": UniformPolicy, "partial(0.5)": lambda: PartialRolloutPolicy(over_provision=0.5),
                       "partial(1.0)": lambda: PartialRolloutPolicy(over_provision=1.0)}.items():
        llm = make_llm(model_dir, device, dtype, max_num_seqs=max(256, 2 * B * K), kv_cache_gb=16.0)
        ctl = RolloutController(make(), env, llm.tokenizer, params_fn=params_fn)
        src = Stream(tasks, seed)
        per_step, toks, idle, stale, groups = [], [], [], [], []
        for step in range(1, steps + 1):
            sp = SamplingParams(n=K, temperature=1.0, max_tokens=lmax, seed=seed * 1_000_003 + step)
            cs = ctl.run_step(llm, src, sp, step=step, batch_groups=B)
            acc = ctl.finalize(cs, llm.weight_version)
            per_step.append(acc.gen_s + acc.score_s)
            toks.append(acc.generated_tokens)
            groups.append(acc.groups)
            idle.append(acc.idle_s)
            stale.append((acc.staleness_mean, acc.staleness_max))
            reload_same_weights(llm, model_dir)
        body = slice(1, None)
        r = {"rollout_s_median": statistics.median(per_step[body]), "rollout_s": per_step,
             "tokens_per_s": sum(toks[body]) / sum(per_step[body]), "generated_tokens": toks,
             "idle_s_mean": statistics.mean(idle[body]), "staleness": stale, "groups": groups,
             # Partial rollouts may defer work to later steps; time per returned group over all steps does not hide it.
             "rollout_s_per_group": sum(per_step[body]) / sum(groups[body]),
             "carried_out_tokens_at_end": acc.carried_out_tokens}
        res[name] = r
        print(f"(b) {name:13s} rollout s/step median {r['rollout_s_median']:6.2f}  tokens/s {r['tokens_per_s']:7.0f}"
              f"  s/group {r['rollout_s_per_group']:6.3f}  idle s/step {r['idle_s_mean']:5.2f}  staleness mean "
              f"{statistics.mean(s[0] for s in stale[body]):.2f} max {max(s[1] for s in stale)}", flush=True)
    u = res["uniform"]["rollout_s_median"]
    res["speedup_vs_uniform"] = {k: u / res[k]["rollout_s_median"] for k in ("partial(0.5)", "partial(1.0)")}
    ug = res["uniform"]["rollout_s_per_group"]
    res["speedup_per_group_vs_uniform"] = {k: ug / res[k]["rollout_s_per_group"] for k in ("partial(0.5)", "partial(1.0)")}
    print("(b) rollout time per step, uniform / partial: "
          + ", ".join(f"{k} {v:.2f}x" for k, v in res["speedup_vs_uniform"].items())
          + "; per returned group: " + ", ".join(f"{k} {v:.2f}x" for k, v in res["speedup_per_group_vs_uniform"].items()),
          flush=True)
    return res


# ------------------------------------------------------------------------------------------------- (c)


def part_c(model_dir: Path, device: str, steps: int, target: float, every: int, tmp: Path) -> dict[str, Any]:
    from rollwise.config import load_config
    from rollwise.control.context import default_encoder
    from rollwise.run.evaluate import evaluate
    from rollwise.run.loop import train
    from rollwise.run.setup import make_env

    mixes = {
        "uniform": [],
        "posterior": ["control.select=posterior"],
        "adaptive+posterior": ["control.policy=adaptive", "control.select=posterior"],
        "async K=1": ["control.async_staleness=1", "algo.tis_cap=2.0"],
        "async K=1+posterior": ["control.async_staleness=1", "algo.tis_cap=2.0", "control.select=posterior"],
    }
    res: dict[str, Any] = {"setup": f"the loop (rollwise.run.loop.train) from the warmed-up model, embedded default recipe (its lr), {steps} steps "
                                    f"x 16 groups x 8 samples; checkpoints every {every} steps evaluated afterwards "
                                    "(64 held-out problems x 4 samples, T=1), so evaluation is outside the clock; "
                                    f"clock = sum of the loop's step times; target {target}"}
    for name, extra in mixes.items():
        out = tmp / f"c-{name.replace(' ', '_').replace('=', '')}"
        cfg = load_config(None, [
            f"model.path={model_dir}", f"run.out_dir={out}", f"train.steps={steps}", "run.cpu_threads=1",
            "rollout.prompts_per_step=16", "rollout.samples_per_prompt=8", "rollout.max_tokens=16",
            "env.eval_size=64", "run.eval_every=0", f"run.checkpoint_every={every}", "run.loggers=[jsonl]",
            f"model.device={device}", *extra])
        summary = train(cfg, log=lambda s: None)
        rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
        env = make_env(cfg.env)
        tasks = env.load("test", n=64, seed=cfg.train.seed)
        wall, hit = 0.0, None
        curve = [(0, 0.0, summary["eval_before"]["accuracy"])]
        for m in rows:
            wall += m["step_s"]
            if m["step"] % every == 0:
                llm = make_llm(out / "checkpoints" / f"step-{m['step']}", device)
                ev = evaluate(llm, default_encoder(llm.tokenizer), env, tasks, temperature=1.0, samples=4, max_tokens=16,
                              seed=cfg.train.seed + 7919)
                curve.append((m["step"], wall, ev["accuracy"]))
                if hit is None and ev["accuracy"] >= target:
                    hit = wall
        res[name] = {"time_to_target_s": hit, "final_accuracy": curve[-1][2], "train_wall_s": wall, "curve": curve,
                     "final_greedy": summary["eval_after"]["accuracy_greedy"]}
        print(f"(c) {name:20s} time to {target:.2f}: {hit if hit is None else round(hit, 1)} s  final sampled "
              f"{curve[-1][2]:.3f}  (loop time {wall:.1f}s; curve {[(s, round(w, 1), round(a, 3)) for s, w, a in curve]})",
              flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["a", "b", "c", "all"], default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="warmed-up model dir for (a) and (c); default: the cached one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default="0,1,2", help="(a): comma-separated seeds, totals summed over them")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--c-steps", type=int, default=30)
    ap.add_argument("--target", type=float, default=0.6)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)
    elif args.part != "b":
        raise SystemExit("bench/control.py: only --part b runs on a GPU here ((a) and (c) use the CPU tiny model)")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if args.part in ("a", "all"):
            out["a"] = part_a_seeds(warmed_model(tmp, args.model), args.device, args.steps,
                                    [int(x) for x in args.seeds.split(",")])
        if args.part in ("b", "all"):
            if args.device == "cpu":
                # Small enough that a decode step's fixed cost matters (1 seq 3.6 ms, 128 seqs 11 ms on one thread).
                size = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, intermediate_size=256)
                out["b"] = part_b("cpu", 12, 8, 8, 8, 192, 1.2, args.seed, size, "float32", tmp)
            else:
                # Sized to fit a few minutes of device time: ~25M parameters, 16 groups x 8, lengths up to 256.
                size = dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=2048)
                out["b"] = part_b(args.device, 5, 16, 8, 8, 256, 1.2, args.seed, size, "bfloat16", tmp)
        if args.part in ("c", "all"):
            out["c"] = part_c(warmed_model(tmp, args.model), args.device, args.c_steps, args.target, 5, tmp)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
