"""Write the mixed-difficulty arithmetic data: recipes/data/mixed-{train,test}.jsonl (and the low-base-rate slice).

Real RL data mixes problems the model nearly always solves with problems it nearly never does; only the ones in
between teach under GRPO. This set does the same on SmolLM2-135M-Instruct's scale, in the addition recipe's shape
("What is 47 + 38?", the integer answer, the same reward): seven kinds of problem, from one-digit addition (solved
almost every time) to two-by-two-digit multiplication (almost never). Each row carries its `kind`, so a report or a
reward can break results down by it. The training set is small on purpose (default 64 problems): over 20-40 steps
of 8 prompts every problem comes back several times, which is what lets a controller learn which ones are worth
sampling. Train and test never share a problem (split by a hash of the kind and the operands). Deterministic.

`--kinds` picks a subset: `--kinds add3,sub3,mul12 --prefix hard` writes the low-base-rate task (hard-*.jsonl)
the recipe's portability target uses.

    python recipes/make_mixed_data.py [--train 64] [--test 120] [--kinds ...] [--prefix mixed]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

# kind -> (operator, range of the first operand, range of the second); ranges are inclusive
KINDS: dict[str, tuple[str, tuple[int, int], tuple[int, int]]] = {
    "add1": ("+", (1, 9), (1, 9)),
    "add2": ("+", (10, 99), (10, 99)),
    "add3": ("+", (100, 999), (100, 999)),
    "sub2": ("-", (10, 99), (10, 99)),
    "sub3": ("-", (100, 999), (100, 999)),
    "mul1": ("*", (2, 9), (2, 9)),
    "mul12": ("*", (2, 9), (11, 99)),
    "mul2": ("*", (11, 99), (11, 99)),
}


def held_out(kind: str, a: int, b: int, fraction: float) -> bool:
    key = f"{kind}:{a}:{b}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < fraction


def pool(kind: str, test: bool, fraction: float, rng: random.Random) -> list[tuple[int, int]]:
    """Every problem of a kind on one side of the split (small kinds enumerated, large ones sampled), shuffled."""
    op, (lo1, hi1), (lo2, hi2) = KINDS[kind]
    if (hi1 - lo1 + 1) * (hi2 - lo2 + 1) <= 20_000:
        pairs = {(a, b) for a in range(lo1, hi1 + 1) for b in range(lo2, hi2 + 1)}
    else:
        pairs = {(rng.randint(lo1, hi1), rng.randint(lo2, hi2)) for _ in range(20_000)}
    if op == "-":  # answers stay non-negative
        pairs = {(max(a, b), min(a, b)) for a, b in pairs}
    out = sorted(p for p in pairs if held_out(kind, *p, fraction) == test)
    rng.shuffle(out)
    return out


def row(kind: str, a: int, b: int) -> dict:
    op = KINDS[kind][0]
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    return {"prompt": f"What is {a} {op} {b}?", "answer": answer, "kind": kind}


def draw(kinds: list[str], n: int, test: bool, seed: int, fraction: float = 0.2) -> list[dict]:
    """n problems, an equal share of each kind as far as each kind's side of the split allows (a kind with too few
    problems gives its shortfall to the others), shuffled."""
    rng = random.Random(seed)
    pools = {k: pool(k, test, fraction, rng) for k in kinds}
    quota = {k: 0 for k in kinds}
    while sum(quota.values()) < n:
        open_ = [k for k in kinds if quota[k] < len(pools[k])]
        if not open_:
            raise SystemExit(f"make_mixed_data: only {sum(quota.values())} {'test' if test else 'training'} problems "
                             f"exist for kinds {', '.join(kinds)}; asked for {n}")
        for k in open_:
            if sum(quota.values()) < n:
                quota[k] += 1
    out = [row(k, a, b) for k in kinds for a, b in pools[k][: quota[k]]]
    rng.shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=64)
    ap.add_argument("--test", type=int, default=120)
    ap.add_argument("--kinds", default="add1,add2,add3,sub2,sub3,mul1,mul12,mul2",
                    help=f"comma-separated subset of {', '.join(KINDS)}")
    ap.add_argument("--prefix", default="mixed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    args = ap.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise SystemExit(f"make_mixed_data: unknown kind(s) {', '.join(unknown) or '(none given)'}; known: "
                         f"{', '.join(KINDS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in ((f"{args.prefix}-train.jsonl", draw(kinds, args.train, False, args.seed)),
                       (f"{args.prefix}-test.jsonl", draw(kinds, args.test, True, args.seed + 1))):
        with open(out / name, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"wrote {args.train} training and {args.test} held-out problems ({', '.join(kinds)}) to {out}")


if __name__ == "__main__":
    main()
