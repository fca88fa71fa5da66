"""rollwise.clients: other engines behind rollwise's engine protocol.

An OpenAI-compatible server (vLLM, SGLang, `rollwise serve`) as `RemoteEngine`, several of them as `MultiEngine`;
the checks every server answer passes (`remote_check.py`), the HTTP client with a total deadline
(`http_client.py`), the step interface over streaming requests (`remote_stream.py`), how trained weights reach
each server kind (`weight_sync.py`, one chooser; `sync_report.py`, what every strategy reports), and vLLM itself: launching its servers (`vllm/launch.py`, on Ray
with `vllm/ray_placement.py`), its NCCL weight transfer (`vllm/nccl.py`) and the worker extension rollwise loads
into it (`vllm/plugin/`). rollwise's own engine (`rollwise.engine`) imports nothing from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.clients.remote import MultiEngine, RemoteEngine

__all__ = ["MultiEngine", "RemoteEngine"]


def __getattr__(name: str) -> Any:
    """`from rollwise.clients import RemoteEngine` without importing the HTTP stack for every user of the package."""
    if name in __all__:
        from rollwise.clients import remote

        return getattr(remote, name)
    raise AttributeError(f"module 'rollwise.clients' has no attribute {name!r}")
