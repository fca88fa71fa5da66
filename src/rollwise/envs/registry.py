"""Environment registry: built-in names, user registrations, and "module:attr" / "file.py:attr" specs.

A plain dict of name -> factory (STYLE 7). Built-ins are imported lazily so asking for "arithmetic" does
not import the sandbox or math-verify. A config may name user code as `"mypkg.mymod:MyEnv"` or
`"path/to/file.py:make_env"`; a class or factory is called with the keyword arguments, an instance is used
as is. Reward functions load the same way (`load_reward_fn`) and `with_reward` puts one on an environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from rollwise.envs.base import Environment, Task
from rollwise.rewards.user import load_object  # noqa: F401 - re-exported: envs and rewards load user code alike
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
    """`env` with its score replaced by `reward` (a callable or a "module:attr" spec). A TRL-style batch function
    is wrapped so it is called per sample here; `envs.build.make_env` batches it instead."""
    from rollwise.rewards.user import load_reward, reward_kind

    fn = load_reward_fn(reward) if isinstance(reward, str) else reward
    if reward_kind(fn) == "batch":
        fn = load_reward(fn)
    return WithReward(env, fn)
