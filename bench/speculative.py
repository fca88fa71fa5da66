"""Speculative rollouts on a real model: a rollout step whose prompts were seen before, with drafts from the previous
step's rollouts, against the same step without drafts, side by side in one process.

Workload: SmolLM2-135M-Instruct (`resolve_model("smollm2-135m")`), addition prompts through the chat template
("What is 47 + 38?"), P prompts x 8 samples, temperature 1, EOS on, max_tokens M. Each repeat:
  1. the "previous step": generate the prompts once (seed A); its completions are the drafts;
  2. the measured step (seed B), once without drafts and once with them (source past, and past + n-gram), each
     driven step by step through `EngineCore` so the tail (the part with fewer than 8 live sequences) is timed.
Same weights in both steps (RL moves them a little between steps; acceptance here is an upper bound for that).
Draft lengths follow the pinned step-cost ratio R0 = 16 (measured on this CPU).
Reported per arm: medians over repeats of the whole phase and the tail, acceptance rate, tokens per forward
(tokens emitted per sequence per decode step), forward passes; and the speed-ups against no drafts.

    python bench/speculative.py [--prompts 8] [--samples 8] [--max-tokens 192] [--repeats 3] [--threads 1]
                                [--temperature 1.0] [--out bench/results-speculative.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

TAIL = 8


def addition_prompts(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    out = ["What is 47 + 38?"]
    while len(out) < n:
        out.append(f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}?")
    return out


def run_arm(core, prompts: list[list[int]], params, drafts) -> dict:
    """Drive one rollout phase step by step; times the whole phase and its tail (< TAIL live sequences)."""
    st0 = core.stats
    spec0 = (st0.spec.tested_tokens, st0.spec.accepted_tokens, st0.spec.decode_seq_steps, st0.spec.decode_emitted,
             st0.steps, st0.spec.saved_s_est)
    for i, p in enumerate(prompts):
        core.add_request(f"b{i}", p, params[i], drafts=None if drafts is None else drafts[i])
    outs = {}
    t0 = time.perf_counter()
    t_tail = None
    while core.has_unfinished():
        if t_tail is None and core.scheduler.num_unfinished_seqs < TAIL:
            t_tail = time.perf_counter()
        for o in core.step():
            outs[o.request_id] = o
    t1 = time.perf_counter()
    sp = core.stats.spec
    tested, acc = sp.tested_tokens - spec0[0], sp.accepted_tokens - spec0[1]
    seq_steps, emitted = sp.decode_seq_steps - spec0[2], sp.decode_emitted - spec0[3]
    tokens = sum(len(c.token_ids) for o in outs.values() for c in o.outputs)
    return {"phase_s": t1 - t0, "tail_s": (t1 - t_tail) if t_tail is not None else 0.0,
            "acceptance": acc / tested if tested else None, "tokens_per_forward": emitted / seq_steps if seq_steps else None,
            "forwards": core.stats.steps - spec0[4], "tokens": tokens, "saved_s_est": sp.saved_s_est - spec0[5],
            "outputs": [[c.token_ids for c in outs[f"b{i}"].outputs] for i in range(len(prompts))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", default=str(Path(__file__).with_name("results-speculative.json")))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from rollwise import LLM, SamplingParams
    from rollwise.engine.speculative import DraftSpec
    from rollwise.models.convert import resolve_model
    from rollwise.models.prompting import PromptFormat, stop_token_ids

    model_dir = resolve_model("smollm2-135m")
    llm = LLM(model_dir, max_num_seqs=max(64, args.prompts * args.samples), max_model_len=512)
    core, tok = llm.engine, llm.tokenizer
    # NOTE: the draft-length rule runs with its pinned step-cost ratio (SchedulerConfig.spec_overhead_rows = 16,
    # measured on this CPU); the online fit (core.calibrate_spec) chased the noise of a shared 2-core machine.
    prompts = [PromptFormat().encode(tok, q) for q in addition_prompts(args.prompts)]
    stops = stop_token_ids(tok, model_dir)

    def params(seed: int):
        return [SamplingParams(n=args.samples, temperature=args.temperature, max_tokens=args.max_tokens, seed=seed * 1000 + i,
                               stop_token_ids=stops) for i in range(len(prompts))]

    run_arm(core, prompts[:2], params(99), None)  # warm-up (kernels, allocator)
    arms = {"off": [], "past": [], "both": []}
    for r in range(args.repeats):
        prev = run_arm(core, prompts, params(2 * r + 1), None)["outputs"]  # the previous step's rollouts
        order = list(arms)
        order = order[r % 3:] + order[: r % 3]  # rotate the arm order against drift on a shared machine
        for arm in order:
            drafts = None
            if arm != "off":
                drafts = [DraftSpec(tuple(tuple(c) for c in prev[i]), k=args.k, ngram=arm == "both")
                          for i in range(len(prompts))]
            res = run_arm(core, prompts, params(2 * r + 2), drafts)
            arms[arm].append(res)
            print(f"repeat {r} {arm:>4}: phase {res['phase_s']:.2f}s tail {res['tail_s']:.2f}s "
                  f"acc {res['acceptance'] or 0:.2f} tok/fwd {res['tokens_per_forward']:.2f} fwd {res['forwards']}",
                  file=sys.stderr)
        same = all(a["outputs"] == arms["off"][-1]["outputs"] for a in (arms["past"][-1], arms["both"][-1]))
        print(f"repeat {r}: outputs with drafts equal to without: {same}", file=sys.stderr)

    def med(arm: str, key: str):
        vals = [a[key] for a in arms[arm] if a[key] is not None]
        return statistics.median(vals) if vals else None

    results = {
        "model": "SmolLM2-135M-Instruct (float32)", "device": "cpu",
        "threads": args.threads, "machine": platform.processor() or platform.machine(),
        "calibrate_spec": False, "spec_overhead_rows": core.scheduler.config.spec_overhead_rows,
        "workload": {"prompts": args.prompts, "samples": args.samples, "max_tokens": args.max_tokens,
                     "temperature": args.temperature, "k": args.k, "repeats": args.repeats, "tail_below_live_seqs": TAIL},
        "arms": {arm: {key: med(arm, key) for key in ("phase_s", "tail_s", "acceptance", "tokens_per_forward",
                                                      "forwards", "tokens", "saved_s_est")} for arm in arms},
        "outputs_identical_to_off": all(a["outputs"] == o["outputs"] for arm in ("past", "both")
                                        for a, o in zip(arms[arm], arms["off"])),
    }
    off = results["arms"]["off"]
    for arm in ("past", "both"):
        a = results["arms"][arm]
        a["speedup_phase"] = off["phase_s"] / a["phase_s"]
        a["speedup_tail"] = off["tail_s"] / a["tail_s"] if a["tail_s"] and off["tail_s"] else None
    results["raw"] = {arm: [{k: v for k, v in a.items() if k != "outputs"} for a in arms[arm]] for arm in arms}
    # One file holds a run per (temperature, max_tokens): a later invocation adds or replaces its own entry.
    out = Path(args.out)
    runs = json.loads(out.read_text()).get("runs", []) if out.is_file() else []
    key = (args.temperature, args.max_tokens)
    runs = [r for r in runs if (r["workload"]["temperature"], r["workload"]["max_tokens"]) != key] + [results]
    out.write_text(json.dumps({"bench": "speculative", "runs": runs}, indent=2))
    print(json.dumps({arm: results["arms"][arm] for arm in arms}, indent=2))


if __name__ == "__main__":
    main()
