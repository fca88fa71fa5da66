"""Tree rollouts against independent sampling on the SmolLM2 recipe's rollout phase, side by side in one process.

One recipe step's generation: 8 training problems (through the chat template) x 8 samples (leaves) x up to 32
tokens at T=1, stopping at the end-of-turn token, as the recipe runs it. Each repeat runs every arm back to back
(the order rotates) on the same prompts with fresh seeds, so all arms see the same load. Per arm:

- rollout seconds: median (min-max), and the ratio to independent sampling per repeat (median, min-max);
- generated tokens per leaf (what the engine sampled: a child's tokens before its fork are its parent's) against
  completion tokens per leaf (what each leaf holds, the work independent samples would do), and their ratio;
- copies (leaves whose parent ended before their branch point: no new sample), distinct completions per group,
  accuracy (the recipe's reward: the last integer equals the sum) and the fraction of groups whose rewards differ
  (what GRPO can learn from).

    PYTHONPATH=src python bench/tree.py [--arms ...] [--repeats 5] [--threads 2] [--json bench/results-tree.json]
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

ARMS: dict[str, dict | None] = {
    "independent": None,
    "fixed-4": {"branch": "fixed", "segment_tokens": 4},
    "fixed-8": {"branch": "fixed", "segment_tokens": 8},
    "fixed-12": {"branch": "fixed", "segment_tokens": 12},
    "entropy-1-8": {"branch": "entropy", "segment_tokens": 8, "entropy_threshold": 1.0},
    "entropy-2-8": {"branch": "entropy", "segment_tokens": 8, "entropy_threshold": 2.0},
    "entropy-3-8": {"branch": "entropy", "segment_tokens": 8, "entropy_threshold": 3.0},
    "entropy-2-8-r2": {"branch": "entropy", "segment_tokens": 8, "entropy_threshold": 2.0, "roots": 2},
}


def last_int(text: str) -> int | None:
    nums = re.findall(r"-?\d[\d,]*", text)
    return int(nums[-1].replace(",", "")) if nums else None


def summary(v: list[float]) -> dict:
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    from rollwise import LLM, SamplingParams
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.convert import resolve_model
    from rollwise.models.prompting import PromptFormat, stop_token_ids
    from rollwise.types import Task, TreeSpec

    arms = a.arms.split(",")
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm {unknown[0]!r}; known: {', '.join(ARMS)}")
    data = REPO / "recipes" / "data" / "addition-train.jsonl"
    if not data.is_file():
        raise SystemExit("run `python recipes/make_addition_data.py` first")
    rows = [json.loads(x) for x in data.read_text().splitlines() if x.strip()]
    model = Path(resolve_model("smollm2-135m"))
    tok = load_tokenizer(model)
    enc = PromptFormat("auto", None).task_encoder(tok)
    stops = stop_token_ids(tok, model)
    llm = LLM(model, kv_cache_gb=0.25, max_model_len=1024)
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    P, K = a.prompts, a.samples
    res: dict = {"arms": arms, "threads": a.threads, "repeats": a.repeats, "prompts": P, "leaves": K,
                 "load_1m_start": os.getloadavg()[0], "per_arm": {}}
    rec: dict[str, dict[str, list[float]]] = {x: {} for x in arms}

    def put(arm: str, key: str, v: float) -> None:
        rec[arm].setdefault(key, []).append(v)

    for r in range(a.repeats):
        batch = rows[P * r: P * r + P]
        prompts = [enc(Task(str(i), t["prompt"], None)) for i, t in enumerate(batch)]
        order = arms[r % len(arms):] + arms[: r % len(arms)]
        for arm in order:
            spec = TreeSpec(**ARMS[arm]) if ARMS[arm] is not None else None
            sp = SamplingParams(n=K, temperature=1.0, max_tokens=32, seed=1000 + r, stop_token_ids=stops, tree=spec)
            st = llm.engine.stats
            rows0 = st.decode_tokens
            t = time.perf_counter()
            outs = llm.generate(prompts, sp)
            put(arm, "seconds", time.perf_counter() - t)
            put(arm, "decode_rows", st.decode_tokens - rows0)
            leaves = [o for q in outs for o in q.outputs]
            own = sum(len(o.token_ids) - (o.tree_fork or 0) for o in leaves)
            full = sum(len(o.token_ids) for o in leaves)
            put(arm, "generated_per_leaf", own / len(leaves))
            put(arm, "tokens_per_leaf", full / len(leaves))
            put(arm, "copies_frac", sum(o.tree_parent is not None and o.tree_fork == len(o.token_ids)
                                        for o in leaves) / len(leaves))
            put(arm, "distinct_per_group", statistics.mean(len({tuple(o.token_ids) for o in q.outputs}) for q in outs))
            rewards = [[float(last_int(tok.decode(o.token_ids, skip_special_tokens=True)) == t["answer"])
                        for o in q.outputs] for q, t in zip(outs, batch)]
            put(arm, "accuracy", statistics.mean(x for g in rewards for x in g))
            put(arm, "informative_groups", statistics.mean(float(len(set(g)) > 1) for g in rewards))
        print(f"[rep {r}] " + ", ".join(f"{x} {rec[x]['seconds'][-1]:.2f}s {rec[x]['generated_per_leaf'][-1]:.1f}/"
                                        f"{rec[x]['tokens_per_leaf'][-1]:.1f} tok" for x in arms), flush=True)
    res["load_1m_end"] = os.getloadavg()[0]
    base = rec.get("independent")
    for arm in arms:
        d = {k: summary(v) for k, v in rec[arm].items()}
        if base is not None:
            d["time_ratio"] = summary([x / y for x, y in zip(rec[arm]["seconds"], base["seconds"])])
            d["generated_ratio"] = summary([x / y for x, y in zip(rec[arm]["generated_per_leaf"],
                                                                  base["generated_per_leaf"])])
        res["per_arm"][arm] = d
    print("\n| arm | rollout s | time vs independent | generated / leaf | tokens / leaf | generated vs independent "
          "| copies | distinct / group | accuracy | informative groups |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        d = res["per_arm"][arm]

        def m(k: str, f: str = "{:.2f}", d: dict = d) -> str:
            return f.format(d[k]["median"]) if k in d else "-"

        tr = d.get("time_ratio")
        rng = f" ({tr['min']:.2f}-{tr['max']:.2f})" if tr else ""
        print(f"| {arm} | {m('seconds')} | {m('time_ratio')}x{rng} | {m('generated_per_leaf', '{:.1f}')} | "
              f"{m('tokens_per_leaf', '{:.1f}')} | {m('generated_ratio')}x | {m('copies_frac', '{:.0%}')} | "
              f"{m('distinct_per_group', '{:.1f}')} | {m('accuracy', '{:.0%}')} | {m('informative_groups', '{:.0%}')} |")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
