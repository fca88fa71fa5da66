"""Write the tool recipe's data: recipes/data/calc-{train,test}.jsonl and recipes/data/calc-demos.jsonl.

Tasks: a product plus a term ("What is 347 * 829 + 512?"), which takes two calculator calls: multiply, then add to
its result. The demonstrations (for SFT, from training problems only) come from an imperfect agent: most of them
make the multiply call and then answer with its result, forgetting the addition, so their final answers are wrong;
the rest make both calls and answer right. SFT learns the tool-call format and the habit of stopping early, and RL
has the work of learning when to make the second call. Train and test never share a problem.

    python recipes/tools/make_data.py [--train 2000] [--test 200] [--demos 160] [--complete 0.35]
"""

import argparse
import hashlib
import json
import random
from pathlib import Path


def held_out(a, b, c, fraction=0.1):
    key = f"{min(a, b)}*{max(a, b)}+{c}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < fraction


def question(a, b, c):
    return f"What is {a} * {b} + {c}?"


def task(a, b, c):
    return {"prompt": [{"role": "user", "content": question(a, b, c)}], "answer": a * b + c}


def call(name, x, y):
    return {"type": "function", "function": {"name": name, "arguments": {"a": x, "b": y}}}


def demo(a, b, c, complete):
    """A demonstration; `complete` False is the imperfect agent's: one call, and the product as the answer."""
    product = a * b
    messages = [
        {"role": "user", "content": question(a, b, c)},
        {"role": "assistant", "content": "", "tool_calls": [call("multiply", a, b)]},
        {"role": "tool", "name": "multiply", "content": str(product)},
    ]
    if complete:
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call("add", product, c)]},
            {"role": "tool", "name": "add", "content": str(product + c)},
        ]
    answer = product + c if complete else product
    messages.append({"role": "assistant", "content": f"{a} * {b} + {c} = {answer}"})
    return {"messages": messages}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--demos", type=int, default=160)
    ap.add_argument("--complete", type=float, default=0.35, help="share of demonstrations that make both calls")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data"))
    args = ap.parse_args()
    rng = random.Random(0)
    train, test, seen = [], [], set()
    while len(train) < args.train or len(test) < args.test:
        a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(100, 999)
        if (a, b, c) in seen:
            continue
        seen.add((a, b, c))
        side = test if held_out(a, b, c) else train
        if len(side) < (args.test if side is test else args.train):
            side.append((a, b, c))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(out / f"calc-{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps(task(*abc)) + "\n" for abc in rows)
    n_demos = min(args.demos, len(train))
    n_complete = round(n_demos * args.complete)
    flags = [True] * n_complete + [False] * (n_demos - n_complete)
    rng.shuffle(flags)
    with open(out / "calc-demos.jsonl", "w") as fh:
        fh.writelines(json.dumps(demo(*abc, ok)) + "\n" for abc, ok in zip(train, flags))
    print(f"wrote {len(train)} train, {len(test)} test problems and {n_demos} demonstrations "
          f"({n_complete} with both calls) to {out}")


if __name__ == "__main__":
    main()
