"""Environment arguments shared by `rollwise eval` and `rollwise generate`: --env, --env-arg, --split, --n, --seed."""

from __future__ import annotations

import argparse
from typing import Any


def add_env_args(p: argparse.ArgumentParser, *, split: str, n: int) -> None:
    p.add_argument("--env", required=True, help="environment name (or module:attr)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="environment constructor argument (YAML value), repeatable")
    p.add_argument("--split", default=split)
    p.add_argument("--n", type=int, default=n, help="tasks to load")
    p.add_argument("--seed", type=int, default=0)


def positive(args: argparse.Namespace, *names: str) -> None:
    """One-line error for the first of `names` that is not a positive integer."""
    from rollwise.cli.main import UserError

    for name in names:
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer")


def env_and_tasks(args: argparse.Namespace) -> tuple[Any, list]:
    """Build the environment from --env/--env-arg and load --n tasks of --split (one-line errors)."""
    import yaml

    from rollwise.cli.main import UserError
    from rollwise.envs import get_env

    kwargs = {}
    for item in args.env_arg:
        if "=" not in item:
            raise UserError(f"--env-arg expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        kwargs[k] = yaml.safe_load(v)
    env = get_env(args.env, **kwargs)
    tasks = env.load(args.split, n=args.n, seed=args.seed)
    if not tasks:
        raise UserError(f"environment {args.env!r} has no tasks in split {args.split!r}")
    return env, tasks
