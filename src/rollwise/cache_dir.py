"""The one place rollwise keeps what it builds or converts once per machine: converted models, warm-up checkpoints
and compiled CPU kernels.

`$ROLLWISE_CACHE` when set, else `$XDG_CACHE_HOME/rollwise`, else `~/.cache/rollwise`. Everything under it is keyed
by what produced it (a model file's hash, a warm-up recipe's hash, a kernel's build key), so two installs on one
machine share entries only when they would have built the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path


def rollwise_cache(*parts: str) -> Path:
    """The cache folder, or a path under it (not created here)."""
    if os.environ.get("ROLLWISE_CACHE"):
        base = Path(os.environ["ROLLWISE_CACHE"]).expanduser()
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollwise"
    return base.joinpath(*parts)
