"""rollwise.envs: environments (typed tasks + scoring), the multi-turn runner, and the registry.

`make_env(name, kwargs, reward=, rewards=, module=)` builds what the `env` config section describes (with a user reward).
`get_env("arithmetic" | "countdown" | "dataset" | "env_owned" | "gsm8k" | "humaneval" | "mbpp" | "tool_calc" | "mod:attr" | "file.py:attr", **kw)`.
"""

from rollwise.envs.base import Environment, EpisodeState, MultiTurnEnvironment, Task
from rollwise.envs.build import RewardedEnv, make_env
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
    "load_object", "load_reward_fn", "make_env", "register_env", "RewardedEnv", "with_reward",
]
