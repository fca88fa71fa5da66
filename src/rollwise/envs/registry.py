"""Environment registry: built-in names, user registrations, and "module:attr" / "file.py:attr" specs.

A plain dict of name -> factory (STYLE 7). Built-ins are imported lazily so asking for "arithmetic" does
not import the sandbox or math-verify. A config may name user code as `"mypkg.mymod:MyEnv"` or
`"path/to/file.py:make_env"`; a class or factory is called with the keyword arguments, an instance is used
as is. Reward functions load the same way (`load_reward_fn`) and `with_reward` puts one on an environment.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rollwise.envs.base import Environment, Task
from rollwise.types import Score

BUILTIN_ENVS: dict[str, str] = {
    "arithmetic": "rollwise.envs.arithmetic:ArithmeticEnv",
    "countdown": "rollwise.envs.countdown:CountdownEnv",
    "dataset": "rollwise.envs.dataset:DatasetEnv",
    "gsm8k": "rollwise.envs.gsm8k:GSM8KEnv",
    "humaneval": "rollwise.envs.humaneval:HumanEvalEnv",
    "mbpp": "rollwise.envs.mbpp:MBPPEnv",
    "tool_calc": "rollwise.envs.tool_calc:ToolCalcEnv",
}
_REGISTRY: dict[str, Callable[..., Any]] = {}


def register_env(name: str, factory: Callable[..., Any], overwrite: bool = False) -> None:
    """Make `get_env(name, **kw)` call `factory(**kw)`. Refuses to shadow a name unless `overwrite`."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"environment names are non-empty strings without ':', got {name!r}")
    if not overwrite and (name in _REGISTRY or name in BUILTIN_ENVS):
        raise ValueError(f"environment {name!r} is already registered (pass overwrite=True to replace it)")
    _REGISTRY[name] = factory


def list_envs() -> list[str]:
    return sorted(set(BUILTIN_ENVS) | set(_REGISTRY))


def load_object(spec: str) -> Any:
    """Resolve "package.module:attr" or "path/to/file.py:attr" (attr may be dotted)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"expected 'module:attr' or 'file.py:attr', got {spec!r}")
    mod_part, _, attr = spec.rpartition(":")
    if not mod_part or not attr:
        raise ValueError(f"expected 'module:attr' or 'file.py:attr', got {spec!r}")
    if mod_part.endswith(".py") or "/" in mod_part:
        path = Path(mod_part)
        if not path.is_file():
            raise FileNotFoundError(f"{spec!r}: file {mod_part!r} not found")
        mod_name = f"rollwise_user_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"{spec!r}: cannot import {mod_part!r} as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(mod_part)
        except ModuleNotFoundError as e:
            raise ValueError(f"{spec!r}: cannot import module {mod_part!r} ({e})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{spec!r}: {mod_part!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _check_env(env: Any, name: str) -> Environment:
    missing = [m for m in ("name", "load", "score") if not hasattr(env, m)]
    if missing:
        raise TypeError(f"environment {name!r} lacks {', '.join(missing)} (see rollwise.envs.base.Environment)")
    return env


def _construct(factory: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Environment:
    try:
        env = factory(**kwargs)
    except TypeError as e:  # wrong keyword arguments, or not a factory at all
        raise TypeError(f"environment {name!r}: cannot construct it with arguments {sorted(kwargs)}: {e}") from None
    return _check_env(env, name)


def get_env(name: str, **kwargs: Any) -> Environment:
    """A built-in or registered environment by name, or user code by "module:attr" / "file.py:attr"."""
    if name in _REGISTRY:
        return _construct(_REGISTRY[name], name, kwargs)
    if name in BUILTIN_ENVS:
        return _construct(load_object(BUILTIN_ENVS[name]), name, kwargs)
    if ":" in name:
        obj = load_object(name)
        if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "score")):
            return _construct(obj, name, kwargs)
        if kwargs:
            raise ValueError(f"{name!r} is an environment instance; it takes no arguments, got {sorted(kwargs)}")
        return _check_env(obj, name)
    raise ValueError(f"unknown environment {name!r}; known: {', '.join(list_envs())}, or 'module:attr' / 'file.py:attr'")


def load_reward_fn(spec: str) -> Callable[[Task, str], Any]:
    """A user reward function `fn(task, completion) -> Score | float` named by "module:attr" / "file.py:attr"."""
    fn = load_object(spec)
    if not callable(fn):
        raise TypeError(f"reward function {spec!r} is a {type(fn).__name__}, not callable")
    return fn


@dataclass
class WithReward:
    """An environment's tasks scored by another reward function (e.g. one named in the config)."""

    env: Any
    reward: Callable[[Task, str], Any]

    @property
    def name(self) -> str:
        return f"{self.env.name}+{getattr(self.reward, '__name__', type(self.reward).__name__)}"

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return self.env.load(split=split, n=n, seed=seed)

    def score(self, task: Task, completion: str) -> Score:
        from rollwise.rewards.base import as_score

        return as_score(self.reward(task, completion), where=self.name)


def with_reward(env: Any, reward: Callable[[Task, str], Any] | str) -> WithReward:
    """`env` with its score replaced by `reward` (a callable or a "module:attr" spec)."""
    return WithReward(env, load_reward_fn(reward) if isinstance(reward, str) else reward)
