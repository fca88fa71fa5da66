"""Trainer step time at 1 and 2 data-parallel ranks on this CPU, and the time each step spends in collectives.

The batch is the SmolLM2 recipe's (8 prompts x 8 samples; prompts of ~40 tokens, completions of up to 32, random
advantages so every sequence trains), made from random token ids: a step's cost depends on the shapes, not on the
words. Three trainers are built side by side and step in turns, each repeat running all three back to back, so
drift on a shared machine hits them alike:

- `1 rank`: the trainer in this process with `--threads` torch threads (what `train.world_size: 1` runs);
- `2 ranks ddp` and `2 ranks fsdp2`: two rank processes with `--threads / 2` threads each (the same cores).

Two ranks on the same cores cannot be faster: this shows the overhead of the split, the gradient all-reduce
(DDP) or the per-layer gathers and reduce-scatters (FSDP2) over gloo, not a speed-up. On N GPUs each rank has a
device of its own. Reported: median step seconds and spread (min-max) over `--repeats` (after one warm-up step
each), the median seconds in collectives per step (`collective_s`), and the max weight difference between the
1-rank and 2-rank trainers after all steps (the same update, to float reassociation).

    python bench/ranks.py [--model smollm2-135m] [--repeats 5] [--threads 2] [--json bench/results-ranks.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def recipe_batch(seed: int, vocab: int, prompts: int = 8, samples: int = 8) -> list:
    from rollwise.types import Rollout

    rng = random.Random(seed)
    out = []
    for g in range(prompts):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(36, 44))]
        for k in range(samples):
            n = rng.randint(8, 32)
            out.append(Rollout(prompt_id=str(g), group_id=f"{seed}-{g}", sample_index=k, prompt_token_ids=prompt,
                               completion_token_ids=[rng.randrange(4, vocab) for _ in range(n)],
                               logprobs=[-rng.uniform(1.0, 4.0) for _ in range(n)], weight_versions=[0] * n,
                               loss_mask=[1] * n, advantage=rng.uniform(-1, 1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro-batch-tokens", type=int, default=2048)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    from rollwise.config import TrainConfig
    from rollwise.models.convert import resolve_model
    from rollwise.run.ranks import LocalRanks
    from rollwise.run.trainer_handle import TrainerSpec
    from rollwise.train.losses import LossConfig

    torch.set_num_threads(a.threads)
    path = resolve_model(a.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]

    def spec(world: int, parallel: str, threads: int) -> TrainerSpec:
        return TrainerSpec(model_path=str(path), train=TrainConfig(lr=1e-6, micro_batch_tokens=a.micro_batch_tokens),
                           loss_name="grpo", loss_cfg=LossConfig(), threads=threads, world_size=world,
                           parallel=parallel, total_steps=a.repeats + 1)

    arms = {"1 rank": spec(1, "ddp", a.threads).build(),
            "2 ranks ddp": LocalRanks(spec(2, "ddp", max(1, a.threads // 2))),
            "2 ranks fsdp2": LocalRanks(spec(2, "fsdp2", max(1, a.threads // 2)))}
    times: dict[str, list[float]] = {k: [] for k in arms}
    coll: dict[str, list[float]] = {k: [] for k in arms}
    try:
        for rep in range(a.repeats + 1):
            batch = recipe_batch(rep, vocab)
            order = list(arms) if rep % 2 == 0 else list(reversed(arms))
            for name in order:
                t0 = time.perf_counter()
                m = arms[name].train_step(batch)
                dt = time.perf_counter() - t0
                if rep > 0:  # the first step warms allocators and caches
                    times[name].append(dt)
                    coll[name].append(float(m.get("collective_s", 0.0)))
            print(f"repeat {rep}: " + ", ".join(f"{k} {times[k][-1]:.2f}s" if times[k] else k for k in arms),
                  file=sys.stderr)
        w1 = arms["1 rank"].weights()
        diffs = {}
        for name in ("2 ranks ddp", "2 ranks fsdp2"):
            w2 = arms[name].weights()
            diffs[name] = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    finally:
        for h in arms.values():
            h.shutdown()

    def stats(xs: list[float]) -> dict[str, float]:
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}

    res = {
        "what": "train step seconds, SmolLM2 recipe-shaped batch (8x8, ~40+<=32 tokens), 1 vs 2 ranks on the same cores",
        "model": a.model, "threads_total": a.threads, "repeats": a.repeats, "micro_batch_tokens": a.micro_batch_tokens,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg(),
                    "torch": torch.__version__},
        "step_s": {k: stats(v) for k, v in times.items()},
        "collective_s": {k: statistics.median(v) for k, v in coll.items() if k != "1 rank"},
        "ratio_vs_1_rank": {k: statistics.median(times[k]) / statistics.median(times["1 rank"]) for k in arms},
        "max_weight_diff_vs_1_rank": diffs,
    }
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
