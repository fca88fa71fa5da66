"""`rollwise eval --model DIR --env NAME [--split test] [--n N]`: accuracy of a checkpoint on an environment.

Reports accuracy sampled at --temperature (--samples per problem) and greedy, as `rollwise.run.evaluate`
defines it (errored scoring counts as wrong and stays in the denominator).
"""

from __future__ import annotations

import argparse
import json

from rollwise.cli.envargs import add_env_args, env_and_tasks, positive


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="accuracy of a checkpoint on an environment",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF checkpoint directory")
    add_env_args(p, split="test", n=200)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=4, help="samples per problem at --temperature")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    positive(args, "n", "samples", "max_tokens", "max_turns")
    env, tasks = env_and_tasks(args)
    from rollwise.cli.envargs import prompting
    from rollwise.engine.llm import LLM
    from rollwise.run.evaluate import evaluate
    from rollwise.run.setup import resolve_device

    llm = LLM(args.model, device=resolve_device(args.device), dtype=args.dtype)
    encode, episodes, stops = prompting(env, llm, args.max_turns)
    res = evaluate(llm, encode, env, tasks, temperature=args.temperature, samples=args.samples,
                   max_tokens=args.max_tokens, seed=args.seed, stop_token_ids=stops, episodes=episodes)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{args.env} [{args.split}, {len(tasks)} problems]: accuracy {res['accuracy']:.3f} "
              f"(T={args.temperature}, {args.samples} samples each), greedy {res['accuracy_greedy']:.3f}")
    return 0
