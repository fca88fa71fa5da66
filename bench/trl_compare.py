"""rollwise vs TRL's `GRPOTrainer` on SmolLM2-135M-Instruct: same model, task, chat template, batch, max length,
loss and learning rate, in one process one after the other.

Task: two-digit addition ("What is 47 + 38?"), reward 1 when the last integer in the completion is the sum. It is
written into the bench's temp dir as a `dataset` JSONL (a `prompt` message list and an `answer` column) plus a
TRL-convention reward file, and both frameworks get exactly those: rollwise through `env.name=dataset` and
`env.reward=rewards.py:correct_sum`, TRL as its train dataset and `reward_funcs`. Each step: 8 prompts x 8
samples, temperature 1, GRPO (group-normalised advantages, clipped ratio, no KL), AdamW lr 1e-5, grad clip 1,
float32 on the CPU. Zero-variance groups are kept in rollwise (`algo.skip_zero_variance=false`), as TRL keeps them.

Reported per max-new-tokens setting (64 and 128 by default): the median seconds of a step (each framework's own
step: generate + score + train + weight sync; rollwise's `step_s`, TRL's time between `on_step_begin` and
`on_step_end`), all per-step times (spread), mean completion length, and both reward curves over the same steps.

Each framework runs in its own subprocess (a clean heap; its peak RSS is reported), one after the other.

    python bench/trl_compare.py [--steps 4] [--max-tokens 64,128] [--trl-precisions float32,bf16]
        [--rollwise-set model.dtype=bfloat16] [--json bench/results-trl-compare-smollm2.json]

TRL's `bf16=True` (its default) is bf16 autocast over float32 weights on the CPU too; rollwise runs in its own
default precision unless `--rollwise-set` says otherwise (the JSON records what `train.bf16: auto` resolved to).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REWARD_PY = '''import re


def correct_sum(completions, answer, **kwargs):
    """1.0 when the last integer in the completion equals the answer (TRL's batch convention)."""
    out = []
    for c, a in zip(completions, answer):
        text = c[-1]["content"] if isinstance(c, list) else c
        nums = re.findall(r"-?\\d+", text.replace(",", ""))
        out.append(1.0 if nums and int(nums[-1]) == int(a) else 0.0)
    return out
'''


def write_task(root: Path, n_train: int = 400, n_test: int = 50, seed: int = 0) -> tuple[Path, Path, Path]:
    rng = random.Random(seed)
    pairs = set()
    while len(pairs) < n_train + n_test:
        pairs.add((rng.randint(10, 99), rng.randint(10, 99)))
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b} for a, b in sorted(pairs)]
    rng.shuffle(rows)
    root.mkdir(parents=True, exist_ok=True)
    train, test = root / "train.jsonl", root / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:n_train]))
    test.write_text("".join(json.dumps(r) + "\n" for r in rows[n_train:]))
    (root / "rewards.py").write_text(REWARD_PY)
    return train, test, root / "rewards.py"


def run_rollwise(model: Path, task: tuple[Path, Path, Path], steps: int, lr: float, max_tokens: int, out: Path,
                 sets: list[str] | None = None) -> dict:
    """rollwise's loop from a config file; `sets`: `--set`-style overrides (KEY=VALUE, YAML values)."""
    import yaml

    from rollwise.config import load_config
    from rollwise.run.loop import train
    from rollwise.run.setup import training_precision

    train_p, test_p, reward_p = task
    # A config file, as a user writes one: every other key takes rollwise's code default (two threads here, as TRL
    # gets). NOTE: `load_config(None, ...)` would start from the embedded tiny-model recipe instead (one thread,
    # 512-token rows), which is what an earlier version of this bench did by mistake.
    settings = {
        "model": {"path": str(model), "device": "cpu"},
        "run": {"out_dir": str(out), "tensorboard": False},
        "train": {"steps": steps, "lr": lr, "grad_clip": 1.0},
        "rollout": {"prompts_per_step": 8, "samples_per_prompt": 8, "max_tokens": max_tokens, "temperature": 1.0},
        "algo": {"loss": "grpo", "advantage": "grpo", "kl_coef": 0.0, "skip_zero_variance": False},
        "env": {"name": "dataset", "kwargs": {"path": str(train_p), "test_path": str(test_p)},
                "reward": f"{reward_p}:correct_sum", "eval_size": 8},
        "engine": {"kv_cache_gb": 1},
    }
    cfg_path = out.parent / f"{out.name}.yaml"
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    cfg = load_config(cfg_path, overrides=list(sets or []))
    train(cfg, log=lambda s: None)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step_s" in r]
    return {"step_s": [r["step_s"] for r in rows], "reward": [r["reward_mean"] for r in rows],
            "completion_len": [r.get("resp_len_mean") for r in rows], "logprob_mismatch_max": [r.get("logprob_mismatch_max") for r in rows],
            "time_train_s": [r.get("time_train_s") for r in rows], "time_generate_s": [r.get("time_generate_s") for r in rows],
            "train_precision": training_precision(cfg, "cpu"), "engine_dtype": cfg.model.dtype}


def run_trl(model: Path, task: tuple[Path, Path, Path], steps: int, lr: float, max_tokens: int, out: Path,
            bf16: bool = False) -> dict:
    """TRL's GRPOTrainer; `bf16`: its `bf16=True` (TRL's default: bf16 autocast through accelerate, float32 weights)."""
    import importlib.util

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    train_p, _, reward_p = task
    spec = importlib.util.spec_from_file_location("bench_rewards", reward_p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    ds = load_dataset("json", data_files=str(train_p), split="train")
    tok = AutoTokenizer.from_pretrained(str(model))
    tok.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=64, num_generations=8, max_completion_length=max_tokens,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, loss_type="grpo", temperature=1.0, top_k=0, top_p=1.0, max_steps=steps, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, bf16=bf16, seed=0, disable_dropout=True,
        log_completions=False, dataloader_num_workers=0,
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            times.append(time.perf_counter() - self.t)

    trainer = GRPOTrainer(model=policy, reward_funcs=[mod.correct_sum], args=args, train_dataset=ds,
                          processing_class=tok, callbacks=[Timer()])
    trainer.train()
    hist = [h for h in trainer.state.log_history if "reward" in h]
    return {"step_s": times, "reward": [h["reward"] for h in hist],
            "completion_len": [h.get("completions/mean_length") for h in hist]}


def _in_child(which: str, mt: int, args, task_root: Path, out: Path) -> dict:
    """Run one framework in its own process, so each starts from a clean heap and its memory is freed after."""
    import subprocess

    cmd = [sys.executable, __file__, "--child", which, str(mt), str(task_root), str(out), "--steps", str(args.steps),
           "--lr", str(args.lr), "--model", args.model]
    for s in args.rollwise_set:
        cmd += ["--rollwise-set", s]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: " + (p.stderr.strip().splitlines() or [""])[-1][-300:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--max-tokens", default="64,128")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--trl-precisions", default="float32", help="TRL runs: float32 and/or bf16 (its default)")
    ap.add_argument("--rollwise-set", action="append", default=[], help="KEY=VALUE overrides of rollwise's config")
    args = ap.parse_args(argv)
    import torch
    from rollwise.models.convert import resolve_model

    model = resolve_model(args.model)
    if args.child:
        which, mt, root, out = args.child
        root = Path(root)
        task = (root / "train.jsonl", root / "test.jsonl", root / "rewards.py")
        t0 = time.perf_counter()
        if which == "rollwise":
            r = run_rollwise(model, task, args.steps, args.lr, int(mt), Path(out), args.rollwise_set)
        else:
            r = run_trl(model, task, args.steps, args.lr, int(mt), Path(out), bf16=which == "trl-bf16")
        import resource

        r.update(wall_s=time.perf_counter() - t0, torch_threads=torch.get_num_threads(), peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(r))
        return 0
    res: dict = {"model": str(args.model), "steps": args.steps, "lr": args.lr, "torch_threads": torch.get_num_threads(),
                 "settings": {}}
    try:
        import trl

        res["trl_version"] = trl.__version__
    except ImportError as e:
        res["trl_error"] = f"TRL not importable: {e}"
        args.skip_trl = True
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "task"
        write_task(root)
        for mt in [int(x) for x in args.max_tokens.split(",")]:
            row: dict = {"rollwise": _in_child("rollwise", mt, args, root, Path(tmp) / f"rw{mt}")}
            print(f"[{mt}] rollwise {row['rollwise']}", flush=True)
            for prec in ([] if args.skip_trl else args.trl_precisions.split(",")):
                key = "trl" if prec == "float32" else f"trl-{prec}"
                row[key] = _in_child(key, mt, args, root, Path(tmp) / f"{key}{mt}")
                print(f"[{mt}] TRL {prec} {row[key]}", flush=True)
            if "step_s" in row["rollwise"]:
                o = statistics.median(row["rollwise"]["step_s"])
                row["rollwise_step_s_median"] = o
                for key in [k for k in row if k.startswith("trl")]:
                    if "step_s" in row[key]:
                        t = statistics.median(row[key]["step_s"])
                        suffix = key.removeprefix("trl")
                        row.update({f"trl{suffix}_step_s_median": t, f"speedup{suffix}": t / o})
                        print(f"[{mt}] per step (median of {args.steps}): rollwise {o:.1f}s | {key} {t:.1f}s | "
                              f"speedup {t / o:.2f}x", flush=True)
            res["settings"][str(mt)] = row
            if args.json:  # written after every setting, so a cut-short run keeps what it measured
                Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
