"""`rollwise config explain KEY`: a config key's type, default and description (from the config's docstrings).

An unknown key fails with one line naming the closest valid key, TRL's names included (`learning_rate` ->
`train.lr`). Every key with its description: `rollwise train --print-config --doc` (`--defaults` for the
documented defaults rather than the embedded recipe).
"""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("config", help="explain config keys", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    e = sub.add_parser("explain", help="a key's type, default and description",
                       description="Print a config key's type, default and description (a section: its keys).")
    e.add_argument("key", metavar="KEY", help="dotted config key, e.g. train.lr or rollout (a section)")


def run(args: argparse.Namespace) -> int:
    from rollwise.config_doc import explain

    print(explain(args.key), end="")
    return 0
