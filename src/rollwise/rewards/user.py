"""User reward functions, named in the config as "path/to/file.py:fn" or "module:fn" (or, through the Python API
`rollwise.train`, passed as the function itself: `load_reward` takes a callable).

Two calling conventions are recognised from the function's signature:
- TRL's, unchanged: `fn(prompts=..., completions=..., completion_ids=..., **columns) -> list[float | None]`,
  called once on a whole batch (a signature naming `completions`, or taking only `**kwargs`). `prompts` are
  the tasks' prompts as written (text or message lists); `completions` are strings, or
  `[{"role": "assistant", "content": text}]` where the prompt was a message list (as TRL does for
  conversational data); `completion_ids` the sampled token ids when the caller has them; every
  `Task.metadata` key is passed as a list (the dataset's other columns), and `answer` too when the metadata
  has no such key. A function without `**kwargs` gets only the arguments it names. On multi-turn environment
  classes (`envs.agent`) it also gets `environments=`, the episodes' objects.
- rollwise's per-sample `fn(task, completion) -> Score | float`, called concurrently (`score_many`).

Failures are data, never a silent 0: a `None` for a sample, a NaN, an exception, a call that runs past its
timeout, or a list of the wrong length all give errored `Score`s whose `error` says why (an exception: its class,
message and the file:line of the user's code it was raised at, `rewards.base.describe_at`).

`make_reward(reward=..., rewards=[{fn, weight, name?}, ...])` builds one scorer: a single `UserReward`, or
`RewardSum`, a weighted sum whose `Score.parts` keep each part's own value (an errored part makes the sum
errored, naming the part). `env.reward` or an item of `env.rewards` may name a model instead of a function (`judge`,
`reward_model`: `rewards.model_rewards`); it has the same shape (`PartReward`). Both offer `score_batch(tasks, completions, completion_ids=None)` (what
`rewards.concurrent.score_many` calls when present) and the per-sample `(task, completion) -> Score`.

Objects loaded from a spec pickle by their spec (re-imported on unpickling), so they cross to Ray actors.

An `async def` reward (either convention) is awaited in the thread that calls it (`asyncio.run`), as TRL awaits its
async reward functions.

Deliberately left out: TRL's `trainer_state` (passed as None when a function names it), and killing a hung call (a thread cannot be killed: it is abandoned, see `rewards.concurrent`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import math
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, Union

from rollwise.rewards.base import as_score, describe, describe_at, finite_number
from rollwise.rewards.cached import add_counts
from rollwise.types import Score, Task

if TYPE_CHECKING:  # pragma: no cover
    from rollwise.rewards.model_rewards import ModelPlaces, ModelReward

RESERVED = ("prompts", "completions", "completion_ids")


def _awaited(value: Any) -> Any:
    """An async reward's result: its coroutine run to the end in this thread, or in a thread of its own when this
    one already runs an event loop (a notebook)."""
    if not inspect.iscoroutine(value):
        return value
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(value)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = asyncio.run(value)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["err"] = e

    th = threading.Thread(target=run, daemon=True, name="reward-async")
    th.start()
    th.join()
    if "err" in box:
        raise box["err"]
    return box["out"]


# ------------------------------------------------------------------------------------------- loading
def _import_file(path: Path, spec: str) -> Any:
    mod_name = f"rollwise_user_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{spec!r}: cannot import {str(path)!r} as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file failed to run: one line naming it
        sys.modules.pop(mod_name, None)
        raise ValueError(f"{spec!r}: importing {str(path)!r} failed: {describe(e)}") from None
    return module


def import_user_module(spec: str) -> Any:
    """Import "package.module" or run "path/to/file.py" (so it can register environments); returns the module."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"expected a module name or a .py file, got {spec!r}")
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"module file {spec!r} not found")
        return _import_file(path, spec)
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        raise ValueError(f"cannot import module {spec!r} ({e})") from None


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
        module = _import_file(path, spec)
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


def reward_kind(fn: Any, label: str = "reward function") -> str:
    """'batch' (TRL's convention) or 'sample' (rollwise's `fn(task, completion)`), from the signature."""
    if hasattr(fn, "score") and callable(fn.score):
        return "sample"  # an environment-like object: its score(task, completion)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return "sample"  # builtins without a signature: assume the per-sample form
    names = {p.name for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    if "completions" in names or (var_kw and not positional and not var_pos):
        return "batch"
    if (len(positional) >= 2 or var_pos) and len(required) <= 2:
        return "sample"
    raise TypeError(f"{label}: signature {inspect.signature(fn)} matches neither TRL's "
                    "fn(prompts, completions, **kwargs) nor rollwise's fn(task, completion)")


# ------------------------------------------------------------------------------------------- one reward
def _number_score(value: Any, name: str, index: int) -> Score:
    """Sample `index`'s value from a batch reward; never raises, so a bad value errors its own sample only."""
    if value is None:
        return Score(0.0, error=f"{name} returned None for sample {index} (no reward)")
    if isinstance(value, Score):
        return as_score(value, where=name)
    got = finite_number(value)
    if isinstance(got, float):
        return Score(got, parts={name: got})
    if isinstance(value, (bool, int, float)) or hasattr(value, "item"):
        return Score(0.0, error=f"{name} returned {got} for sample {index}")
    return Score(0.0, error=f"{name} returned {type(value).__name__} for sample {index}, expected a number or None")


def trl_arguments(tasks: Sequence[Task], completions: Sequence[str],
                  completion_ids: Sequence[Sequence[int]] | None) -> dict[str, Any]:
    """The keyword arguments TRL passes a reward function, built from rollwise tasks."""
    kw: dict[str, Any] = {
        "prompts": [t.prompt for t in tasks],
        "completions": [c if isinstance(c, list) else [{"role": "assistant", "content": c}]
                        if isinstance(t.prompt, list) else c for t, c in zip(tasks, completions)],
    }
    if completion_ids is not None:
        kw["completion_ids"] = [list(ids) for ids in completion_ids]
    keys: dict[str, None] = {}
    for t in tasks:
        keys.update(dict.fromkeys(t.metadata))
    for k in keys:
        if k not in RESERVED:
            kw[k] = [t.metadata.get(k) for t in tasks]
    if "answer" not in kw and any(t.answer is not None for t in tasks):
        kw["answer"] = [t.answer for t in tasks]
    return kw


@dataclass
class UserReward:
    """One reward function with its calling convention, timeout and name (see the module docstring)."""

    fn: Callable[..., Any]
    name: str
    kind: str = "sample"
    """'batch' (TRL: one call per batch) or 'sample' (fn(task, completion), concurrent)."""
    timeout_s: float | None = 30.0
    """Most seconds one call may take (a batch call counts as one call)."""
    max_workers: int = 8
    """Concurrent calls of a per-sample function."""
    spec: str | None = None
    """Where `fn` was loaded from; pickling re-imports it from here."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.spec is not None:
            state["fn"] = None  # functions from a .py file cannot be pickled by reference: re-import instead
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.fn is None and self.spec is not None:
            self.fn = _instantiate(load_object(self.spec))

    # -- per-sample ---------------------------------------------------------------------------------
    def _call_sample(self, task: Task, completion: str) -> Score:
        scorer = self.fn.score if hasattr(self.fn, "score") else self.fn
        s = as_score(_awaited(scorer(task, completion)), where=self.name)
        if not s.parts and not s.error:
            s = Score(s.value, parts={self.name: s.value}, info=s.info)
        return s

    def __call__(self, task: Task, completion: str) -> Score:
        if self.kind == "batch":
            return self.score_batch([task], [completion])[0]
        try:
            return self._call_sample(task, completion)
        except Exception as e:  # noqa: BLE001 - an errored score, never a silent zero
            return Score(0.0, error=f"{self.name}: {describe_at(e)}")

    # -- batch --------------------------------------------------------------------------------------
    def _kwargs_for(self, kw: dict[str, Any]) -> dict[str, Any]:
        params = inspect.signature(self.fn).parameters
        if "trainer_state" in params:
            kw = {**kw, "trainer_state": None}
        if any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return kw
        return {k: v for k, v in kw.items() if k in params}

    def _call_batch(self, tasks: Sequence[Task], completions: Sequence[Any],
                    completion_ids: Sequence[Sequence[int]] | None, extra: dict[str, list[Any]] | None = None
                    ) -> list[Score]:
        n = len(tasks)

        def errored(reason: str) -> list[Score]:
            return [Score(0.0, error=f"{self.name}: {reason}") for _ in range(n)]

        try:
            kw = self._kwargs_for({**trl_arguments(tasks, completions, completion_ids), **(extra or {})})
        except Exception as e:  # noqa: BLE001
            return errored(describe_at(e))
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["out"] = _awaited(self.fn(**kw))
            except BaseException as e:  # noqa: BLE001 - reported below as errored scores
                box["err"] = e

        th = threading.Thread(target=target, daemon=True, name=f"reward-{self.name}")
        th.start()
        th.join(self.timeout_s)
        if th.is_alive():
            return errored(f"timed out after {self.timeout_s:g}s")  # the thread is abandoned (cannot be killed)
        if "err" in box:
            return errored(describe_at(box["err"]))
        out = box.get("out")
        try:
            if hasattr(out, "tolist") and callable(out.tolist):
                out = out.tolist()
        except Exception as e:  # noqa: BLE001 - a hostile or broken array: the whole answer is unreadable
            return errored(f"returned {type(out).__name__} that cannot be read as a list ({describe_at(e)})")
        if not isinstance(out, (list, tuple)):
            return errored(f"returned {type(out).__name__}, expected a list of {n} floats (or None)")
        if len(out) != n:
            return errored(f"returned {len(out)} values for {n} completions")
        return [_number_score(v, self.name, i) for i, v in enumerate(out)]

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[Any],
                    completion_ids: Sequence[Sequence[int]] | None = None, *,
                    extra: dict[str, list[Any]] | None = None) -> list[Score]:
        """Scores of `completions[i]` for `tasks[i]`, in order; never raises. `extra`: more per-sample keyword
        lists for a TRL-style function (multi-turn environments pass `environments`)."""
        if len(tasks) != len(completions):
            raise ValueError(f"score_batch: {len(tasks)} tasks for {len(completions)} completions")
        if not tasks:
            return []
        if self.kind == "batch":
            return self._call_batch(tasks, completions, completion_ids, extra)
        from rollwise.rewards.concurrent import score_many

        def per_sample(task: Task, completion: str) -> Score:
            return self._call_sample(task, completion)

        per_sample.__name__ = self.name
        scores = score_many(per_sample, list(zip(tasks, completions)), max_workers=self.max_workers, timeout_s=self.timeout_s)
        return [s if s.error is None or s.error.startswith(f"{self.name}:") else Score(s.value, s.parts, f"{self.name}: {s.error}", s.info)
                for s in scores]


# ------------------------------------------------------------------------------------------- weighted sum
class PartReward(Protocol):
    """What a part of a weighted sum offers: a `UserReward`, or a judge / reward model (`rewards.model_rewards`)."""

    name: str

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[Any],
                    completion_ids: Sequence[Sequence[int]] | None = None, *,
                    extra: dict[str, list[Any]] | None = None) -> list[Score]: ...

    def __call__(self, task: Task, completion: str) -> Score: ...


@dataclass
class RewardSum:
    """`value = sum(weight_i * part_i)`; `parts` keeps each part's value by name; an errored part errors the sum."""

    parts: list[tuple[str, PartReward, float]]
    name: str = "rewards"

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("rewards: need at least one {fn, weight}")
        names = [p[0] for p in self.parts]
        if len(set(names)) != len(names):
            raise ValueError(f"rewards: part names must be unique, got {names} (give each a 'name')")

    def score_batch(self, tasks: Sequence[Task], completions: Sequence[Any],
                    completion_ids: Sequence[Sequence[int]] | None = None, *,
                    extra: dict[str, list[Any]] | None = None) -> list[Score]:
        per_part = [r.score_batch(tasks, completions, completion_ids, extra=extra) for _, r, _ in self.parts]
        out = []
        for i in range(len(tasks)):
            total, parts, errors, info = 0.0, {}, [], {}
            for (name, _, weight), scores in zip(self.parts, per_part):
                s = scores[i]
                parts[name] = s.value
                if s.info:
                    info[name] = s.info
                    add_counts(info, s.info)  # judge calls / cache hits add up across parts
                if s.error:
                    errors.append(s.error if s.error.startswith(f"{name}:") else f"{name}: {s.error}")
                else:
                    total += weight * s.value
            if not errors and not math.isfinite(total):  # finite parts whose weighted sum overflows
                errors.append(f"the weighted sum of the parts is {total!r}")
                total = 0.0
            out.append(Score(total, parts=parts, error="; ".join(errors) or None, info=info))
        return out

    def __call__(self, task: Task, completion: str) -> Score:
        return self.score_batch([task], [completion])[0]


# ------------------------------------------------------------------------------------------- construction
def _instantiate(obj: Any) -> Any:
    """A class named as a reward is constructed with no arguments (e.g. "rollwise.rewards.match:ExactMatch")."""
    return obj() if isinstance(obj, type) else obj


def load_reward(spec: str | Callable[..., Any], *, name: str | None = None, timeout_s: float | None = 30.0,
                max_workers: int = 8) -> UserReward:
    """A `UserReward` from "file.py:fn" / "module:fn" or a callable; the calling convention is detected once here."""
    if isinstance(spec, str):
        fn = _instantiate(load_object(spec))
        label = spec
    else:
        fn, label = spec, getattr(spec, "__name__", type(spec).__name__)
    if not callable(fn) and not hasattr(fn, "score"):
        raise TypeError(f"reward {label!r} is a {type(fn).__name__}, not callable")
    kind = reward_kind(fn, label=f"reward {label!r}")
    nm = name or getattr(fn, "__name__", None) or getattr(fn, "name", None) or type(fn).__name__
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"reward timeout must be positive or None, got {timeout_s}")
    return UserReward(fn=fn, name=str(nm), kind=kind, timeout_s=timeout_s, max_workers=max_workers,
                      spec=spec if isinstance(spec, str) else None)


Reward = Union[UserReward, RewardSum, "ModelReward"]
"""What `make_reward` builds: one user reward, a weighted sum, or a judge / reward model."""


def _model_reward(reward: Any, places: ModelPlaces | None) -> ModelReward | None:
    """`env.reward` as a judge or reward model (`rollwise.config_rewards.ModelRewardConfig`, or its dict), or None."""
    from rollwise.config_rewards import MODEL_KINDS, ModelRewardConfig

    if isinstance(reward, dict) and any(k in reward for k in MODEL_KINDS):
        reward = ModelRewardConfig.model_validate(reward)
    if not isinstance(reward, ModelRewardConfig):
        return None
    from rollwise.rewards.model_rewards import make_model_reward

    kind = "judge" if reward.judge is not None else "reward_model"
    section = reward.judge if reward.judge is not None else reward.reward_model
    assert section is not None
    return make_model_reward(kind, section, name=reward.name, where="env.reward", places=places)


def make_reward(reward: Any = None, rewards: Sequence[Any] | None = None, *,
                timeout_s: float | None = 30.0, max_workers: int = 8,
                places: ModelPlaces | None = None) -> Reward | None:
    """The scorer for `env.reward` or `env.rewards` (None when neither is set). `reward` is a spec, a callable, or a
    judge / reward model config; `places` says where a judge's 'builtin:tiny' is (`rewards.model_rewards`)."""
    from rollwise.config_rewards import MODEL_KINDS, check_reward_item

    if reward is not None and rewards:
        raise ValueError("set env.reward or env.rewards, not both")
    if reward is not None:
        judged = _model_reward(reward, places)
        if judged is not None:
            return judged
        return load_reward(reward, timeout_s=timeout_s, max_workers=max_workers)
    if not rewards:
        return None
    parts: list[tuple[str, PartReward, float]] = []
    for i, item in enumerate(rewards):
        kinds = [k for k in MODEL_KINDS if isinstance(item, dict) and k in item]
        if not isinstance(item, dict) or ("fn" not in item and not kinds):
            raise ValueError(f"env.rewards[{i}] must be an object with 'fn' (or 'judge' / 'reward_model'; and "
                             f"optional 'weight', 'name'), got {item!r}")
        if kinds:
            item = check_reward_item(item, i)
        else:
            extra = set(item) - {"fn", "weight", "name"}
            if extra:
                raise ValueError(f"env.rewards[{i}]: unknown keys {sorted(extra)} (allowed: fn, weight, name)")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"env.rewards[{i}].weight must be a number, got {weight!r}")
        r: PartReward
        if kinds:
            from rollwise.rewards.model_rewards import make_model_reward

            r = make_model_reward(kinds[0], item[kinds[0]], name=item.get("name"), where=f"env.rewards[{i}]",
                                  places=places)
        else:
            r = load_reward(item["fn"], name=item.get("name"), timeout_s=timeout_s, max_workers=max_workers)
        if item.get("name") is None and r.name in {p[0] for p in parts}:
            r.name = f"{r.name}_{i}"
        parts.append((r.name, r, float(weight)))
    return RewardSum(parts)


__all__ = ["PartReward", "Reward", "RewardSum", "UserReward", "import_user_module", "load_object", "load_reward", "make_reward",
           "reward_kind", "trl_arguments"]
