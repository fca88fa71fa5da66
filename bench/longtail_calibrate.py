"""Calibrate the long-tail reasoning task (recipes/smollm2-longtail.yaml) on SmolLM2-135M-Instruct: choose the
difficulty mix from measured greedy accuracy, and measure the completion-length distribution, greedy and sampled.

The generator (recipes/make_longtail_data.py) draws each kind of problem (number of operations x number size) from
a sequence of its own, so the test set of any mix is a prefix of every kind's sequence. This bench evaluates greedy,
once, the prefixes that the candidate mixes (`CANDIDATES`) need, reads every candidate's test-set accuracy off those
results (exactly: the same prompts), and picks the candidate nearest `--target` inside the band (ties: the one with
more long problems). Then it samples `--sample-prompts` problems of the chosen test set `--samples` times at T = 1.
Prompts go through the chat template (with the generator's worked examples), stop at the end-of-turn token, run up
to `--max-tokens`, and are scored with the recipe's reward (the last integer equals the answer). Lengths: median,
p90, max and the share cut at max_tokens.

    OMP_NUM_THREADS=1 PYTHONPATH=src python bench/longtail_calibrate.py [--test 100] [--target 0.25]
        [--sample-prompts 16] [--samples 8] [--dtype bfloat16] [--json bench/results-longtail-calibration.json]

Then write the data with the chosen mix: `python recipes/make_longtail_data.py --mix ... --large ...` (its defaults
are the chosen mix).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]

CANDIDATES: list[tuple[str, float]] = [
    ("1:4,2:3,3:1,4:1,5:1,6:1", 0.0),
    ("1:3,2:3,3:2,4:1,5:1,6:1", 0.0),
    ("1:3,2:3,3:2,4:1,5:1,6:1", 0.25),
    ("1:2,2:2,3:2,4:1,5:1,6:1", 0.25),
    ("1:1,2:1,3:1,4:1,5:1,6:1", 0.25),
    ("1:1,2:1,3:1,4:1,5:1,6:1", 0.5),
    ("1:1,2:2,3:2,4:2,5:2,6:2", 0.5),
]
"""(--mix, --large) candidates of the generator, from easy to hard."""


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def lengths_summary(lengths: list[int], truncated: list[bool]) -> dict[str, Any]:
    """Median, p90 (nearest rank), max, mean, and the share cut at max_tokens."""
    if not lengths:
        return {"n": 0}
    s = sorted(lengths)
    return {"n": len(s), "median": statistics.median(s), "p90": s[max(0, math.ceil(0.9 * len(s)) - 1)], "max": s[-1],
            "mean": round(sum(s) / len(s), 1), "truncated": round(sum(truncated) / len(truncated), 3)}


def long_share(mix: str) -> float:
    """Share of problems with 4 or more operations (the tie-break: more long problems)."""
    w = {int(k): float(v) for k, v in (p.split(":") for p in mix.split(","))}
    return sum(v for k, v in w.items() if k >= 4) / sum(w.values())


def choose(acc: dict[tuple[str, float], float], target: float, band: tuple[float, float]) -> tuple[str, float]:
    """The candidate inside the band nearest the target (ties: more long problems); without one, the nearest."""
    inside = [c for c in acc if band[0] <= acc[c] <= band[1]]
    pool = inside or list(acc)
    return min(pool, key=lambda c: (round(abs(acc[c] - target), 3), -long_share(c[0]), -c[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test", type=int, default=100, help="test-set size of every candidate")
    ap.add_argument("--target", type=float, default=0.25)
    ap.add_argument("--band", default="0.10,0.40")
    ap.add_argument("--sample-prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--model", default="smollm2-135m", help="the model (another only to try the bench out)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    band = (float(a.band.split(",")[0]), float(a.band.split(",")[1]))
    gen = _load(REPO / "recipes" / "make_longtail_data.py", "make_longtail_data")
    reward = _load(REPO / "recipes" / "addition_reward.py", "addition_reward").sum_correct

    # every kind's test prefix that some candidate needs
    need: dict[tuple[int, str], int] = defaultdict(int)
    for mix, large in CANDIDATES:
        for cell, q in gen.quotas(a.test, gen.parse_mix(mix), large).items():
            need[cell] = max(need[cell], q)
    pool = {cell: gen.kind_sequence(cell[0], cell[1], True, a.seed, q, 2) for cell, q in sorted(need.items()) if q}
    rows = [r for rs in pool.values() for r in rs]

    from rollwise import LLM, SamplingParams
    from rollwise.engine.core import load_tokenizer
    from rollwise.models.convert import resolve_model
    from rollwise.models.prompting import PromptFormat, stop_token_ids
    from rollwise.types import Task

    t_start = time.perf_counter()
    model = Path(resolve_model(a.model))
    tok = load_tokenizer(model)
    enc = PromptFormat("auto", None).task_encoder(tok)
    stops = stop_token_ids(tok, model)
    llm = LLM(model, dtype=a.dtype, kv_cache_gb=0.5, max_model_len=2048)
    res: dict[str, Any] = {"dtype": a.dtype, "threads": a.threads, "max_tokens": a.max_tokens, "test": a.test,
                           "cpu": next((x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo")
                                        if x.startswith("model name")), "unknown"),
                           "load_1m_start": os.getloadavg()[0], "engine": llm.describe()}
    print(f"{res['cpu']}; {llm.describe()}; {len(rows)} greedy problems", flush=True)

    def run(batch: list[dict], params: Any) -> list[dict[str, Any]]:
        t = time.perf_counter()
        outs = llm.generate([enc(Task(str(i), r["prompt"], None)) for i, r in enumerate(batch)], params)
        got = [{"row": r, "n": len(o.token_ids), "text": o.text, "cut": o.finish_reason == "length"}
               for r, q in zip(batch, outs) for o in q.outputs]
        for g, w in zip(got, reward([g["text"] for g in got], [g["row"]["answer"] for g in got])):
            g["reward"] = w
        print(f"  {len(batch)} prompts x {params.n}: {time.perf_counter() - t:.1f} s, "
              f"{sum(g['n'] for g in got)} tokens", flush=True)
        return got

    greedy = run(rows, SamplingParams(n=1, temperature=0.0, max_tokens=a.max_tokens, stop_token_ids=stops))
    by_q = {g["row"]["question"]: g for g in greedy}
    cells: dict[str, dict[str, Any]] = {}
    for (k, size), rs in pool.items():
        gs = [by_q[r["question"]] for r in rs]
        cells[f"ops{k}-{size}"] = {"n": len(gs), "accuracy": round(sum(g["reward"] for g in gs) / len(gs), 3),
                                   "median_len": statistics.median(g["n"] for g in gs)}
    res["greedy_by_kind"] = cells
    for name, c in cells.items():
        print(f"  {name}: greedy {c['accuracy']:.2f} of {c['n']}, median {c['median_len']} tokens", flush=True)
    acc: dict[tuple[str, float], float] = {}
    sets: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for mix, large in CANDIDATES:
        test = gen.draw(a.test, gen.parse_mix(mix), large, True, a.seed, 2)
        sets[(mix, large)] = [by_q[r["question"]] for r in test]
        acc[(mix, large)] = sum(g["reward"] for g in sets[(mix, large)]) / len(test)
        print(f"candidate --mix {mix} --large {large}: greedy {acc[(mix, large)]:.3f}", flush=True)
    res["candidates"] = [{"mix": m, "large": lg, "greedy_accuracy": acc[(m, lg)]} for m, lg in CANDIDATES]
    mix, large = choose(acc, a.target, band)
    chosen = sets[(mix, large)]
    res["chosen"] = {"mix": mix, "large": large, "greedy_accuracy": acc[(mix, large)],
                     "greedy_lengths": lengths_summary([g["n"] for g in chosen], [g["cut"] for g in chosen]),
                     "examples": [{"question": g["row"]["question"], "answer": g["row"]["answer"],
                                   "completion": g["text"], "reward": g["reward"]} for g in chosen[:6]]}
    print(f"chosen: --mix {mix} --large {large}: greedy {acc[(mix, large)]:.3f}, lengths "
          f"{json.dumps(res['chosen']['greedy_lengths'])}", flush=True)
    if a.sample_prompts and a.samples:
        test = gen.draw(a.test, gen.parse_mix(mix), large, True, a.seed, 2)[: a.sample_prompts]
        sampled = run(test, SamplingParams(n=a.samples, temperature=1.0, max_tokens=a.max_tokens, seed=a.seed,
                                           stop_token_ids=stops))
        res["chosen"]["sampled"] = {
            "prompts": len(test), "samples": a.samples,
            "accuracy": round(sum(g["reward"] for g in sampled) / len(sampled), 3),
            "lengths": lengths_summary([g["n"] for g in sampled], [g["cut"] for g in sampled]),
            "examples": [{"question": g["row"]["question"], "completion": g["text"], "reward": g["reward"]}
                         for g in sampled[:: a.samples][:4]]}
        print(f"sampled (T=1): accuracy {res['chosen']['sampled']['accuracy']:.3f}, lengths "
              f"{json.dumps(res['chosen']['sampled']['lengths'])}", flush=True)
    res["load_1m_end"] = os.getloadavg()[0]
    res["wall_s"] = time.perf_counter() - t_start
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
