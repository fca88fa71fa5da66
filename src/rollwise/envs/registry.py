"""Environment registry: built-in names, user registrations, and "module:attr" / "file.py:attr" specs.

A plain dict of name -> factory (STYLE 7). Built-ins are imported lazily so asking for "arithmetic" does
not import the sandbox or math-verify. A config may name user code as `"mypkg.mymod:MyEnv"` or
`"path/to/file.py:make_env"`; a class or factory is called with the keyword arguments, an instance is used
as is. Reward functions load the same way (`load_reward_fn`) and `with_reward` puts one on an environment.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from rollwise.envs.base import Environment, Task
from rollwise.rewards.user import load_object  # noqa: F401 - re-exported: envs and rewards load user code alike
from rollwise.types import Score

BUILTIN_ENVS: dict[str, str] = {
    "arithmetic": "rollwise.envs.arithmetic:ArithmeticEnv",
    "countdown": "rollwise.envs.countdown:CountdownEnv",
    "dataset": "rollwise.envs.dataset:DatasetEnv",
    "env_owned": "rollwise.envs.env_owned:EnvOwnedTasks",
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


class EnvSpecError(TypeError, ValueError):
    """An environment name, factory or argument that cannot work. A TypeError, as Python's own call would raise,
    and a ValueError: a bad config value, reported by the CLI as one line."""


def _check_env(env: Any, name: str) -> Environment:
    missing = [m for m in ("name", "load", "score") if not hasattr(env, m)]
    if missing:
        raise EnvSpecError(f"environment {name!r} lacks {', '.join(missing)} (see rollwise.envs.base.Environment)")
    return env


def check_kwargs(factory: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> None:
    """EnvSpecError, one line, when `factory(**kwargs)` could not bind: the first unknown argument (with the
    closest real one, e.g. 'digitz' -> 'digits') or a missing required one. Read from the factory's signature,
    so nothing is constructed; a factory taking **kwargs accepts any name."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: left to the call itself
        return
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    head = f"environment {name!r}: cannot construct it with arguments {sorted(kwargs)}"
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        for key in kwargs:
            if key not in named:
                near = difflib.get_close_matches(str(key), named, n=1, cutoff=0.6)
                hint = f" (did you mean env.kwargs.{near[0]}?)" if near else ""
                takes = ", ".join(named) if named else "none"
                raise EnvSpecError(f"{head}: unknown env.kwargs.{key}{hint}; its arguments: {takes}")
    missing = [n for n in named if params[n].default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise EnvSpecError(f"{head}: it needs env.kwargs.{missing[0]}"
                           + (f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""))


def factory_of(name: str) -> Callable[..., Any] | None:
    """The factory a built-in or registered name stands for (imports only that environment's module), or None
    for anything else ("module:attr" user code, an unknown name)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name in BUILTIN_ENVS:
        return load_object(BUILTIN_ENVS[name])
    return None


def _construct(factory: Callable[..., Any], name: str, kwargs: dict[str, Any]) -> Environment:
    check_kwargs(factory, name, kwargs)
    try:
        env = factory(**kwargs)
    except TypeError as e:  # a value of the wrong type, or not a factory at all
        raise EnvSpecError(f"environment {name!r}: cannot construct it with arguments {sorted(kwargs)}: {e}") from e
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
            raise EnvSpecError(f"{name!r} is an environment instance; it takes no arguments, got {sorted(kwargs)}")
        return _check_env(obj, name)
    raise ValueError(unknown_env_message(name))


def unknown_env_message(name: str) -> str:
    near = difflib.get_close_matches(name, list_envs(), n=1, cutoff=0.6)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"unknown environment {name!r}{hint}; known: {', '.join(list_envs())}, or 'module:attr' / 'file.py:attr'"


def load_reward_fn(spec: str) -> Callable[[Task, str], Any]:
    """A user reward function `fn(task, completion) -> Score | float` named by "module:attr" / "file.py:attr"."""
    fn = load_object(spec)
    if not callable(fn):
        raise EnvSpecError(f"reward function {spec!r} is a {type(fn).__name__}, not callable")
    return fn


@dataclass
class WithReward:
    """An environment's tasks scored by another reward function (e.g. one named in the config)."""

    env: Environment
    reward: Callable[[Task, str], Any]

    @property
    def name(self) -> str:
        return f"{self.env.name}+{getattr(self.reward, '__name__', type(self.reward).__name__)}"

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return self.env.load(split=split, n=n, seed=seed)

    def score(self, task: Task, completion: str) -> Score:
        from rollwise.rewards.base import as_score

        return as_score(self.reward(task, completion), where=self.name)


def with_reward(env: Environment, reward: Callable[[Task, str], Any] | str) -> WithReward:
    """`env` with its score replaced by `reward` (a callable or a "module:attr" spec). A TRL-style batch function
    is wrapped so it is called per sample here; `envs.build.make_env` batches it instead."""
    from rollwise.rewards.user import load_reward, reward_kind

    fn = load_reward_fn(reward) if isinstance(reward, str) else reward
    if reward_kind(fn) == "batch":
        fn = load_reward(fn)
    return WithReward(env, fn)
