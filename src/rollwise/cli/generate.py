"""`rollwise generate --model DIR --env NAME --out RUN_DIR`: rollouts only (no training) into a rollout store.

Samples `--samples` completions for each of `--n` tasks of the environment, scores them, and writes them as
one Parquet shard per batch of `--prompts-per-step` prompts under `RUN_DIR/rollouts/`, with every rollout's
status (kept / errored / truncated / aborted). Useful for building datasets, offline evaluation, and replay.

`--config CONFIG.yaml` (the training config) generates and scores as training does: its env section (reward,
chat template, system prompt), its model, and, unless given here, its rollout settings (samples_per_prompt,
prompts_per_step, temperature, top_p, top_k, max_tokens) and env.train_size. See `cli/envargs.py` for --set,
--env and --env-arg. The last line is JSON: rollout counts by status (errored ones included) and the store.
"""

from __future__ import annotations

import argparse
import json
import sys

from rollwise.cli.envargs import add_env_args, positive
from rollwise.cli.terminal import say


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("generate", help="rollouts only (no training) into a rollout store",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF checkpoint directory (default: the config's model.path)")
    add_env_args(p, split="train", n=64)
    p.add_argument("--out", required=True, help="run directory to write rollouts/ into")
    p.add_argument("--samples", type=int, default=None, help="samples per task (default 8; rollout.samples_per_prompt)")
    p.add_argument("--prompts-per-step", type=int, default=None, help="tasks per shard (default 16; rollout.prompts_per_step)")
    p.add_argument("--temperature", type=float, default=None, help="default 1.0 (rollout.temperature)")
    p.add_argument("--top-p", type=float, default=None, help="default 1.0 (rollout.top_p)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 64 (rollout.max_tokens)")
    p.add_argument("--device", default=None, help="default auto (model.device)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16", "int8"), help="default float32 (model.dtype)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rollwise.cli.envargs import env_and_tasks, load_llm, load_setup, prompting

    positive(args, "n", "samples", "prompts_per_step", "max_tokens", "max_turns")
    setup = load_setup(args)
    seed = args.seed if args.seed is not None else (setup.cfg.train.seed if setup.from_config else 0)
    env, tasks = env_and_tasks(setup, args, n_key="env.train_size", seed=seed)
    from transformers.utils import logging as hf_logging

    from rollwise.control import RolloutController, UniformPolicy
    from rollwise.store.writer import RolloutStore
    from rollwise.types import SamplingParams

    samples = setup.pick(args.samples, "rollout.samples_per_prompt", 8)
    per_step = setup.pick(args.prompts_per_step, "rollout.prompts_per_step", 16)
    hf_logging.disable_progress_bar()
    llm = load_llm(setup, args, seed=seed)
    tok = llm.tokenizer
    encode, episodes, stops = prompting(setup, env, llm, tasks)
    store = RolloutStore(Path(args.out), decode=(lambda ids: tok.decode(ids)) if tok is not None else None)
    # the loop's own select -> generate -> score -> Rollout path (episodes for a multi-turn environment)
    controller = RolloutController(UniformPolicy(), env, tok, encode=encode, episodes=episodes)
    for step, start in enumerate(range(0, len(tasks), per_step), start=1):
        chunk = tasks[start : start + per_step]
        sp = SamplingParams(n=samples, temperature=setup.pick(args.temperature, "rollout.temperature", 1.0),
                            top_p=setup.pick(args.top_p, "rollout.top_p", 1.0), top_k=setup.pick(None, "rollout.top_k", -1),
                            max_tokens=setup.pick(args.max_tokens, "rollout.max_tokens", 64),
                            seed=seed * 1_000_003 + step, stop_token_ids=stops or None)
        res = controller.run_step(llm, lambda k, c=chunk: c[:k], sp, step=step, batch_groups=len(chunk))
        store.write_step(step, [r for g in res.groups for r in g.rollouts])
    counts = store.counts_by_status()
    total, errored = counts.get("total", 0), counts.get("errored", 0)
    if total and errored == total:
        say(f"rollwise generate: warning: every rollout's scoring errored ({errored} of {total}); their rewards "
            f"mean nothing (see the `error` column: rollwise rollouts export {store.dir.parent})", file=sys.stderr)
    elif errored:
        print(f"rollwise generate: warning: {errored} of {total} rollouts errored in scoring", file=sys.stderr)
    print(json.dumps({"rollouts": counts, "out": str(store.dir)}))
    return 0
