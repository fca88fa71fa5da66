"""A C++ extension compiled on first use (`torch.utils.cpp_extension.load_inline`), or None with one warning.

The engine's CPU kernels (`cpu_kernels`, `cpu_linear`) are optional: without a compiler, ninja or the CPU features
they need, the engine runs its torch paths. Each kernel module holds one `InlineExtension`; the first `get()`
builds (or loads from torch's build cache) under a lock, and a failure is remembered and warned about once.
`ROLLWISE_CPU_KERNELS=0` switches every one of them off.
"""

from __future__ import annotations

import os
import threading
import warnings
from types import ModuleType
from typing import Callable


class InlineExtension:
    def __init__(self, name: str, source: str, functions: list[str], what: str, fallback: str,
                 check: Callable[[ModuleType], str | None] | None = None) -> None:
        """what / fallback: the warning's words ('CPU decode kernels', 'the torch paths'); check(module): a reason
        the built module cannot be used here, or None."""
        self.name, self.source, self.functions = name, source, functions
        self.what, self.fallback, self.check = what, fallback, check
        self.module: ModuleType | None = None  # its functions are typed by nothing but their docstrings
        self.failed: str | None = None
        self._lock = threading.Lock()

    def get(self) -> ModuleType | None:
        """The compiled module, or None when unavailable (the reason is in `failed`, warned about once)."""
        if os.environ.get("ROLLWISE_CPU_KERNELS", "1") == "0":
            return None
        if self.module is not None or self.failed is not None:
            return self.module
        with self._lock:
            if self.module is None and self.failed is None:
                try:
                    from torch.utils.cpp_extension import load_inline

                    m = load_inline(name=self.name, cpp_sources=[self.source], functions=self.functions,
                                    extra_cflags=["-O3", "-march=native", "-fopenmp"], verbose=False)
                    reason = self.check(m) if self.check is not None else None
                    if reason:
                        self.failed = reason
                    else:
                        self.module = m
                except Exception as e:  # noqa: BLE001 - no compiler/ninja: the torch path, said once
                    self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    warnings.warn(f"rollwise: {self.what} unavailable ({self.failed}); using {self.fallback}",
                                  RuntimeWarning, stacklevel=3)
        return self.module
