"""One GRPO training step on SmolLM2-135M-Instruct, before/after the shared-prompt rows and the chunked LM head:
seconds per step and the peak resident memory of the process.

Workload: 8 chat-template prompts ("What is 47 + 38?", ~35 tokens) x 8 samples, completions of `--comp` tokens
on average (uniform in [comp/2, 3*comp/2], random ids; the speed does not depend on which tokens they are),
AdamW lr 1e-5, GRPO loss, micro_batch_tokens 4096, float32 on the CPU. Each variant runs in its own subprocess
(so ru_maxrss is that variant's peak) for `--steps` steps; the first step is reported apart (it allocates AdamW's
state), the median of the others is the step time.

Variants: `before` = unshared packed rows + the model's own [N, V] logits (the path before issue 13);
`shared` = shared prompts only; `head` = chunked LM head only; `after` = both (the default now).

    python bench/train_step.py [--comp 16,64] [--steps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {"before": (False, False), "shared": (True, False), "head": (False, True), "after": (True, True)}


def ab(comp: int, groups: int, reps: int, threads: int) -> dict:
    """before/after alternated in ONE process (same model, same batch, same contention): seconds per train_step."""
    import torch

    from rollwise.train.losses import LOSSES, LossConfig

    torch.set_num_threads(threads)
    tr, ros = _setup(comp, groups)
    times: dict[str, list[float]] = {"before": [], "after": []}
    plain = tr.plain_head
    batches = {v: TrainBatch_from(ros, 4096, VARIANTS[v][0]) for v in times}
    tr.train_step(batches["after"], LOSSES["grpo"], LossConfig())  # AdamW state, allocator warm-up
    for _ in range(reps):
        for v in ("before", "after"):
            tr.plain_head = plain and VARIANTS[v][1]
            t = time.perf_counter()
            tr.train_step(batches[v], LOSSES["grpo"], LossConfig())
            times[v].append(time.perf_counter() - t)
    return {"mode": "ab", "comp": comp, "groups": groups, "step_s": times,
            "forward_tokens": {v: b.row_tokens for v, b in batches.items()}}


def TrainBatch_from(ros, mbt, share):
    from rollwise.train.batch import TrainBatch

    return TrainBatch.from_rollouts(ros, mbt, share_prompt=share)


def _setup(comp: int, groups: int = 8):
    import torch

    from rollwise.config import TrainConfig
    from rollwise.models.convert import resolve_model
    from rollwise.train.trainer import Trainer
    from rollwise.types import Rollout

    tr = Trainer(resolve_model("smollm2-135m"), TrainConfig(lr=1e-5), device="cpu")
    tok = tr.tokenizer
    g = torch.Generator().manual_seed(0)
    ros = []
    for i in range(groups):
        a, b = (int(x) for x in torch.randint(10, 100, (2,), generator=g))
        ids = tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {b}?"}], add_generation_prompt=True,
                                      tokenize=True)
        prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        for k in range(8):
            n = int(torch.randint(max(1, comp // 2), comp * 3 // 2 + 1, (1,), generator=g))
            c = torch.randint(100, 49000, (n,), generator=g).tolist()
            ros.append(Rollout(prompt_id=str(i), group_id=str(i), sample_index=k, prompt_token_ids=prompt,
                               completion_token_ids=c, logprobs=[-3.0] * n, weight_versions=[0] * n, loss_mask=[1] * n,
                               advantage=float(k % 2) - 0.5))
    return tr, ros


def child(variant: str, comp: int, steps: int, threads: int, mbt: int) -> dict:
    import torch

    from rollwise.train.batch import TrainBatch
    from rollwise.train.losses import LOSSES, LossConfig

    torch.set_num_threads(threads)
    share, head = VARIANTS[variant]
    tr, ros = _setup(comp)
    tr.plain_head = tr.plain_head and head
    batch = TrainBatch.from_rollouts(ros, mbt, share_prompt=share)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        tr.train_step(batch, LOSSES["grpo"], LossConfig())
        times.append(time.perf_counter() - t)
    return {"variant": variant, "comp": comp, "micro_batch_tokens": mbt, "step_s": times, "tokens": batch.num_tokens,
            "forward_tokens": batch.row_tokens, "targets": int(batch.loss_mask.sum()),
            "prompt_len": len(ros[0].prompt_token_ids),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comp", default="16,64")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="before,after,shared,head")
    ap.add_argument("--mbt", type=int, default=4096, help="train.micro_batch_tokens")
    ap.add_argument("--json", help="results are appended to this JSON list")
    ap.add_argument("--ab", action="store_true", help="before/after alternated in one process (time only)")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.append = True
    if args.ab:
        import statistics as st

        r = ab(int(args.comp.split(",")[0]), args.groups, args.steps, args.threads)
        r["step_s_median"] = {v: st.median(x) for v, x in r["step_s"].items()}
        print(json.dumps(r))
        if args.json:
            old = json.load(open(args.json)) if Path(args.json).exists() else []
            json.dump(old + [r], open(args.json, "w"), indent=2)
        return 0
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.steps, args.threads, args.mbt)))
        return 0
    out = []
    for comp in [int(c) for c in args.comp.split(",")]:
        for v in args.variants.split(","):
            p = subprocess.run([sys.executable, __file__, "--child", v, str(comp), "--steps", str(args.steps),
                                "--threads", str(args.threads), "--mbt", str(args.mbt)], capture_output=True, text=True)
            if p.returncode != 0:
                print(f"variant {v} comp {comp}: exit {p.returncode}\n" + p.stderr[-2000:], file=sys.stderr)
                return 1
            r = json.loads(p.stdout.strip().splitlines()[-1])
            rest = r["step_s"][1:] or r["step_s"]
            r["step_s_median"] = statistics.median(rest)
            out.append(r)
            print(f"comp~{comp} {v:7s}: step {r['step_s_median']:.2f}s (all {[round(x, 2) for x in r['step_s']]}), "
                  f"forward tokens {r['forward_tokens']}/{r['tokens']}, peak RSS {r['peak_rss_mb']:.0f} MB", flush=True)
            if args.json:
                old = json.load(open(args.json)) if args.append and Path(args.json).exists() else []
                with open(args.json, "w") as f:
                    json.dump(old + [r], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
