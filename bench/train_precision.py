"""One GRPO training step in float32 against bf16 autocast (float32 master weights), side by side in one process,
and the engine/trainer log-prob gap each precision leaves.

Workload: SmolLM2-135M-Instruct (`--model`), 8 chat-template prompts ("What is 47 + 38?") x 8 samples of up to
`--max-tokens` tokens sampled by rollwise's float32 engine at temperature 1 (real rollouts with their behaviour
log-probs), advantages +-0.5, GRPO loss, AdamW lr 1e-6, micro_batch_tokens 4096, `--threads` torch threads. The two
precisions alternate in the same process on the same batch (`--repeats` pairs after one warm-up step each, which
allocates AdamW's state), so contention from other work on the machine falls on both alike; reported: the median
step time of each, the median of the per-pair ratios and its spread (min-max).

The gap is the loop's `logprob_diff_mean` / `logprob_diff_max` (|trainer - engine| on the sampled tokens) at the
engine's weights, in each precision. Also printed: the CPU (model name and its bf16 / AMX flags), what
`train.bf16: auto` resolves to on it, and which oneDNN kernel the bf16 matmuls ran (ONEDNN_VERBOSE on one linear
layer's forward and backward under autocast, in a subprocess). float32 matmuls run torch's own BLAS (MKL on x86).

    python bench/train_precision.py [--threads 1] [--repeats 3] [--max-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

PROBE = """
import torch
x = torch.randn(64, 576, requires_grad=True)
lin = torch.nn.Linear(576, 1536)
with torch.autocast("cpu", dtype=torch.bfloat16):
    y = lin(x)
y.float().sum().backward()
"""


def cpu_name() -> tuple[str, list[str]]:
    """The CPU's model name and which of its flags matter here (bf16 dot products, AMX, AVX-512, AVX2)."""
    name, flags = platform.processor() or platform.machine(), []
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return name, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == (platform.processor() or platform.machine()):
            name = value.strip()
        if key.strip() == "flags":
            wanted = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")
            flags = [f for f in wanted if f in value.split()]
            break
    return name, flags


def onednn_kernels() -> list[str]:
    """The oneDNN implementations a bf16 autocast linear's forward and backward ran (e.g. brg_matmul:avx512_core_bf16)."""
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120).stdout
    kinds = []
    for line in out.splitlines():
        parts = line.split(",")
        if len(parts) > 6 and parts[2] == "primitive" and parts[3] == "exec":
            k = f"{parts[5]}:{parts[6]}"
            if k not in kinds:
                kinds.append(k)
    return kinds


def rollouts(model: str, max_tokens: int, threads: int):
    """8 prompts x 8 samples from rollwise's float32 engine, with their behaviour log-probs."""
    from rollwise import LLM, SamplingParams
    from rollwise.models.convert import resolve_model
    from rollwise.types import Rollout

    path = resolve_model(model)
    llm = LLM(str(path), dtype="float32")
    tok = llm.tokenizer
    pairs = [(47, 38), (12, 57), (83, 29), (64, 71), (25, 96), (38, 44), (91, 15), (56, 67)]
    prompts = []
    for a, b in pairs:
        ids = tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True,
                                      tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(n=8, temperature=1.0, max_tokens=max_tokens, seed=0, logprobs=True))
    gen_s = time.perf_counter() - t
    ros = []
    for i, out in enumerate(outs):
        for k, o in enumerate(out.outputs):
            n = len(o.token_ids)
            ros.append(Rollout(prompt_id=str(i), group_id=str(i), sample_index=k, prompt_token_ids=prompts[i],
                               completion_token_ids=list(o.token_ids), logprobs=list(o.logprobs),
                               weight_versions=[0] * n, loss_mask=[1] * n, advantage=float(k % 2) - 0.5))
    del llm
    return path, ros, gen_s


def logprob_gap(tr, batch) -> dict[str, float]:
    """The loop's `logprob_diff_mean` / `logprob_diff_max`: |trainer - engine| log-prob over the loss tokens."""
    lp = tr.compute_logprobs(batch)
    mask = batch.loss_mask.bool()
    d = (lp - batch.old_logprobs).abs()[mask]
    return {"logprob_diff_mean": float(d.mean()), "logprob_diff_max": float(d.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from rollwise.config import TrainConfig
    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig
    from rollwise.train.precision import train_precision
    from rollwise.train.trainer import Trainer

    torch.set_num_threads(args.threads)
    name, flags = cpu_name()
    auto = train_precision("auto", torch.device("cpu"))
    kernels = onednn_kernels()
    print(f"CPU: {name} [{' '.join(flags)}], torch {torch.__version__}, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"train.bf16 auto -> {auto.name} ({auto.reason}); oneDNN bf16 kernels: {', '.join(kernels) or 'none'}")

    path, ros, gen_s = rollouts(args.model, args.max_tokens, args.threads)
    batch = TrainBatch.from_rollouts(ros, 4096)
    print(f"{len(ros)} rollouts, {batch.num_tokens} tokens (generated in {gen_s:.1f} s)")
    tr = Trainer(path, TrainConfig(lr=1e-6, bf16=False), device="cpu")
    precisions = {"float32": train_precision(False, torch.device("cpu")),
                  "bf16": train_precision(True, torch.device("cpu"))}
    gaps = {}
    for k, p in precisions.items():  # at the engine's weights, before any update
        tr.precision = p
        gaps[k] = logprob_gap(tr, batch)
    for p in precisions.values():  # one warm-up step each: AdamW's state, the allocator
        tr.precision = p
        tr.train_step(batch, LOSSES["grpo"], LossConfig())
    times: dict[str, list[float]] = {k: [] for k in precisions}
    for _ in range(args.repeats):
        for k, p in precisions.items():
            tr.precision = p
            t = time.perf_counter()
            tr.train_step(batch, LOSSES["grpo"], LossConfig())
            times[k].append(time.perf_counter() - t)
    ratios = [a / b for a, b in zip(times["float32"], times["bf16"])]
    res = {
        "cpu": name, "cpu_flags": flags, "torch": torch.__version__, "threads": args.threads, "model": args.model,
        "auto": {"precision": auto.name, "reason": auto.reason}, "onednn_bf16_kernels": kernels,
        "rollouts": len(ros), "tokens": batch.num_tokens, "max_tokens": args.max_tokens,
        "step_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()},
        "speedup_bf16": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "gap": gaps, "load_avg": os.getloadavg()[0],
    }
    for k in precisions:
        print(f"{k:8s} step {res['median_s'][k]:6.2f} s (runs {', '.join(f'{x:.2f}' for x in times[k])}); gap "
              f"mean {gaps[k]['logprob_diff_mean']:.2e} max {gaps[k]['logprob_diff_max']:.2e}")
    s = res["speedup_bf16"]
    print(f"bf16 / float32 speed: {s['median']:.2f}x (spread {s['min']:.2f}-{s['max']:.2f}x over {args.repeats} pairs)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
