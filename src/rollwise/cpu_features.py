"""What this CPU can do, read once: its /proc/cpuinfo flags and the best native bf16 dot product oneDNN may use.

Both the engine (which linear kernel runs at which batch size) and the trainer (whether bf16 autocast pays) choose
their paths from this at load. `ONEDNN_MAX_CPU_ISA`, oneDNN's own cap on the instruction set, is honoured the way
oneDNN honours it, so capping it is how the lower paths are tested on a machine that has the higher ones.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

__all__ = ["CPU_BF16_FLAGS", "BF16Isa", "cpu_bf16_support", "cpu_flags", "machine_bf16_support"]

BF16Isa = Literal["amx_bf16", "avx512_bf16"]

CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of native bf16 dot products (AMX tiles, AVX512-BF16), best first."""

_ONEDNN_BELOW_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"})
"""`ONEDNN_MAX_CPU_ISA` values that forbid oneDNN the native bf16 instructions."""
_ONEDNN_BELOW_AMX = frozenset({"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512"})
"""`ONEDNN_MAX_CPU_ISA` values that allow AVX512-BF16 but not AMX."""


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags from /proc/cpuinfo (empty where there is none: macOS, Windows)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_bf16_support(flags: frozenset[str], max_isa: str | None = None) -> BF16Isa | None:
    """The best native bf16 dot product among `flags` that oneDNN may use under `max_isa` (`ONEDNN_MAX_CPU_ISA`),
    or None (bf16 would be emulated: slower than float32)."""
    cap = (max_isa or "").strip().upper()
    if cap in _ONEDNN_BELOW_BF16:
        return None
    if "amx_bf16" in flags and "amx_tile" in flags and cap not in _ONEDNN_BELOW_AMX:
        return "amx_bf16"
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        return "avx512_bf16"
    return None


def machine_bf16_support() -> BF16Isa | None:
    """`cpu_bf16_support` for this machine and this process's `ONEDNN_MAX_CPU_ISA`."""
    return cpu_bf16_support(cpu_flags(), os.environ.get("ONEDNN_MAX_CPU_ISA"))
