"""What every weight sync promises and reports: the `ServerSync` protocol and its `SyncReport`.

Apart from the strategies (`clients/weight_sync.py`) so that each of them, the vLLM NCCL one in
`clients/vllm/nccl.py` included, builds on these without importing the module that chooses between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from rollwise.clients.http_client import HttpClient


@dataclass
class SyncReport:
    """What one weight sync did (kept on the engine as `last_sync`, logged per step)."""

    version: int
    seconds: float
    route: str
    detail: dict[str, Any] = field(default_factory=dict)


class ServerSync(Protocol):
    """Sends HF-named weights (torch tensors or numpy arrays, on any device: each strategy moves them where it
    needs them) or a checkpoint directory to one server as `version`."""

    route: str

    def push(self, http: HttpClient, tensors: Mapping[str, Any], version: int, deadline_s: float) -> SyncReport: ...

    def push_dir(self, http: HttpClient, path: str, version: int, deadline_s: float) -> SyncReport: ...

    def close(self) -> None: ...
