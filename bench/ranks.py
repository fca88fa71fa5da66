"""Trainer step time at 1 and 2 data-parallel ranks on this CPU, and the time each step spends in collectives.

The batch is the SmolLM2 recipe's (8 prompts x 8 samples; prompts of ~40 tokens, completions of up to 32, random
advantages so every sequence trains), made from random token ids: a step's cost depends on the shapes, not on the
words. The arms are built side by side and step in turns, each repeat running all of them back to back, so
drift on a shared machine hits them alike:

- `1 rank`: the trainer in this process with `--threads` torch threads (what `train.world_size: 1` runs);
- `1 rank, 1 thread`: the same at one thread (what each rank gets; on a loaded machine one OpenMP thread per
  process can beat two: docs/speed.md, "CPU threads");
- `2 ranks ddp` and `2 ranks fsdp2`: two rank processes with `--threads / 2` threads each (the same cores).

Two ranks on the same cores cannot be faster: this shows the overhead of the split, the gradient all-reduce
(DDP) or the per-layer gathers and reduce-scatters (FSDP2) over gloo, not a speed-up. On N GPUs each rank has a
device of its own. Reported: median step seconds and spread (min-max) over `--repeats` (after one warm-up step
each) and the median seconds in collectives per step (`collective_s`). That the updates are the same is a test's
job (`tests/train/test_ranks.py`), not this script's: the in-process arms share one trainer, so that only three
copies of the model and AdamW state are in memory.

    python bench/ranks.py [--model smollm2-135m] [--repeats 5] [--threads 2] [--strategies ddp,fsdp2]
                          [--json bench/results-ranks-ddp.json]

Each arm holds its own model and AdamW state (SmolLM2: about 2.5 GB per copy, 5 copies with both strategies):
on a 24 GB machine shared with other jobs, run one strategy per invocation.
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
    ap.add_argument("--strategies", default="ddp,fsdp2",
                    help="2-rank arms beside the 1-rank one (each arm holds its own copies of model and AdamW state)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    from rollwise.config import TrainConfig
    from rollwise.models.convert import resolve_model
    from rollwise.cluster.ranks import LocalRanks
    from rollwise.cluster.trainer_handle import TrainerSpec
    from rollwise.train.losses import LossConfig

    torch.set_num_threads(a.threads)
    path = resolve_model(a.model)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]

    def spec(world: int, parallel: str, threads: int) -> TrainerSpec:
        return TrainerSpec(model_path=str(path), train=TrainConfig(lr=1e-6, micro_batch_tokens=a.micro_batch_tokens),
                           loss_name="grpo", loss_cfg=LossConfig(), threads=threads, world_size=world,
                           parallel=parallel, total_steps=a.repeats + 1)

    one = spec(1, "ddp", a.threads).build()
    arms: dict = {"1 rank": one}
    threads = {"1 rank": a.threads}
    if a.threads > 1:  # the same trainer at one thread per process, as each rank runs (no second copy in memory)
        arms["1 rank, 1 thread"] = one
        threads["1 rank, 1 thread"] = 1
    for strategy in [x for x in a.strategies.split(",") if x]:
        arms[f"2 ranks {strategy}"] = LocalRanks(spec(2, strategy, max(1, a.threads // 2)))
    times: dict[str, list[float]] = {k: [] for k in arms}
    coll: dict[str, list[float]] = {k: [] for k in arms}
    try:
        for rep in range(a.repeats + 1):
            batch = recipe_batch(rep, vocab)
            order = list(arms) if rep % 2 == 0 else list(reversed(arms))
            for name in order:
                if name in threads:  # an in-process arm: this process's torch threads
                    torch.set_num_threads(threads[name])
                t0 = time.perf_counter()
                m = arms[name].train_step(batch)
                dt = time.perf_counter() - t0
                if rep > 0:  # the first step warms allocators and caches
                    times[name].append(dt)
                    coll[name].append(float(m.get("collective_s", 0.0)))
            print(f"repeat {rep}: " + ", ".join(f"{k} {times[k][-1]:.2f}s" if times[k] else k for k in arms),
                  file=sys.stderr)
    finally:
        for h in {id(h): h for h in arms.values()}.values():
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
    }
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
