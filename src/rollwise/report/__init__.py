"""rollwise.report: one self-contained HTML page per run (plots, rollout card, rollout browser).

`write_report(run_dir)` is the entry point; `rollwise report RUN_DIR` calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ReportLimits", "write_report"]

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.report.build import ReportLimits, write_report


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rollwise.report import build

        return getattr(build, name)
    raise AttributeError(f"module 'rollwise.report' has no attribute {name!r}")
