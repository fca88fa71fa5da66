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
    p.add_argument("--max-turns", type=int, default=4, help="multi-turn environments: most policy turns per episode")


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


def prompting(env: Any, llm: Any, max_turns: int) -> tuple[Any, Any, list[int]]:
    """(encode, episode runner or None, stop token ids) for `llm`: the same prompt building as training (the chat
    template when the tokenizer has one), and episodes for a multi-turn environment."""
    from rollwise.control.base import default_encoder
    from rollwise.control.episodes import EpisodeRunner, chat_reply_formatter, is_multi_turn
    from rollwise.models.prompting import PromptFormat, stop_token_ids

    tok = llm.tokenizer
    encode = default_encoder(tok)
    runner = None
    if is_multi_turn(env):
        templated = tok is not None and PromptFormat().uses_template(tok)
        runner = EpisodeRunner(env, tok, encode, chat_reply_formatter(tok, templated), max_turns=max_turns,
                               max_total_tokens=llm.engine.max_model_len)
    return encode, runner, stop_token_ids(tok, llm.model_dir)
