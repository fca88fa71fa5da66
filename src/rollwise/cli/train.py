"""`rollwise train [CONFIG.yaml] [--set k=v ...] [--out RUN_DIR] [--resume]`: RL training.

With no config it runs the embedded default (built-in tiny model, supervised warm-up, GRPO on arithmetic).
The config is parsed and validated before anything heavy is imported, so a bad key fails in a second.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="RL training (no config: the embedded default)",
                              description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="YAML run config (default: the embedded default)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=5e-5 (repeatable)")
    p.add_argument("--out", help="run directory (overrides run.out_dir)")
    p.add_argument("--resume", nargs="?", const=True, default=None, metavar="RUN_DIR",
                   help="continue from the latest checkpoint of RUN_DIR (or of --out / run.out_dir)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def run(args: argparse.Namespace) -> int:
    from rollwise.config import dump_config, load_config

    overrides = list(args.overrides)
    out = args.out
    if isinstance(args.resume, str):
        out = args.resume
    if out:
        overrides.append(f"run.out_dir={out}")
    if args.resume:
        overrides.append("run.resume=true")
    cfg = load_config(args.config, overrides)
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    from transformers.utils import logging as hf_logging

    from rollwise.run.sync import run_sync

    hf_logging.disable_progress_bar()  # "Loading weights" bars on every engine/trainer load drown the run's own output

    summary = run_sync(cfg)
    b, a = summary["eval_before"], summary["eval_after"]
    print(f"done in {summary['wall_s']:.0f}s: held-out accuracy {b['accuracy']:.3f} -> {a['accuracy']:.3f} "
          f"(sampled), {b['accuracy_greedy']:.3f} -> {a['accuracy_greedy']:.3f} (greedy); "
          f"run directory {summary['run_dir']}")
    return 0
