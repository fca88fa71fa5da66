"""A C++ extension compiled on first use (`torch.utils.cpp_extension.load_inline`), or None with one warning.

The engine's CPU kernels (`cpu_kernels`, `cpu_linear`) are optional: without a compiler, ninja or the CPU features
they need, the engine runs its torch paths. Each kernel module holds one `InlineExtension`; the first `get()`
builds (or loads a build from the cache) under a lock, and a failure is remembered and warned about once.
`ROLLWISE_CPU_KERNELS=0` switches every one of them off.

The build uses `-march=native`, so a build is only valid for the CPU, compiler, torch and Python that made it. Its
folder lives under rollwise's cache (`kernels/NAME-KEY`), KEY hashing all of those plus the source: two installs
on one machine never rebuild each other's `.so`, and a cache copied to (or shared with) another CPU kind is
rebuilt rather than loaded. A build takes a minute or two on 2 cores, so it is announced on stderr with its cost
and the switch that skips it, and its time is printed when it ends.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable

from rollwise.cache_dir import rollwise_cache

CFLAGS = ["-O3", "-march=native", "-fopenmp"]


def _cpu_features() -> str:
    """The CPU's model and feature flags (what `-march=native` compiles for)."""
    try:
        with open("/proc/cpuinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    seen: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in wanted and key not in seen:
            seen[key] = " ".join(sorted(value.split())) if key in ("flags", "Features") else value.strip()
    return "|".join(f"{k}={seen[k]}" for k in wanted if k in seen)


def _compiler() -> str:
    """The C++ compiler torch's loader will use ($CXX, else c++) and its version line."""
    cxx = os.environ.get("CXX", "c++")
    path = shutil.which(cxx) or cxx
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    return f"{path} {out.splitlines()[0] if out else '?'}"


def build_key(source: str, cflags: list[str]) -> str:
    """A hash of everything a `-march=native` build depends on: the source, the flags, the compiler, torch (its
    version and commit), the Python ABI, the OS and the CPU's features."""
    import torch

    parts = [source, " ".join(cflags), _compiler(), torch.__version__, str(torch.version.git_version),
             sys.implementation.cache_tag or "", platform.system(), platform.machine(), _cpu_features()]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:16]


def build_dir(name: str, source: str, cflags: list[str] = CFLAGS) -> Path:
    """The cache folder holding this extension's build for this machine and install."""
    return rollwise_cache("kernels", f"{name}-{build_key(source, cflags)}")


class InlineExtension:
    def __init__(self, name: str, source: str, functions: list[str], what: str, fallback: str,
                 check: Callable[[ModuleType], str | None] | None = None) -> None:
        """what / fallback: the messages' words ('CPU decode kernels', 'the torch paths'); check(module): a reason
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
                    m = self._build_or_load()
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

    def _build_or_load(self) -> ModuleType:
        """Load the cached build, or build it (announced, then timed) when this machine has none yet."""
        from torch.utils.cpp_extension import load_inline

        folder = build_dir(self.name, self.source)
        building = not (folder / f"{self.name}.so").exists()
        if building:
            folder.mkdir(parents=True, exist_ok=True)
            sys.stderr.write(f"rollwise: building the {self.what} for this CPU (once per machine and install; about "
                             f"1-2 min on 2 cores) in {folder}; ROLLWISE_CPU_KERNELS=0 skips them and uses "
                             f"{self.fallback}\n")
            sys.stderr.flush()
        t0 = time.perf_counter()
        m = load_inline(name=self.name, cpp_sources=[self.source], functions=self.functions, extra_cflags=CFLAGS,
                        build_directory=str(folder), verbose=False)
        if building:
            sys.stderr.write(f"rollwise: {self.what} built in {time.perf_counter() - t0:.0f} s\n")
        return m
