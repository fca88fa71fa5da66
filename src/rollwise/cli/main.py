"""`rollwise` command line: parse first, import heavy modules only inside the chosen command.

Each sub-command is one module in this package exposing `add_parser(subparsers)` and `run(args) -> int`.
They are listed in `COMMANDS`; a module must not import torch at import time (so `--help` stays fast).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module; each module adds its own parser and runs itself.
COMMANDS: dict[str, str] = {
    "train": "rollwise.cli.train",
    "generate": "rollwise.cli.generate",
    "eval": "rollwise.cli.eval",
    "score": "rollwise.cli.score",
    "report": "rollwise.cli.report",
    "serve": "rollwise.cli.serve",
    "rollouts": "rollwise.cli.rollouts",
    "convert": "rollwise.cli.convert",
}


class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollwise", description="rollwise: generate, score, control, replay and train on rollouts for LLM RL post-training.")
    from rollwise import __version__

    parser.add_argument("--version", action="version", version=f"rollwise {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:  # command not built yet in this checkout
                continue
            raise
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    mod = importlib.import_module(COMMANDS[args.command])
    try:
        return int(mod.run(args) or 0)
    except UserError as e:
        print(f"rollwise {args.command}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as e:
        # Bad input surfaced at a boundary: one line, no traceback.
        print(f"rollwise {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"rollwise {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
