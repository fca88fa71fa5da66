"""The frozen SmolLM2 recipe's rollout phase (bench/baseline-smollm2-addition.yaml) in each engine precision, side by
side in one process, plus what the low precision costs: greedy agreement with float32 on the held-out problems and
the log-prob gap against a float32 trainer.

1. Rollout phase: one recipe step's generation, 8 prompts (training problems through the chat template) x 8 samples x
   up to 32 tokens at T=1, stopping at the end-of-turn token, as the recipe runs it. Each repeat runs every dtype back
   to back (the order rotates), fresh seeds per repeat, so all see the same load. Seconds: median (min-max), and each
   low-precision mode's ratio to float32 per repeat (median, min-max).
2. Greedy agreement: the held-out problems (the recipe's eval set: the first `--eval` of addition-test.jsonl), greedy
   32 tokens in each mode: the fraction token-identical to float32, the fraction whose final integer (the recipe's
   reward) agrees, and each mode's accuracy.
3. Log-prob gap: the float32 trainer's (transformers, float32) log-probs of the tokens each mode sampled in (1), at
   T=1, against the engine's behaviour log-probs: mean |gap|, max |gap| and mean gap per token, and the mean
   importance weight exp(trainer - engine) that TIS would truncate at 2.

    PYTHONPATH=src python bench/recipe_rollout.py [--dtypes float32,bfloat16,int8] [--repeats 5] [--threads 2]
        [--json bench/results-recipe-rollout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def tasks(path: Path, n: int, offset: int = 0) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return rows[offset: offset + n]


def last_int(text: str) -> int | None:
    nums = re.findall(r"-?\d+", text)
    return int(nums[-1]) if nums else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bfloat16,int8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from rollwise import LLM, SamplingParams
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.convert import resolve_model
    from rollwise.models.prompting import PromptFormat, stop_token_ids
    from rollwise.types import Task
    from transformers import AutoModelForCausalLM

    data = REPO / "recipes" / "data"
    if not (data / "addition-train.jsonl").is_file():
        raise SystemExit("run `python recipes/make_addition_data.py` first")
    model = Path(resolve_model("smollm2-135m"))
    tok = load_tokenizer(model)
    enc = PromptFormat("auto", None).task_encoder(tok)
    stops = stop_token_ids(tok, model)
    dtypes = a.dtypes.split(",")
    llms = {d: LLM(model, dtype=d, kv_cache_gb=0.25, max_model_len=1024) for d in dtypes}
    for llm in llms.values():
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    res: dict = {"dtypes": dtypes, "threads": a.threads, "repeats": a.repeats, "load_1m_start": os.getloadavg()[0],
                 "cpu": next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name")),
                             "unknown"), "engines": {d: llm.describe() for d, llm in llms.items()}}
    for d, llm in llms.items():
        print(f"{d}: {llm.describe()}", flush=True)

    # 1. rollout phase
    train = tasks(data / "addition-train.jsonl", 8 * a.repeats)
    gen: dict[str, list[float]] = {d: [] for d in dtypes}
    samples: dict[str, list] = {d: [] for d in dtypes}
    for r in range(a.repeats):
        prompts = [enc(Task(str(i), t["prompt"], None)) for i, t in enumerate(train[8 * r: 8 * r + 8])]
        sp = SamplingParams(n=8, temperature=1.0, max_tokens=32, seed=100 + r, stop_token_ids=stops)
        order = dtypes[r % len(dtypes):] + dtypes[: r % len(dtypes)]
        for d in order:
            t = time.perf_counter()
            outs = llms[d].generate(prompts, sp)
            gen[d].append(time.perf_counter() - t)
            samples[d].extend((p, o.token_ids, o.logprobs) for p, q in zip(prompts, outs) for o in q.outputs)
        print(f"[rep {r}] " + ", ".join(f"{d} {gen[d][-1]:.2f} s" for d in dtypes), flush=True)
    res["load_1m_after_rollout"] = os.getloadavg()[0]
    res["rollout_s"] = {d: {"runs": v, "median": statistics.median(v), "min": min(v), "max": max(v)} for d, v in gen.items()}
    if "float32" in dtypes:
        for d in dtypes:
            if d != "float32":
                rat = [f / x for f, x in zip(gen["float32"], gen[d])]
                res["rollout_s"][d]["speedup_vs_float32"] = {"runs": rat, "median": statistics.median(rat),
                                                             "min": min(rat), "max": max(rat)}
    print("rollout:", json.dumps({d: {k: v for k, v in x.items() if k != "runs"} for d, x in res["rollout_s"].items()}),
          flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))

    # 2. greedy agreement on the held-out problems
    test = tasks(data / "addition-test.jsonl", a.eval)
    tprompts = [enc(Task(str(i), t["prompt"], None)) for i, t in enumerate(test)]
    gsp = SamplingParams(n=1, temperature=0.0, max_tokens=32, stop_token_ids=stops)
    greedy = {d: [o.outputs[0].token_ids for o in llms[d].generate(tprompts, gsp)] for d in dtypes}
    acc = {}
    answers = {}
    for d in dtypes:
        answers[d] = [last_int(tok.decode(g, skip_special_tokens=True)) for g in greedy[d]]
        acc[d] = sum(x == t["answer"] for x, t in zip(answers[d], test)) / len(test)
    res["greedy"] = {"problems": len(test), "accuracy": acc}
    if "float32" in dtypes:
        for d in dtypes:
            if d != "float32":
                res["greedy"][d] = {
                    "token_identical": sum(x == y for x, y in zip(greedy[d], greedy["float32"])) / len(test),
                    "answer_identical": sum(x == y for x, y in zip(answers[d], answers["float32"])) / len(test)}
    print("greedy:", json.dumps(res["greedy"]), flush=True)
    if a.json:  # partial results first: the gap phase is the slowest on a loaded box
        Path(a.json).write_text(json.dumps(res, indent=1))

    # 3. log-prob gap against the float32 trainer
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    res["logprob_gap"] = {}
    with torch.no_grad():
        for d in dtypes:
            gaps: list[float] = []
            for p, ids, lps in samples[d][: 8 * 8 * 2]:  # two steps' worth of samples
                if not ids:
                    continue
                x = torch.tensor([p + ids])
                logits = hf(x).logits[0, len(p) - 1: len(p) + len(ids) - 1].float()
                tl = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
                gaps.extend((tl - torch.tensor(lps)).tolist())
            g = torch.tensor(gaps, dtype=torch.float64)
            res["logprob_gap"][d] = {"tokens": len(gaps), "mean_abs": float(g.abs().mean()), "max_abs": float(g.abs().max()),
                                     "mean": float(g.mean()), "mean_is_weight": float(g.exp().mean()),
                                     "frac_weight_over_2": float((g.exp() > 2).double().mean())}
    print("log-prob gap (trainer - engine):", json.dumps(res["logprob_gap"]), flush=True)
    res["load_1m_end"] = os.getloadavg()[0]
    print(json.dumps({k: res[k] for k in ("rollout_s",)}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
