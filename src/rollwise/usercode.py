"""Where an exception was raised in the user's own code (a reward file, an `env.module`, an environment class).

`user_frame(exc)` is the innermost frame of the traceback that lies outside rollwise, the standard library and
installed packages: the line the user wrote. The CLI names it in its one-line errors (`cli/errors.py`), and a
reward's errored Score names it (`rewards.base.describe_at`), so a reward that raises on every sample is reported
with its file and line. The decision is made on where the frame lies, never on the exception's text.
"""

from __future__ import annotations

import functools
import traceback
from pathlib import Path

PKG_DIR = Path(__file__).resolve().parent
"""src/rollwise: frames in here are rollwise's own."""


@functools.lru_cache(maxsize=1)
def _stdlib() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def _is_stdlib(path: Path) -> bool:
    return _stdlib() in path.parents


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the traceback when it lies in the user's code: a file outside rollwise, the
    standard library and installed packages."""
    if isinstance(exc, SyntaxError) and exc.filename:  # raised while compiling the user's file, not in a frame
        return traceback.FrameSummary(exc.filename, exc.lineno or 0, "<module>")
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(fr.filename)
        if fr.filename.startswith("<"):
            continue
        try:
            path = path.resolve()
        except OSError:
            continue
        if PKG_DIR in path.parents:
            return None  # raised by rollwise (maybe on the user's behalf, but then it is rollwise's message)
        if any(p in ("site-packages", "dist-packages") for p in path.parts) or _is_stdlib(path):
            continue  # a library the user's code called: keep looking for the user's own frame
        return fr
    return None


def raised_at(exc: BaseException) -> str | None:
    """'FILE:LINE' of `user_frame(exc)`, or None when the user's code is not where it was raised."""
    fr = user_frame(exc)
    return f"{fr.filename}:{fr.lineno}" if fr is not None else None
