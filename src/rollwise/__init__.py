"""rollwise: the rollout layer of RL post-training for language models.

`from rollwise import LLM, SamplingParams` is the public entry to the engine. The engine (and torch) is
imported lazily so that `rollwise --help` and torch-free modules stay fast to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollwise.types import CompletionOutput, RequestOutput, SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.engine.llm import LLM


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from rollwise.engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'rollwise' has no attribute {name!r}")
