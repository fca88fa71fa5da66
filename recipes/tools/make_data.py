"""Write the tool recipe's data: recipes/data/multiply-{train,test}.jsonl and recipes/data/multiply-demos.jsonl.

Tasks: 3-digit by 3-digit multiplication ("What is 347 * 829?"), a conversational prompt, the product as the
answer. Demonstrations (for SFT, from training problems only): the assistant calls the calculator's multiply tool
with the two numbers, reads the result, and answers "347 * 829 = 287663". Train and test never share a pair.

    python recipes/tools/make_data.py [--train 2000] [--test 200] [--demos 400]
"""

import argparse
import hashlib
import json
import random
from pathlib import Path


def held_out(a, b, fraction=0.1):
    key = f"{min(a, b)}*{max(a, b)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64 < fraction


def task(a, b):
    return {"prompt": [{"role": "user", "content": f"What is {a} * {b}?"}], "answer": a * b}


def demo(a, b):
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    return {"messages": [
        {"role": "user", "content": f"What is {a} * {b}?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": str(a * b)},
        {"role": "assistant", "content": f"{a} * {b} = {a * b}"},
    ]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--demos", type=int, default=400)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "data"))
    args = ap.parse_args()
    rng = random.Random(0)
    train, test, seen = [], [], set()
    while len(train) < args.train or len(test) < args.test:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        side = test if held_out(a, b) else train
        if len(side) < (args.test if side is test else args.train):
            side.append((a, b))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(out / f"multiply-{name}.jsonl", "w") as fh:
            fh.writelines(json.dumps(task(a, b)) + "\n" for a, b in rows)
    with open(out / "multiply-demos.jsonl", "w") as fh:
        fh.writelines(json.dumps(demo(a, b)) + "\n" for a, b in train[: args.demos])
    print(f"wrote {len(train)} train, {len(test)} test problems and {min(args.demos, len(train))} demonstrations "
          f"to {out}")


if __name__ == "__main__":
    main()
