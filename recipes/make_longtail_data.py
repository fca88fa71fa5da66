"""Write the long-tail reasoning task's data: recipes/data/longtail-{train,test}.jsonl.

Multi-step arithmetic the model works through before it answers: "Start with 6. Add 7, then subtract 4, then
multiply by 3. What is the result? Show each step." A problem has 1 to 6 operations (add, subtract, multiply), so the
working, and with it the completion, is a line long for one operation and several for six: completion lengths
spread, which is what a controller that cuts or reuses the long tail of a step needs to be measured on. Every
intermediate value stays between 0 and 200 (subtraction never goes below zero, multiplication only by 2 to 5 and only
while the value stays small). The answer is the final value; the reward is the addition recipe's (the last integer
of the completion equals the answer).

Why demonstrations: SmolLM2-135M-Instruct asked the question alone does the first step right about half the time and
then keeps inventing steps until the token limit (base greedy accuracy about 3%). So each prompt is a short chat:
two worked examples (one and three operations, the same two for every problem, so the engine's prefix cache shares
them) as earlier user and assistant turns, then the problem. The assistant turns end where a solution ends, which is
what teaches the model to stop. `--shots 0` writes the bare question instead.

The difficulty mix (the share of each number of operations and of larger numbers) was calibrated with
bench/longtail_calibrate.py so that the model's greedy accuracy on the test set lands between 10% and 40%; the
recipe (recipes/smollm2-longtail.yaml) gives the figures. Each row carries `ops` (number of operations), `size`
(small: start 2-12, amounts 1-9, multipliers 2-3; large: start 10-30, amounts up to 20, multipliers up to 5), `kind`
(`ops3-small`), the plain `question` and a worked `solution`. Train and test never share a problem (split by a hash
of the question). Each kind's problems are drawn from a sequence of their own, so a test set of any mix is a prefix
of every kind's sequence (the calibration evaluates those sequences once and reads any mix's accuracy off them). The
training set is small on purpose (64): over 40 steps of 8 prompts each problem comes back every 8 steps, five times
in all, so selection by pass rate and drafts from a prompt's last visit have something to act on. Deterministic.

    python recipes/make_longtail_data.py [--train 64] [--test 100] [--mix 1:3,2:3,3:2,4:1,5:1,6:1] [--large 0.25]
        [--shots 2] [--prefix longtail] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path
from typing import Any

MAX_VALUE = 200
"""Every intermediate value stays in [0, MAX_VALUE]."""

SIZES = {"small": {"start": (2, 12), "add": (1, 9), "mul": (2, 3)},
         "large": {"start": (10, 30), "add": (2, 20), "mul": (2, 5)}}
"""Operand ranges (inclusive) per size: the start value, added or subtracted amounts, multipliers."""

TEST_FRACTION = 0.3
"""Share of all problems on the test side of the split."""

DEFAULT_MIX = "1:3,2:3,3:2,4:1,5:1,6:1"
DEFAULT_LARGE = 0.25

Step = tuple[str, int]
"""An operation: ("add" | "subtract" | "multiply", amount)."""


def question(start: int, steps: list[Step]) -> str:
    words = ", then ".join(f"multiply by {a}" if op == "multiply" else f"{op} {a}" for op, a in steps)
    return f"Start with {start}. {words[0].upper()}{words[1:]}. What is the result? Show each step."


def solution(start: int, steps: list[Step]) -> str:
    """The worked answer the demonstrations show: one line per operation, then the result."""
    lines, v = [], start
    for i, (op, a) in enumerate(steps, 1):
        if op == "add":
            w, sym, nv = f"add {a} to {v}", "+", v + a
        elif op == "subtract":
            w, sym, nv = f"subtract {a} from {v}", "-", v - a
        else:
            w, sym, nv = f"multiply {v} by {a}", "*", v * a
        lines.append(f"Step {i}: {w}. {v} {sym} {a} = {nv}.")
        v = nv
    return "\n".join(lines) + f"\nThe result is {v}."


def evaluate(start: int, steps: list[Step]) -> list[int]:
    values = [start]
    for op, a in steps:
        values.append(values[-1] + a if op == "add" else values[-1] - a if op == "subtract" else values[-1] * a)
    return values


DEMOS: list[tuple[int, list[Step]]] = [(8, [("multiply", 2)]), (6, [("add", 7), ("subtract", 4), ("multiply", 3)])]
"""The worked examples every prompt opens with (one and three operations)."""


def random_steps(n_ops: int, size: str, rng: random.Random) -> tuple[int, list[Step]]:
    r = SIZES[size]
    value = rng.randint(*r["start"])
    start, steps = value, []
    for _ in range(n_ops):
        choices = ((["add"] if value + r["add"][0] <= MAX_VALUE else []) + (["subtract"] if value > 1 else [])
                   + (["multiply"] if 1 < value and value * r["mul"][0] <= MAX_VALUE else []))
        op = rng.choice(choices)
        if op == "multiply":
            a = rng.choice([k for k in range(r["mul"][0], r["mul"][1] + 1) if value * k <= MAX_VALUE])
            value *= a
        elif op == "subtract":
            a = rng.randint(1, min(r["add"][1], value - 1))
            value -= a
        else:
            a = rng.randint(r["add"][0], min(r["add"][1], MAX_VALUE - value))
            value += a
        steps.append((op, a))
    return start, steps


def prompt(q: str, shots: int) -> str | list[dict[str, str]]:
    """The bare question (shots 0), or the chat: `shots` worked examples as earlier turns, then the question."""
    if not shots:
        return q
    msgs = []
    for start, steps in DEMOS[:shots]:
        msgs += [{"role": "user", "content": question(start, steps)},
                 {"role": "assistant", "content": solution(start, steps)}]
    return msgs + [{"role": "user", "content": q}]


def row(start: int, steps: list[Step], size: str, shots: int) -> dict[str, Any]:
    q = question(start, steps)
    values = evaluate(start, steps)
    return {"prompt": prompt(q, shots), "answer": values[-1], "ops": len(steps), "size": size,
            "kind": f"ops{len(steps)}-{size}", "question": q, "solution": solution(start, steps)}


def held_out(q: str) -> bool:
    return int.from_bytes(hashlib.sha256(q.encode()).digest()[:8], "big") / 2**64 < TEST_FRACTION


def kind_sequence(n_ops: int, size: str, test: bool, seed: int, count: int, shots: int) -> list[dict[str, Any]]:
    """The first `count` distinct problems of one kind on one side of the split, in the kind's own seeded order."""
    rng = random.Random(f"longtail-{seed}-{'test' if test else 'train'}-{n_ops}-{size}")
    demos = {question(s, st) for s, st in DEMOS}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 200 * count + 1000:
            raise SystemExit(f"make_longtail_data: could not draw {count} distinct {n_ops}-operation {size} problems")
        start, steps = random_steps(n_ops, size, rng)
        q = question(start, steps)
        if q in seen or q in demos or held_out(q) != test:
            continue
        seen.add(q)
        out.append(row(start, steps, size, shots))
    return out


def parse_mix(text: str) -> dict[int, float]:
    """'1:3,2:3,3:2' -> {1: 3.0, 2: 3.0, 3: 2.0}: the relative share of each number of operations (1-6)."""
    mix: dict[int, float] = {}
    for part in text.split(","):
        k, _, w = part.partition(":")
        try:
            n, weight = int(k), float(w)
        except ValueError:
            raise SystemExit(f"make_longtail_data: --mix takes OPS:WEIGHT pairs such as 1:3,2:1; got {part!r}") from None
        if not 1 <= n <= 6 or weight < 0:
            raise SystemExit(f"make_longtail_data: --mix {part!r}: operations must be 1-6 and weights >= 0")
        mix[n] = weight
    if not sum(mix.values()):
        raise SystemExit("make_longtail_data: --mix gives every number of operations weight 0")
    return mix


def quotas(n: int, mix: dict[int, float], large: float) -> dict[tuple[int, str], int]:
    """Problems per (operations, size): each number of operations its share of `mix` (largest remainder), a `large`
    share of those with the larger numbers."""
    total = sum(mix.values())
    exact = {k: n * w / total for k, w in mix.items()}
    per_ops = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (per_ops[k] - exact[k], k))[: n - sum(per_ops.values())]:
        per_ops[k] += 1
    out = {}
    for k, q in per_ops.items():
        n_large = round(q * large)
        out[(k, "small")], out[(k, "large")] = q - n_large, n_large
    return out


def draw(n: int, mix: dict[int, float], large: float, test: bool, seed: int, shots: int) -> list[dict[str, Any]]:
    """n problems on one side of the split in the proportions `quotas` gives, shuffled (seeded)."""
    out = [r for (k, size), q in sorted(quotas(n, mix, large).items()) if q
           for r in kind_sequence(k, size, test, seed, q, shots)]
    random.Random(f"longtail-{seed}-{test}-order").shuffle(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=64)
    ap.add_argument("--test", type=int, default=100)
    ap.add_argument("--mix", default=DEFAULT_MIX, help="relative share of each number of operations, OPS:WEIGHT,...")
    ap.add_argument("--large", type=float, default=DEFAULT_LARGE, help="share of each with the larger numbers")
    ap.add_argument("--shots", type=int, default=2, choices=range(len(DEMOS) + 1), help="worked examples per prompt")
    ap.add_argument("--prefix", default="longtail")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "data"))
    args = ap.parse_args()
    if not 0 <= args.large <= 1:
        raise SystemExit(f"make_longtail_data: --large is a share in [0, 1], got {args.large}")
    mix = parse_mix(args.mix)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in ((f"{args.prefix}-train.jsonl", draw(args.train, mix, args.large, False, args.seed, args.shots)),
                       (f"{args.prefix}-test.jsonl", draw(args.test, mix, args.large, True, args.seed, args.shots))):
        with open(out / name, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"wrote {args.train} training and {args.test} held-out problems (operations {args.mix}, "
          f"{args.large:.0%} with larger numbers, {args.shots} worked examples each) to {out}")


if __name__ == "__main__":
    main()
