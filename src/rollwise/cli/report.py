"""`rollwise report RUN_DIR`: write RUN_DIR/report.html, one self-contained page (no network to open it)."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="write RUN_DIR/report.html: plots, rollout card and a rollout browser")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--output", "-o", metavar="F", help="where to write the page (default: RUN_DIR/report.html)")
    p.add_argument("--max-steps", type=int, default=8, help="embed rollouts of at most this many latest steps (default 8)")
    p.add_argument("--max-rows", type=int, default=600, help="embed at most this many rollouts, whole groups (default 600)")
    p.add_argument("--max-tokens", type=int, default=512, help="embed at most this many tokens per completion (default 512)")


def run(args: argparse.Namespace) -> int:
    from rollwise.cli.paths import output_file, run_dir
    from rollwise.cli.terminal import say

    run_dir(args.run_dir)
    output_file(args.output)
    from rollwise.report.build import ReportLimits, write_report

    limits = ReportLimits(max_steps=args.max_steps, max_rows=args.max_rows, max_tokens=args.max_tokens)
    path = write_report(args.run_dir, output=args.output, limits=limits,
                        warn=lambda line: say(f"rollwise report: {line}", file=sys.stderr))
    say(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0
