"""What the CLI prints for a person to read, with the control characters of text it did not write escaped.

A path, a file's line, a task id or a server's message can hold control characters: an ESC sequence that recolours
the terminal, rewrites its title, moves the cursor over earlier lines or (on some terminals) answers back with
input of its own; a bidirectional override that shows a path other than the one named. `shown(text)` writes each
such character as a Python-style escape (`\\x1b`, `\\u202e`), so the line says what the text holds instead of doing
it. Line breaks and tabs are kept (a multi-line log message stays readable); one-line errors fold line breaks
before they get here.

Deliberately left out: machine-readable output (JSON lines, exports, the config dump), which must keep the data as
it is; JSON escapes control characters itself.
"""

from __future__ import annotations

import sys
from typing import TextIO

_KEEP = frozenset("\n\t")
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(c: str) -> bool:
    o = ord(c)
    return (o < 0x20 and c not in _KEEP) or 0x7F <= o <= 0x9F or c in _BIDI


def shown(text: object) -> str:
    """`text` as a string whose control characters (C0 but line break and tab, DEL, C1, bidirectional controls)
    are escaped."""
    s = str(text)
    if not any(_unsafe(c) for c in s):
        return s
    return "".join((f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") if _unsafe(c) else c for c in s)


def say(text: object = "", *, file: TextIO | None = None, flush: bool = False) -> None:
    """print(), with `shown`: the CLI's way to print a line that carries a path or other outside text."""
    print(shown(text), file=file if file is not None else sys.stdout, flush=flush)


__all__ = ["say", "shown"]
