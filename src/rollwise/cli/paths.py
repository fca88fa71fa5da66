"""Checks of paths given on the command line, made before any work so a typo costs a second, not a run."""

from __future__ import annotations

from pathlib import Path

from rollwise.cli.errors import UserError


def output_file(path: str | None, flag: str = "--output") -> None:
    """An output file must be creatable: its directory exists and it is not itself a directory."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {path}: is a directory; name a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: directory {parent} does not exist")


def run_dir(path: str, what: str = "RUN_DIR") -> Path:
    """A run directory given as an argument must be a directory."""
    p = Path(path)
    if p.is_file():
        raise UserError(f"{what} {path} is a file, not a run directory")
    if not p.is_dir():
        raise UserError(f"{what} {path} does not exist")
    return p
