"""Math scoring speed on GSM8K model solutions (gsm8k/example_model_solutions.jsonl in the data root,
`rollwise.envs.data.data_root`).

Scores every solution of every model (4 per question) against the question's ground truth with
`rewards.math.math_reward`, in the main thread and under `score_many` with 8 threads, and prints items/s,
how many calls reached the symbolic (math-verify) path, and agreement with the file's `is_correct` labels.
Two golds: `numeric` is the final answer (what the GSM8K environment's `#### N` gives: the numeric fast path),
`text` is the whole ground-truth solution, which no number parser reads, so every call goes to math-verify
(the worst case for symbolic scoring).

    PYTHONPATH=src OMP_NUM_THREADS=1 python bench/math_scoring.py [--limit N]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rollwise.rewards import math as rmath
from rollwise.rewards.concurrent import score_many
from rollwise.types import Task

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "example_model_solutions.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=0, help="questions to use (0 = all)")
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    rows = [json.loads(line) for line in open(args.data)]
    if args.limit:
        rows = rows[: args.limit]
    for gold in ("numeric", "text"):
        run(rows, gold)


def run(rows: list[dict], gold: str) -> None:
    items, labels = [], []
    for i, r in enumerate(rows):
        answer = rmath.extract_answer(r["ground_truth"]) if gold == "numeric" else r["ground_truth"]
        for key, v in r.items():
            if isinstance(v, dict) and "solution" in v:
                items.append((Task(id=f"{i}-{key}", prompt=r["question"], answer=answer), v["solution"]))
                labels.append(bool(v["is_correct"]))
    symbolic = 0
    orig = rmath._math_verify_equal

    def counting(pred, gold, *rest):
        nonlocal symbolic
        symbolic += 1
        return orig(pred, gold, *rest)

    rmath._math_verify_equal = counting
    rmath.verify_math("warm-up \\boxed{x^2}", "x^2")  # first symbolic call pays one-off start-up costs
    symbolic = 0
    t0 = time.perf_counter()
    scores = [rmath.math_reward(t, c) for t, c in items]
    main_s = time.perf_counter() - t0
    rmath._math_verify_equal = orig
    t0 = time.perf_counter()
    threaded = score_many(rmath.math_reward, items, max_workers=8, timeout_s=30)
    thr_s = time.perf_counter() - t0
    agree = sum((s.value == 1.0) == lab for s, lab in zip(scores, labels))
    errored = sum(s.error is not None for s in threaded)
    print(json.dumps({
        "gold": gold, "items": len(items), "symbolic_calls": symbolic,
        "main_thread_items_per_s": round(len(items) / main_s, 1),
        "score_many_8_items_per_s": round(len(items) / thr_s, 1),
        "agree_with_labels": agree, "errored_threaded": errored,
        "same_scores_threaded": [s.value for s in scores] == [s.value for s in threaded],
    }))


if __name__ == "__main__":
    main()
