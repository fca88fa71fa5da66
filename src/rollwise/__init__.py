"""rollwise: the rollout layer of RL post-training for language models.

`from rollwise import LLM, SamplingParams` is the public entry to the engine; `rollwise.train(config, **overrides)`
runs RL training from Python and returns a `rollwise.TrainResult` (`rollwise.api`, docs/python-api.md). The engine
(and torch) is imported lazily so that `rollwise --help` and torch-free modules stay fast to import.

`rollwise.train` is also the name of the trainer's package (`rollwise.train.trainer`, ...): the package module is
made callable, so `rollwise.train(...)` runs `rollwise.api.train` and `rollwise.train.trainer` stays the module.
"""

from __future__ import annotations

import sys
from types import ModuleType as _ModuleType
from typing import TYPE_CHECKING, Any

from rollwise.omp_env import apply_omp_defaults
from rollwise.types import CompletionOutput, RequestOutput, SamplingParams

apply_omp_defaults()  # before anything loads torch: OpenMP reads its environment once (rollwise/omp_env.py)

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "TrainResult", "train", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.api import TrainResult, train
    from rollwise.engine.llm import LLM


class _TrainPackage(_ModuleType):
    """The `rollwise.train` package, callable as `rollwise.api.train`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from rollwise.api import train as api_train

        return api_train(*args, **kwargs)


class _Rollwise(_ModuleType):
    """The root package: whenever the `rollwise.train` package is bound on it (the import system does so when the
    package is first imported), it becomes callable."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "train" and type(value) is _ModuleType:
            value.__class__ = _TrainPackage
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Rollwise


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from rollwise.engine.llm import LLM

        return LLM
    if name == "train":
        import rollwise.train as package  # cheap: the package imports nothing; binding it makes it callable

        return sys.modules[__name__].__dict__.get("train", package)
    if name == "TrainResult":
        from rollwise.api import TrainResult

        return TrainResult
    raise AttributeError(f"module 'rollwise' has no attribute {name!r}")
