"""`rollwise` command line: parse first, import heavy modules only inside the chosen command.

Each sub-command is one module in this package exposing `add_parser(subparsers)` and `run(args) -> int`.
They are listed in `COMMANDS`; a module must not import torch at import time (so `--help` stays fast).
Errors: a command raises (UserError for a bad argument, or whatever the layer below raises) and `main` prints
it through `cli.errors.report`: one line for anything the user can fix, a traceback only for rollwise's bugs
(and for every error with `--debug` or ROLLWISE_DEBUG=1).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from typing import NoReturn

from rollwise.cli.errors import DEBUG_ENV, UserError, one_line_warnings, report

__all__ = ["COMMANDS", "UserError", "build_parser", "main"]

# name -> module; each module adds its own parser and runs itself.
COMMANDS: dict[str, str] = {
    "train": "rollwise.cli.train",
    "sft": "rollwise.cli.sft",
    "generate": "rollwise.cli.generate",
    "eval": "rollwise.cli.eval",
    "score": "rollwise.cli.score",
    "report": "rollwise.cli.report",
    "serve": "rollwise.cli.serve",
    "rollouts": "rollwise.cli.rollouts",
    "convert": "rollwise.cli.convert",
    "config": "rollwise.cli.config",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `rollwise CMD: error: ... (rollwise CMD --help)`, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rollwise", description="rollwise: generate, score, control, replay and train on rollouts for LLM RL post-training.")
    from rollwise import __version__

    parser.add_argument("--version", action="version", version=f"rollwise {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help=f"print the traceback of every error, not just of internal ones (also ${DEBUG_ENV}=1)")
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
    """Run one command; every failure ends here and is printed by `cli.errors.report` (one line unless it is a
    bug in rollwise)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    shown, warnings.showwarning = warnings.showwarning, one_line_warnings(args.command)
    try:
        mod = importlib.import_module(COMMANDS[args.command])
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print(f"rollwise {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # stdout closed early (`rollwise rollouts export RUN | head`): not an error; keep Python's exit-time flush
        # from failing on the same pipe.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):  # stdout is not a real file (captured, replaced)
            pass
        return 0
    except Exception as e:  # noqa: BLE001 - sorted into one-line errors and internal ones by cli.errors
        return report(args.command, e, debug=args.debug)
    finally:
        warnings.showwarning = shown


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
