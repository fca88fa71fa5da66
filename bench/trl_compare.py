"""rollwise vs TRL's `GRPOTrainer` on the same tiny model, task, batch, max length and learning rate.

Both start from the same warmed-up built-in model (the embedded default's warm-up, cached), train on the
arithmetic task with 8 prompts x 8 samples per step, max 16 new tokens, AdamW lr 1e-4, GRPO loss, no KL,
in the same process one after the other. Reported: median seconds per step (each framework's own step:
generate + score + train + weight sync), the ratio, and both reward curves over the same steps.

    python bench/trl_compare.py [--steps 20] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def warmed_model(out: Path, warmup_steps: int, cache_dir: str | None) -> Path:
    from rollwise.config import load_config
    from rollwise.envs import get_env
    from rollwise.run.warmup import prepare_builtin_model

    cfg = load_config(None, [f"warmup.steps={warmup_steps}", "warmup.seconds=1200"]
                      + ([f"warmup.cache_dir={cache_dir}"] if cache_dir else []))
    env = get_env("arithmetic")
    tasks = env.load("train", seed=0)
    sig = f"arithmetic:{{}}:None"
    prepare_builtin_model(out, env.charset, tasks, cfg.model.builtin, cfg.warmup, sig, 0, log=print)
    return out


def run_rollwise(model: Path, steps: int, lr: float, max_tokens: int, out: Path) -> tuple[list[float], list[float]]:
    from rollwise.config import load_config
    from rollwise.run.loop import train

    cfg = load_config(None, [
        f"model.path={model}", f"run.out_dir={out}", f"train.steps={steps}", f"train.lr={lr}",
        "rollout.prompts_per_step=8", "rollout.samples_per_prompt=8", f"rollout.max_tokens={max_tokens}",
        "algo.loss=grpo", "algo.advantage=grpo", "algo.kl_coef=0", "algo.skip_zero_variance=true",
        "env.eval_size=16", "run.tensorboard=false", "model.device=cpu",
    ])
    train(cfg, log=lambda s: None)
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step_s"] for r in rows], [r["reward_mean"] for r in rows]


def run_trl(model: Path, steps: int, lr: float, max_tokens: int, out: Path) -> tuple[list[float], list[float]]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rollwise.envs import get_env

    env = get_env("arithmetic")
    tasks = env.load("train", seed=0)
    ds = Dataset.from_list([{"prompt": t.prompt, "answer": int(t.answer)} for t in tasks])
    by_prompt = {t.prompt: t for t in tasks}

    def reward(prompts, completions, **kw):
        return [env.score(by_prompt[p], c).value for p, c in zip(prompts, completions)]

    tok = AutoTokenizer.from_pretrained(str(model))
    tok.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=64, num_generations=8, max_completion_length=max_tokens,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, loss_type="grpo", temperature=1.0, top_k=0, top_p=1.0, max_steps=steps, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, seed=0, disable_dropout=True,
        log_completions=False, dataloader_num_workers=0,
    )
    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            times.append(time.perf_counter() - self.t)

    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[Timer()])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return times, rewards


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--warmup-steps", type=int, default=1500)
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = warmed_model(Path(tmp) / "model", args.warmup_steps, args.cache_dir)
        ours_t, ours_r = run_rollwise(model, args.steps, args.lr, args.max_tokens, Path(tmp) / "rw")
        trl_t, trl_r = run_trl(model, args.steps, args.lr, args.max_tokens, Path(tmp) / "trl")
    # The first step of each carries one-off costs (allocator warm-up, TRL's dataloader): report the median.
    o, t = statistics.median(ours_t), statistics.median(trl_t)
    res = {
        "steps": args.steps, "rollwise_step_s_median": o, "trl_step_s_median": t, "speedup": t / o,
        "rollwise_reward": ours_r, "trl_reward": trl_r,
        "rollwise_reward_last5": statistics.mean(ours_r[-5:]), "trl_reward_last5": statistics.mean(trl_r[-5:]),
    }
    print(f"per step (median of {args.steps}): rollwise {o:.3f}s | TRL GRPOTrainer {t:.3f}s | speedup {t / o:.1f}x")
    print("reward per step  rollwise: " + " ".join(f"{r:.2f}" for r in ours_r))
    print("reward per step  TRL:      " + " ".join(f"{r:.2f}" for r in trl_r))
    print(f"mean reward over the last 5 steps: rollwise {res['rollwise_reward_last5']:.3f} | TRL {res['trl_reward_last5']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
