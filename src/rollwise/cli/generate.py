"""`rollwise generate --model DIR --env NAME --out RUN_DIR`: rollouts only (no training) into a rollout store.

Samples `--samples` completions for each of `--n` tasks of the environment, scores them, and writes them as
one Parquet shard per batch of `--prompts-per-step` prompts under `RUN_DIR/rollouts/`, with every rollout's
status (kept / errored / truncated / aborted). Useful for building datasets, offline evaluation, and replay.
"""

from __future__ import annotations

import argparse
import json

from rollwise.cli.envargs import add_env_args, env_and_tasks, positive


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="rollouts only (no training) into a rollout store",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF checkpoint directory")
    add_env_args(p, split="train", n=64)
    p.add_argument("--out", required=True, help="run directory to write rollouts/ into")
    p.add_argument("--samples", type=int, default=8, help="samples per task")
    p.add_argument("--prompts-per-step", type=int, default=16, help="tasks per shard")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    positive(args, "n", "samples", "prompts_per_step", "max_tokens", "max_turns")
    env, tasks = env_and_tasks(args)
    from transformers.utils import logging as hf_logging

    from rollwise.cli.envargs import prompting
    from rollwise.control import RolloutController, UniformPolicy
    from rollwise.engine.llm import LLM
    from rollwise.run.setup import resolve_device
    from rollwise.store.writer import RolloutStore
    from rollwise.types import SamplingParams

    hf_logging.disable_progress_bar()
    llm = LLM(args.model, device=resolve_device(args.device), dtype=args.dtype, seed=args.seed)
    tok = llm.tokenizer
    store = RolloutStore(Path(args.out), decode=(lambda ids: tok.decode(ids)) if tok is not None else None)
    encode, episodes, stops = prompting(env, llm, args.max_turns)
    # the loop's own select -> generate -> score -> Rollout path (episodes for a multi-turn environment)
    controller = RolloutController(UniformPolicy(), env, tok, encode=encode, episodes=episodes)
    for step, start in enumerate(range(0, len(tasks), args.prompts_per_step), start=1):
        chunk = tasks[start : start + args.prompts_per_step]
        sp = SamplingParams(n=args.samples, temperature=args.temperature, top_p=args.top_p,
                            max_tokens=args.max_tokens, seed=args.seed * 1_000_003 + step, stop_token_ids=stops or None)
        res = controller.run_step(llm, lambda k, c=chunk: c[:k], sp, step=step, batch_groups=len(chunk))
        store.write_step(step, [r for g in res.groups for r in g.rollouts])
    counts = store.counts_by_status()
    print(json.dumps({"rollouts": counts, "out": str(store.dir)}))
    return 0
