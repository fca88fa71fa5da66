"""rollwise.serve: an OpenAI-compatible HTTP server over one `EngineCore` (`rollwise serve`).

protocol.py validates requests and shapes responses (no torch), worker.py owns the engine thread, app.py
is the HTTP layer, conn.py bounds what a connection can hold (deadlines, cap, byte budget), chat.py renders
chat messages. `OpenAIServer` and `ServeConfig` are imported lazily so
that importing the package stays cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OpenAIServer", "ServeConfig"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rollwise.serve import app

        return getattr(app, name)
    raise AttributeError(f"module 'rollwise.serve' has no attribute {name!r}")
