"""`rollwise eval --model DIR --env NAME [--split test] [--n N]`: accuracy of a checkpoint on an environment.

Reports accuracy sampled at --temperature (--samples per problem) and greedy, as `rollwise.run.evaluate`
defines it (errored scoring counts as wrong and stays in the denominator), with how many samples errored.
When every sample errored there is no accuracy to report: one line with the first error, exit code 2.

`--config CONFIG.yaml` (the training config) scores and formats as training does: its env section (reward,
chat template, system prompt, pass_threshold), its model, and, unless given here, training's held-out
evaluation settings (rollout.temperature, rollout.max_tokens, run.eval_size or env.eval_size problems chosen
with train.seed, sampled with training's evaluation seed): `rollwise eval --config C --model CHECKPOINT_DIR`
repeats the run's held-out evaluation on that checkpoint. See `cli/envargs.py` for --set, --env and --env-arg.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from rollwise.cli.envargs import TRAIN_EVAL_SEED_OFFSET, add_env_args, positive
from rollwise.cli.terminal import say

if TYPE_CHECKING:
    from rollwise.run.evaluate import EvalResult


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="accuracy of a checkpoint on an environment",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="HF checkpoint directory (default: the config's model.path)")
    add_env_args(p, split="test", n=200)
    p.add_argument("--temperature", type=float, default=None, help="default 1.0 (with --config: rollout.temperature)")
    p.add_argument("--samples", type=int, default=None, help="samples per problem at --temperature (default: the config's run.eval_samples, 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="default 16 (with --config: rollout.max_tokens)")
    p.add_argument("--device", default=None, help="default auto (with --config: model.device)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16", "int8"),
                   help="default float32 (with --config: model.dtype)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def errored_line(res: EvalResult, label: str) -> str:
    """'errored 3/8 sampled, 1/2 greedy' (an EvalResult's counts)."""
    return "errored " + ", ".join(f"{len(res.errors[k])}/{res.samples[k]} {name}"
                                  for k, name in (("", label), ("_greedy", "greedy")) if k in res.samples)


def run(args: argparse.Namespace) -> int:
    from rollwise.cli.envargs import env_and_tasks, load_llm, load_setup, prompting
    from rollwise.cli.errors import UserError

    positive(args, "n", "samples", "max_tokens", "max_turns")
    setup = load_setup(args)
    cfg = setup.cfg
    task_seed = args.seed if args.seed is not None else (cfg.train.seed if setup.from_config else 0)
    sample_seed = args.seed if args.seed is not None else (
        cfg.train.seed + TRAIN_EVAL_SEED_OFFSET if setup.from_config else 0)
    n_key = "run.eval_size" if cfg.run.eval_size is not None else "env.eval_size"
    env, tasks = env_and_tasks(setup, args, n_key=n_key, seed=task_seed)
    from rollwise.run.evaluate import evaluate_detailed

    temperature = setup.pick(args.temperature, "rollout.temperature", 1.0)
    samples = args.samples or cfg.run.eval_samples  # the run's own evaluation, as the loop takes it
    llm = load_llm(setup, args, seed=sample_seed)
    encode, episodes, stops = prompting(setup, env, llm, tasks)
    res = evaluate_detailed(llm, encode, env, tasks, temperature=temperature, samples=samples,
                            max_tokens=setup.pick(args.max_tokens, "rollout.max_tokens", 16), seed=sample_seed,
                            stop_token_ids=stops, pass_threshold=cfg.env.pass_threshold, episodes=episodes)
    total = sum(res.samples.values())
    bad = [e for errs in res.errors.values() for e in errs]
    if total and len(bad) == total:
        tid, err = bad[0]
        raise UserError(f"every sample's scoring errored ({len(bad)} of {total}), so there is no accuracy to report; "
                        f"first: task {tid}: {err}")
    if bad:
        tid, err = bad[0]
        say(f"rollwise eval: warning: {len(bad)} of {total} samples errored and count as wrong; first: task {tid}: "
            f"{err}", file=sys.stderr)
    m = res.metrics
    if args.json:
        print(json.dumps({**m, "samples": res.samples.get("", 0), "samples_greedy": res.samples.get("_greedy", 0)}))
    else:
        say(f"{cfg.env.name} [{args.split}, {len(tasks)} problems]: accuracy {m['accuracy']:.3f} "
            f"(T={temperature}, {samples} samples each), greedy {m['accuracy_greedy']:.3f}; "
            f"{errored_line(res, 'sampled')}")
    return 0
