"""Where datasets live: an explicit path, else $ROLLWISE_DATA, else the nearest `shared/data` above here.

Walking up from the package finds a `shared/data` directory placed above a checkout, so both the installed
package and a test run from a checkout find the datasets without configuration.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_root(explicit: str | os.PathLike | None = None) -> Path:
    """The data directory; raises FileNotFoundError saying where it looked and how to point at it."""
    if explicit is not None:
        p = Path(explicit)
        if not p.exists():
            raise FileNotFoundError(f"data path {str(p)!r} does not exist")
        return p
    env = os.environ.get("ROLLWISE_DATA")
    if env:
        if not Path(env).is_dir():
            raise FileNotFoundError(f"$ROLLWISE_DATA={env!r} is not a directory")
        return Path(env)
    looked = []
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in [start, *start.parents]:
            cand = parent / "shared" / "data"
            looked.append(str(cand))
            if cand.is_dir():
                return cand
    raise FileNotFoundError("no dataset directory found: pass --data PATH or set $ROLLWISE_DATA (looked for shared/data above the current directory and the package)")


def dataset_file(relative: str, explicit: str | os.PathLike | None = None) -> Path:
    """A dataset file: `explicit` when it names a file, else `relative` inside the data root."""
    if explicit is not None and Path(explicit).is_file():
        return Path(explicit)
    p = data_root(explicit) / relative
    if not p.exists():
        raise FileNotFoundError(f"dataset file {str(p)!r} not found (pass --data PATH to the file or its directory)")
    return p
