"""rollwise.envs: environments (typed tasks + scoring), the multi-turn runner, and the registry.

`get_env("arithmetic" | "countdown" | "dataset" | "gsm8k" | "humaneval" | "mbpp" | "tool_calc" | "mod:attr" | "file.py:attr", **kw)`.
"""

from rollwise.envs.base import Environment, EpisodeState, MultiTurnEnvironment, Task
from rollwise.envs.registry import (
    BUILTIN_ENVS,
    get_env,
    list_envs,
    load_object,
    load_reward_fn,
    register_env,
    with_reward,
)

__all__ = [
    "Environment", "EpisodeState", "MultiTurnEnvironment", "Task", "BUILTIN_ENVS", "get_env", "list_envs",
    "load_object", "load_reward_fn", "register_env", "with_reward",
]
