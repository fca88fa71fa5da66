"""Write the SmolLM2 addition recipe's data: recipes/data/addition-{train,test}.jsonl.

2-digit addition ("What is 47 + 38?") with the sum as the answer column. The held-out file never shares a pair
of numbers with the training file (pairs are split by a hash, a + b and b + a together). Deterministic.

    python recipes/make_addition_data.py [--train 2000] [--test 200]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path


def held_out(a: int, b: int, fraction: float) -> bool:
    key = f"{min(a, b)}+{max(a, b)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < fraction


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    args = ap.parse_args()
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(0).shuffle(pairs)
    train = [p for p in pairs if not held_out(*p, 0.15)][: args.train]
    test = [p for p in pairs if held_out(*p, 0.15)][: args.test]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("addition-train.jsonl", train), ("addition-test.jsonl", test)):
        with open(out / name, "w") as f:
            for a, b in rows:
                f.write(json.dumps({"prompt": f"What is {a} + {b}?", "answer": a + b}) + "\n")
    print(f"wrote {len(train)} training and {len(test)} held-out problems to {out}")


if __name__ == "__main__":
    main()
