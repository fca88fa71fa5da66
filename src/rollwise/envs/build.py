"""One constructor from the `env` config section to a ready environment: `make_env`.

`make_env(name, kwargs, reward=..., rewards=..., module=...)` imports the user's module first (so it can
register environments), builds the environment by name (`registry.get_env`), and, when the config names a
reward (`env.reward: "file.py:fn"` or `env.rewards: [{fn, weight}]`), puts it on the environment as
`RewardedEnv`: same tasks, scored by the user's reward, with `score_batch` so that `rewards.concurrent.score_many`
calls a TRL-style reward once per batch. Correctness for any reward is `rewards.base.is_correct(score,
env.pass_threshold)`.

With `environment` (`env.environment: "file.py:Class"`, or a dict of them by name), the tasks of `name` run as
episodes of the user's class (`envs.agent`), and the reward gets `environments=`; a class with `get_reward()` scores
its own episodes, so the reward is optional. `env.name: env_owned` gives such a class empty prompts its `reset`
fills (`envs.env_owned`).

On a registered multi-turn environment (`reset` / `step`) a configured reward replaces its `score_episode`
(`RewardedEpisodes`): it scores whole episodes and gets `environments=` (the episodes' states).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from rollwise.envs.base import Environment, EpisodeState, MultiTurnEnvironment, Reply, is_multi_turn
from rollwise.envs.registry import EnvSpecError, check_kwargs, factory_of, get_env, unknown_env_message
from rollwise.rewards.model_rewards import ModelPlaces
from rollwise.rewards.user import PartReward, import_user_module, make_reward
from rollwise.types import Score, Task


@dataclass
class RewardedEnv:
    """An environment's tasks scored by a user reward (`rewards.user`)."""

    env: Environment
    reward: PartReward

    @property
    def name(self) -> str:
        return self.env.name

    @property
    def charset(self) -> str | None:
        """The environment's characters (what the built-in model's tokenizer is made of), when it has them."""
        return getattr(self.env, "charset", None)

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return self.env.load(split=split, n=n, seed=seed)

    def score(self, task: Task, completion: str) -> Score:
        return self.reward(task, completion)

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[str],
                    completion_ids: Sequence[Sequence[int]] | None = None) -> list[Score]:
        return self.reward.score_batch(tasks, completions, completion_ids)


@dataclass
class RewardedEpisodes:
    """A registered multi-turn environment's episodes scored by a user reward instead of its own `score_episode`:
    one call per batch of episodes, with `completions` (each episode's policy turns and replies as one text, or
    assistant / user messages for a message-list prompt) and `environments=` (the episodes' states)."""

    env: MultiTurnEnvironment
    reward: PartReward

    @property
    def name(self) -> str:
        return self.env.name

    @property
    def stop(self) -> tuple[str, ...]:
        return tuple(getattr(self.env, "stop", ()))

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return self.env.load(split=split, n=n, seed=seed)

    def reset(self, task: Task) -> EpisodeState:
        return self.env.reset(task)

    def step(self, state: EpisodeState, completion: str) -> Reply | None:
        return self.env.step(state, completion)

    def teardown(self, state: EpisodeState) -> None:
        hook = getattr(self.env, "teardown", None)  # optional (`envs.multiturn` calls it once per episode)
        if callable(hook):
            hook(state)

    def score(self, task: Task, completion: str) -> Score:
        return self.reward(task, completion)

    def score_episodes(self, states: Sequence[EpisodeState]) -> list[Score]:
        def completion(st: EpisodeState) -> Any:
            texts = st.data.get("episode_texts", [])
            if isinstance(st.task.prompt, list):
                return [{"role": "assistant" if r == "policy" else "user", "content": t} for r, t in texts]
            return "".join(t for _, t in texts)

        return self.reward.score_batch([s.task for s in states], [completion(s) for s in states], None,
                                       extra={"environments": list(states)})


def remote_judge_engine(base_url: str, **kwargs: Any) -> Any:
    """A remote judge's engine (`clients.remote.RemoteEngine`): what `ModelPlaces.remote_engine` opens by default."""
    from rollwise.clients.remote import RemoteEngine

    return RemoteEngine(base_url, **kwargs)


def model_places(places: ModelPlaces | None = None) -> ModelPlaces:
    """`places` with the remote client filled in (the rewards below cannot import it themselves)."""
    places = places or ModelPlaces()
    return places if places.remote_engine is not None else replace(places, remote_engine=remote_judge_engine)


def check_env_section(name: str, kwargs: dict[str, Any] | None = None, module: str | None = None) -> None:
    """The `env` section's name and kwargs checked without building anything (so `rollwise train --print-config`
    fails on `env.kwargs: {digitz: 3}` with "did you mean 'digits'"): an unknown built-in name, an unknown or
    missing constructor argument. Names that only user code defines (`module:attr`, or a name `env.module`
    registers) are checked when they are built, by `registry.get_env`, with the same messages; their code is not
    imported here."""
    if ":" in name:
        return
    factory = factory_of(name)
    if factory is None:
        if module:  # env.module may register it
            return
        raise ValueError(f"env.name: {unknown_env_message(name)}")
    check_kwargs(factory, name, dict(kwargs or {}))


def make_env(name: str, kwargs: dict[str, Any] | None = None, *, reward: Any = None,
             rewards: Sequence[Any] | None = None, places: ModelPlaces | None = None,
             module: str | None = None, reward_timeout_s: float | None = 30.0, reward_workers: int = 8,
             environment: str | Callable[..., Any] | Mapping[str, Any] | None = None, environment_api: str = "tools", tool_timeout_s: float = 10.0,
             max_tool_calls: int = 4, turn_budget_s: float = 25.0, tool_isolation: str = "process") -> Environment:
    """The environment the `env` config section describes (see the module docstring).

    name/kwargs: `env.name` / `env.kwargs`; reward/rewards: `env.reward` / `env.rewards` (a judge or reward model
    among them: `rewards.model_rewards`, whose 'builtin:tiny' `places` locates); module: `env.module`
    ("pkg.mod", "path/to/file.py", or "file.py:attr"); reward_timeout_s: the most seconds one reward call may
    take (a TRL-style batch call counts as one call); reward_workers: concurrent per-sample reward calls;
    environment / environment_api: `env.environment` ("file.py:Class", or the class itself) and how it is used ("tools" or "gym",
    `envs.agent`), its episodes over the tasks of `name`; tool_timeout_s, max_tool_calls, turn_budget_s: a tool
    class's limits per call and per turn; tool_isolation: where its calls run ("process" or "thread").
    """
    if module:
        if ":" in module:
            from rollwise.rewards.user import load_object

            load_object(module)
        else:
            import_user_module(module)
    env = get_env(name, **(kwargs or {}))
    try:
        scorer = make_reward(reward, rewards, timeout_s=reward_timeout_s, max_workers=reward_workers,
                             places=model_places(places))
    except TypeError as e:  # not callable, or a signature neither convention fits: the config's mistake
        raise EnvSpecError(f"env.reward{'s' if rewards else ''}: {e}") from e
    if name == "env_owned" and not environment:
        raise ValueError("env.name=env_owned has no prompts of its own: set env.environment to a tool class whose "
                         "reset() returns each episode's prompt")
    if environment:
        from rollwise.envs.agent import make_class_env
        from rollwise.envs.dataset import DatasetEnv

        if isinstance(env, DatasetEnv):  # the class reads every column (reset(**row)), not just the prompt
            env.compare_whole_rows()
        return make_class_env(env, environment, environment_api, scorer, tool_timeout_s=tool_timeout_s,
                              max_calls=max_tool_calls, turn_budget_s=turn_budget_s, isolation=tool_isolation)
    if scorer is None:
        if name == "dataset":
            raise ValueError("env.name=dataset has no reward of its own: set env.reward (\"file.py:fn\" or "
                             "\"module:fn\") or env.rewards")
        return env
    if is_multi_turn(env):
        return RewardedEpisodes(env, scorer)  # multi-turn: the user's reward scores whole episodes
    return RewardedEnv(env, scorer)
