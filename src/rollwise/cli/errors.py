"""How the CLI reports a failure: one line for anything the user can fix, a traceback only for rollwise's bugs.

`report(cmd, exc, debug)` sorts an exception into one of three kinds and prints it on stderr:

- **input** (the user's input or the machine: a bad file, config key, URL, a server that failed, a full disk, a
  missing optional package): one line `rollwise CMD: error: ...`, exit code 2. These are the expected classes:
  `UserError`, `ValueError` (config, dataset, checkpoint and shard errors, JSON and YAML and pydantic errors are
  all ValueErrors), `OSError` (missing files, directories given as files, refused connections, timeouts),
  `http.client.HTTPException` (a server that does not speak HTTP), a remote engine's error, an unusable sandbox,
  out-of-memory, and an ImportError of a package that is not rollwise's own.
- **user code** (an exception raised inside the user's own module: an `env.module`, a reward, an environment
  given as `file.py:attr`): one line naming the user's file and line, exit code 2.
- **bug** (anything else: a KeyError, TypeError, AttributeError, ... raised inside rollwise): one line
  `rollwise CMD: internal error: ...` saying it is rollwise's bug, then the traceback (so a report can carry it
  without rerunning a long run), exit code 70.

`ROLLWISE_DEBUG=1` (or `rollwise --debug CMD`) prints the traceback after the one line for every kind.
The decision is made on the exception's class (and, for "user code", on where it was raised), never on its text.
"""

from __future__ import annotations

import http.client
import os
import sys
import traceback
from typing import TextIO

from rollwise.cli.terminal import shown
from rollwise.usercode import user_frame as _user_frame

EXIT_INPUT = 2
"""Exit code of an error the user can fix (input, machine, user code); argparse uses 2 for bad arguments too."""
EXIT_BUG = 70
"""Exit code of an internal error (EX_SOFTWARE in sysexits.h)."""
MAX_CHARS = 600
"""A one-line message is cut to this many characters."""

# Expected errors that live in modules the CLI should not import just to name them (torch, the engine, ...):
# matched by the qualified names in the exception's MRO.
EXPECTED_NAMES = frozenset({
    "rollwise.clients.remote_check.RemoteEngineError",  # a remote server failed, refused, timed out, answered garbage
    "rollwise.clients.vllm.launch.VLLMLaunchError",   # a vLLM server rollwise started did not come up
    "rollwise.run.sync_check.WeightSyncError",       # a weight sync did not land (the engine's log-probs disagree)
    "rollwise.sandbox.jail.SandboxUnavailable",      # the machine cannot run the sandbox
    "rollwise.engine.block_manager.NoFreeBlocksError",  # the KV cache is too small for the request
    "torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError",
    "safetensors_rust.SafetensorError",              # a corrupt weights file
    "yaml.error.YAMLError",
})
DEBUG_ENV = "ROLLWISE_DEBUG"



class UserError(Exception):
    """A mistake in the user's input: printed as one line, exit code 2, no traceback."""


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _qualnames(exc: BaseException) -> set[str]:
    return {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}


def kind_of(exc: BaseException) -> str:
    """'input', 'user code' or 'bug' (see the module docstring)."""
    if isinstance(exc, (UserError, ValueError, OSError, http.client.HTTPException, MemoryError)):
        return "input"
    if _qualnames(exc) & EXPECTED_NAMES:
        return "input"
    if isinstance(exc, ImportError) and not (exc.name or "rollwise").split(".")[0] == "rollwise":
        return "input"
    if _user_frame(exc) is not None:
        return "user code"
    return "bug"


def _pydantic_line(exc: BaseException) -> str | None:
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ != "ValidationError" or not callable(errors):
        return None
    try:
        first = errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        return f"{loc}: {first.get('msg')}" if loc else str(first.get("msg"))
    except Exception:  # noqa: BLE001 - fall back to the plain text
        return None


def message(exc: BaseException, typed: bool = True) -> str:
    """The exception as one line: its text with line breaks folded, or its class name when it has no text.
    `typed`: put the class name first when the text comes from outside rollwise and would not stand alone."""
    if isinstance(exc, MemoryError):
        return "out of memory" + (f": {exc}" if str(exc) else "")
    if isinstance(exc, ImportError) and exc.name and kind_of(exc) == "input":
        return f"{exc} (install the missing package: pip install {exc.name.split('.')[0]})"
    text = _pydantic_line(exc)
    if text is None:
        if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
            text = f"{exc.filename}: {exc.strerror}"
            typed = False  # names the file and the problem: stands alone
        elif isinstance(exc, KeyError) and len(exc.args) == 1:
            text = f"missing key {exc.args[0]!r}"
        else:
            text = str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    text = "; ".join(lines)
    if not text:
        return type(exc).__name__
    # A bare message from the standard library ("[Errno 111] Connection refused", "timed out") means little
    # without its class; rollwise's own errors are worded to stand alone.
    if typed and not type(exc).__module__.startswith("rollwise") and type(exc) not in (ValueError, UserError):
        if type(exc).__name__ not in text:
            text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 3] + "..."


def report(cmd: str, exc: BaseException, *, debug: bool = False, stream: TextIO | None = None) -> int:
    """Print `exc` for command `cmd` as the module docstring describes; return the exit code."""
    out = stream if stream is not None else sys.stderr
    kind = kind_of(exc)
    prog = f"rollwise {cmd}" if cmd else "rollwise"
    if kind == "input":
        print(shown(f"{prog}: error: {message(exc)}"), file=out)
        code = EXIT_INPUT
    elif kind == "user code":
        fr = _user_frame(exc)
        where = f"{fr.filename}:{fr.lineno}" if fr is not None else "your code"
        hint = "" if debug_enabled(debug) else f" ({DEBUG_ENV}=1 prints the traceback)"
        print(shown(f"{prog}: error: in your code at {where}: {type(exc).__name__}: {message(exc, typed=False)}{hint}"),
              file=out)
        code = EXIT_INPUT
    else:
        print(shown(f"{prog}: internal error: {type(exc).__name__}: {message(exc, typed=False)} (a bug in rollwise, not "
                    "in your input: please report it with the traceback below)"), file=out)
        _print_traceback(exc, out)
        return EXIT_BUG
    if debug_enabled(debug):
        _print_traceback(exc, out)
    out.flush()
    return code


def _print_traceback(exc: BaseException, out: TextIO) -> None:
    print(shown("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))), end="", file=out)


def one_line_warnings(cmd: str):
    """A `warnings.showwarning` that prints `rollwise CMD: warning: MESSAGE` (one line, no source line)."""

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - the warnings signature
        text = "; ".join(ln.strip() for ln in str(message).splitlines() if ln.strip())
        print(shown(f"rollwise {cmd}: warning: {text}"), file=file or sys.stderr)

    return show
