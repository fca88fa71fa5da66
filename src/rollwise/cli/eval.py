"""`rollwise eval --model DIR --env NAME [--split test] [--n N]`: accuracy of a checkpoint on an environment.

Reports accuracy sampled at --temperature (--samples per problem) and greedy, as `rollwise.run.rollouts`
defines it (errored scoring counts as wrong and stays in the denominator).
"""

from __future__ import annotations

import argparse
import json


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="accuracy of a checkpoint on an environment",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF checkpoint directory")
    p.add_argument("--env", required=True, help="environment name (or module:attr)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="environment constructor argument (YAML value), repeatable")
    p.add_argument("--split", default="test")
    p.add_argument("--n", type=int, default=200, help="problems to evaluate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=4, help="samples per problem at --temperature")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    import yaml

    from rollwise.cli.main import UserError
    from rollwise.envs import get_env

    kwargs = {}
    for item in args.env_arg:
        if "=" not in item:
            raise UserError(f"--env-arg expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        kwargs[k] = yaml.safe_load(v)
    if args.n < 1 or args.samples < 1 or args.max_tokens < 1:
        raise UserError("--n, --samples and --max-tokens must be positive")
    env = get_env(args.env, **kwargs)
    tasks = env.load(args.split, n=args.n, seed=args.seed)
    if not tasks:
        raise UserError(f"environment {args.env!r} has no tasks in split {args.split!r}")
    from rollwise.engine.llm import LLM
    from rollwise.run.rollouts import evaluate
    from rollwise.run.sync import resolve_device

    llm = LLM(args.model, device=resolve_device(args.device), dtype=args.dtype)
    res = evaluate(llm, llm.tokenizer, env, tasks, temperature=args.temperature, samples=args.samples,
                   max_tokens=args.max_tokens, seed=args.seed)
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{args.env} [{args.split}, {len(tasks)} problems]: accuracy {res['accuracy']:.3f} "
              f"(T={args.temperature}, {args.samples} samples each), greedy {res['accuracy_greedy']:.3f}")
    return 0
