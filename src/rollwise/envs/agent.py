"""Environment classes as users write them: a tool class (TRL's `environment_factory` shape) or a gym-style class.

The config names the class, and how it is named decides how it is used, never its method names (a tool may well
be called `step`):

    env:
      name: dataset                                  # the data, as for any environment (env_owned: reset() makes it)
      kwargs: {path: data/train.jsonl, test_path: data/test.jsonl}
      environment: recipes/tools/calculator_env.py:CalculatorEnv     # or "module:Class", or {name: spec, ...}
      environment_api: tools                         # (default) or gym
      reward: recipes/tools/reward.py:correct        # fn(completions, environments, **columns); optional with get_reward

`environment_api: tools` (`ToolEnv`) follows TRL 1.16's GRPOTrainer. Instances are built once (`Class()`, or any
zero-argument factory), pooled, and reset for each episode: `reset(**row)` gets the dataset row (the prompt under
`prompt`, every other column by name, nested values as they are; a `reset` without `**kwargs` gets the names it
takes). A string `reset` returns is appended to the last user message as it is. The tools are the public functions
of the class (`inspect.isfunction` on the class, as TRL: inherited, static and async ones included; class methods,
properties and callable attributes not) other than `reset` and `get_reward`; each one's name, description and
JSON-schema parameters come from its signature and docstring (`transformers.utils.get_json_schema`: type hints and a
Google style `Args:` section are required, and a class whose tool lacks them fails at start naming it). An optional
`get_reward()` (sync or async) scores the episode from the instance's state: a reward of weight 1 named after the
class, summed with `env.reward`, which it makes optional. With a dict of classes, each row's `environment` column
picks its class, only that class's tools are offered in its prompt (`tool_sets`, `environment_of`), and the column is
not passed to `reset`. The model calls tools in the format of `models.tool_calls` (through the chat template when it
renders tools); each result comes back as a `tool` turn. A turn without a call ends the episode. Rewards get
`environments=` (the episode objects, in the same order as `completions`), as TRL passes them.

Every bad call is an observation for the model, never a crashed run: malformed JSON (nested past
`models.tool_calls.MAX_CALL_DEPTH` included), an unknown tool, missing, unknown or wrongly typed arguments, more than
`max_calls` calls in a turn, calls past the turn's time (`turn_budget_s`), a result longer than `max_result_chars`
(cut). A tool that raises, runs past `tool_timeout_s`, or returns what cannot become text (an int past Python's
digit limit, an object whose `str()` raises) ends its episode errored with that reason: the sample is scored with
`algo.errored_reward` and trained on like a wrong answer (TRL instead shows the exception to the model and goes on).
Each episode's `tool_calls`, `tool_errors`, the first failed call (`tool_error`) and `turns` land in its rollout's
`env_info`; the step's means in metrics.jsonl. A `get_reward` that raises, runs past `tool_timeout_s` or returns None
errors that episode's score (`algo.errored_reward` then decides what it counts as).

Tools run where they can be stopped (`ToolEnv.isolation`, "process" by default): each episode's instance is reset
here, then forked into a child process of its own (`envs.tool_process`) where its calls and its `get_reward` run; a
call past its time kills the child at once, even one whose C call holds the GIL. When the episode ends, the
instance's attributes come back onto the same object, for `environments=`. So class attributes and module globals a
tool changes stay in the episode's process, as they would on another machine. A class whose instances' attributes
cannot be pickled runs its tools in threads instead (a warning at start says so; a call past its time is then
abandoned, still running, and its instance leaves the pool).

`environment_api: gym` (`GymEnv`): `reset()` (or `reset(**row)` when it takes the row's names or `**kwargs`)
returns the first observation (or `(observation, info)`), appended to the last user turn; `step(action_text)` returns
`(observation, reward, done, info)` or gymnasium's `(observation, reward, terminated, truncated, info)`.
Each observation becomes the next user turn; `done` ends the episode. The episode's reward is the sum of the step
rewards (errored when it is not a finite number), or `env.reward` with `environments=` when one is configured. Like a
tool class's, each episode's instance steps in a forked process of its own (`GymEnv.isolation`), stopped past
`step_timeout_s` (the turn's time); a step that raises or is stopped ends the episode errored with the reason.

rollwise's own protocol (`envs.base.MultiTurnEnvironment`: `reset(task)` / `step(state, text)`) is unchanged:
environments named by `env.name` keep it.

Deliberately left out: tools as plain functions without a class (TRL's `tools=`; wrap them in a class), an async
`reset`, and a bound on `reset` itself (it runs here, before the policy has written anything).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
import pickle
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Sequence

from rollwise.envs.base import Environment, EpisodeState, Task
from rollwise.envs.tool_process import Outcome, ToolProcess, can_fork, instance_state
from rollwise.models.plain_text import valid_text
from rollwise.models.tool_calls import CallError, ToolCall, parse_tool_calls
from rollwise.rewards.base import as_score, describe
from rollwise.rewards.user import PartReward
from rollwise.types import Score

EpisodeReward = PartReward
"""A reward over whole episodes (`rewards.user`: a user reward, a weighted sum, a judge): `score_batch(...,
extra={"environments": ...})`."""

_JSON_TYPES: dict[str, tuple[type, ...]] = {"integer": (int,), "number": (int, float), "string": (str,),
                                            "boolean": (bool,), "array": (list,), "object": (dict,),
                                            "null": (type(None),)}


class EnvironmentClassError(ValueError):
    """A user's environment class that cannot be used as configured; one line naming the class and what to fix."""


# ------------------------------------------------------------------------------------------------ tools
RESERVED_METHODS = ("reset", "get_reward")
"""Methods of a tool class that are never tools: the episode's start and the environment's own reward."""


def _public_methods(obj: object, skip: Sequence[str] = RESERVED_METHODS) -> dict[str, Callable[..., Any]]:
    """The tools of an instance, chosen as TRL 1.16 chooses them: the plain functions of its class (inherited, async
    and static ones included; class methods, properties and callable attributes are not), public, minus `skip`."""
    return {name: getattr(obj, name) for name, _ in inspect.getmembers(type(obj), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in skip}


def tool_schemas(obj: object, where: str, *, allow_none: bool = False
                 ) -> tuple[list[dict[str, Any]], dict[str, Callable[..., Any]]]:
    """(JSON schemas, name -> bound method) of an instance's tools: every public method but `reset` and
    `get_reward` (`_public_methods`). allow_none: a class without tools is fine (TRL's: its episodes are one turn)."""
    from transformers.utils import get_json_schema

    methods = _public_methods(obj)
    if not methods and not allow_none:
        raise EnvironmentClassError(f"{where}: the class has no public methods besides reset and get_reward, so no "
                                    "tools")
    schemas = []
    for name, fn in methods.items():
        try:
            schema = get_json_schema(fn)
        except Exception as e:  # noqa: BLE001 - transformers' DocstringParsingException / TypeHintParsingException
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise EnvironmentClassError(f"{where}: tool {name!r} cannot be described ({first}); give it type hints "
                                        "and a docstring with an Args: section (or make it private: _name)") from None
        schema["function"].pop("return", None)
        schemas.append(schema)
    return schemas, methods


def _check_arguments(schema: dict[str, Any], args: dict[str, Any]) -> str | None:
    """Why `args` do not fit the tool's JSON schema (None: they do): unknown, missing or wrongly typed ones."""
    params = schema["function"].get("parameters", {})
    props = params.get("properties", {})
    unknown = [k for k in args if k not in props]
    if unknown:
        return f"unknown argument {unknown[0]!r}; arguments: {', '.join(props) or 'none'}"
    missing = [k for k in params.get("required", []) if k not in args]
    if missing:
        return f"missing argument {missing[0]!r}"
    for k, v in args.items():
        kinds = props[k].get("type")
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        ok = not kinds or any(isinstance(v, _JSON_TYPES.get(t, (object,))) and not (t in ("integer", "number") and
                                                                                    isinstance(v, bool))
                              for t in kinds)
        if not ok:
            return f"argument {k!r} must be {' or '.join(kinds)}, got {json.dumps(v)[:40]}"
    return None


def _with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
    """(finished, result or exception) of `fn()` run in a daemon thread for at most `timeout_s`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the model
            box["err"] = e

    th = threading.Thread(target=target, daemon=True, name="rollwise-tool")
    th.start()
    th.join(max(timeout_s, 0.0))
    if th.is_alive():
        return False, None
    return True, box["err"] if "err" in box else box.get("out")


def _result_text(value: Any) -> str:
    """A tool result or observation as text: a string as it is, else its JSON, else `str()`. May raise (a value whose
    `str()` raises, an int past Python's digit limit): callers treat that as the value's producer failing."""
    if isinstance(value, str):
        return valid_text(value)
    try:
        return valid_text(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return valid_text(str(value))


class ToolFailed(Exception):
    """A tool that raised, or whose result cannot become text: the episode ends errored with this reason."""


def _shown(value: Any) -> str:
    """`_result_text(value)`, with its failure named as the result's (run inside the tool's call, so a slow `str()`
    is bounded by the tool's timeout too)."""
    try:
        return _result_text(value)
    except BaseException as e:  # noqa: BLE001 - the tool's result, the tool's failure
        raise ToolFailed(f"its result ({type(value).__name__}) cannot become text: {_describe_any(e)}") from None


def _describe_any(e: BaseException) -> str:
    """`Type: message` of any exception, even one whose own `str()` raises."""
    try:
        return describe(e)[:300]
    except BaseException:  # noqa: BLE001 - an exception whose message cannot be made
        return type(e).__name__


def _call_kwargs(fn: Callable[..., Any], row: dict[str, Any]) -> dict[str, Any]:
    """The row's values `fn` takes: all of them with **kwargs, else only the names it has."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(row)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return dict(row)
    return {k: v for k, v in row.items() if k in params}


def _row(task: Task) -> dict[str, Any]:
    return {"prompt": task.prompt, **task.metadata}


def _completion(state: EpisodeState) -> Any:
    """The episode's completion as TRL gives it: text, or assistant / tool messages for a message-list prompt."""
    if isinstance(state.task.prompt, list):
        return [{"role": "assistant" if role == "policy" else "tool", "content": text}
                for role, text in state.transcript]
    return "".join(text for _, text in state.transcript)


def _score_with_reward(reward: EpisodeReward, states: Sequence[EpisodeState]) -> list[Score]:
    tasks = [s.task for s in states]
    comps = [_completion(s) for s in states]
    return list(reward.score_batch(tasks, comps, None, extra={"environments": [s.data.get("obj") for s in states]}))


# ------------------------------------------------------------------------------------------------ tool classes
ENVIRONMENT_COLUMN = "environment"
"""With several tool classes (a dict of factories), the row column that names each task's class, as TRL's."""

Factory = Callable[[], Any]


def _own_reward(probe: object) -> bool:
    """Whether a tool class scores its own episodes: a `get_reward` function on the class (TRL's rule)."""
    return inspect.isfunction(getattr(type(probe), "get_reward", None))


def _sum_scores(user: Score | None, own: Score | None) -> Score:
    """The configured reward plus the environment's own (`get_reward`, weight 1, as TRL sums them)."""
    if user is None and own is None:  # a class without get_reward beside ones with it, and no env.reward
        return Score(0.0, error="no reward source: the episode's environment class has no get_reward() and env.reward "
                                "is not set")
    if user is None or own is None:
        got = user or own
        assert got is not None
        return got
    errors = [e for e in (user.error, own.error) if e]
    total = user.value + own.value
    if not errors and not math.isfinite(total):  # two finite rewards whose sum overflows
        errors, total = [f"env.reward + get_reward is {total!r}"], 0.0
    return Score(total, parts={**user.parts, **own.parts}, error="; ".join(errors) or None, info=dict(user.info))


def choose_isolation(isolation: str, spec: str, probes: dict[str, object], fallback: str) -> str:
    """'process' where it can work (fork exists, each probe instance's state pickles), else 'thread' with one warning
    (`fallback`: what that costs); decided once at set-up. `probes`: label -> an instance of each class."""
    if isolation not in ("process", "thread"):
        raise EnvironmentClassError(f"{spec}: isolation must be 'process' or 'thread', got {isolation!r}")
    if isolation == "thread":
        return isolation
    why = None if can_fork() else "this platform has no fork"
    for label, probe in probes.items():
        try:
            pickle.dumps(instance_state(probe))
        except Exception as e:  # noqa: BLE001 - the user's class: say which and why
            why = why or f"{label} cannot be pickled ({describe(e)})"
    if why:
        warnings.warn(f"{spec}: {fallback}: {why}", RuntimeWarning, stacklevel=4)
        return "thread"
    return isolation


@dataclass
class ToolEnv:
    """A user's tool class, or several by name, as a rollwise multi-turn environment (see the module docstring)."""

    data: Environment
    """Where tasks come from (e.g. the `dataset` environment): `load(split, n, seed)`."""
    factory: Factory | Mapping[str, Factory]
    """The user's class or zero-argument factory, or a dict of them by name (each row's `environment` column picks
    one, as TRL's dict `environment_factory`)."""
    spec: str
    """How the config named it (for messages)."""
    reward: EpisodeReward | None = None
    """A `rewards.user` scorer (`score_batch(..., extra={"environments": ...})`); optional when every class has
    `get_reward`."""
    tool_timeout_s: float = 10.0
    """The longest one tool call (or one `get_reward` call) may run."""
    max_calls: int = 4
    max_result_chars: int = 2000
    turn_budget_s: float = 25.0
    """All of a turn's tool calls together: calls after it is spent are timed out without running."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Every class's tool schemas (one list for one class); a task's own are `tool_sets[environment_of(task)]`."""
    methods: list[str] = field(default_factory=list)
    isolation: str = "process"
    """Where tool calls run: "process" (each episode's instance in a forked child, killed when a call runs past its
    time: `envs.tool_process`) or "thread" (a call past its time is abandoned, still running: a tool holding the GIL
    holds the whole process). "process" falls back to "thread", with a warning, where there is no fork or a class's
    instances cannot be pickled (their state could not come back to the reward), and for an episode whose process
    cannot be forked (out of processes or descriptors)."""
    opening_sep: ClassVar[str] = ""
    """NOTE: what `reset` returns is appended to the last user message as it is, as TRL does (envs.multiturn)."""

    def __post_init__(self) -> None:
        self.multi = isinstance(self.factory, Mapping)
        self._factories: dict[str | None, Factory] = {}
        if isinstance(self.factory, Mapping):
            self._factories.update(self.factory.items())
        else:
            self._factories[None] = self.factory
        if not self._factories:
            raise EnvironmentClassError(f"env.environment {self.spec}: the dict names no classes")
        self._lock = threading.Lock()
        self._pool: dict[str | None, list[Any]] = {}
        self._schemas: dict[str | None, dict[str, dict[str, Any]]] = {}
        self._owns_reward: dict[str | None, bool] = {}
        for name in self._factories:
            probe = self._build(name)
            where = self._where(name)
            if not callable(getattr(probe, "reset", None)):
                raise EnvironmentClassError(f"{where}: the class has no reset(**row) method")
            schemas, _ = tool_schemas(probe, where, allow_none=True)
            self._schemas[name] = {s["function"]["name"]: s for s in schemas}
            self._owns_reward[name] = _own_reward(probe)
            self._pool[name] = [probe]  # NOTE: built once, reset for each episode (TRL's pool): the probe seeds it
        self._said_no_process = False
        self._choose_isolation()
        unscored = [self._where(n) for n, own in self._owns_reward.items() if not own]
        # NOTE: as TRL, a dict where only some classes have get_reward needs no env.reward: the others' episodes have
        # no reward source and are errored with that reason (`_sum_scores`)
        if self.reward is None and unscored and len(unscored) == len(self._owns_reward):
            raise EnvironmentClassError(f"env.environment {unscored[0]!r} needs env.reward or env.rewards, or a "
                                        "get_reward() method: a function that scores episodes, e.g. "
                                        "fn(completions, environments, **kwargs)")
        seen: dict[str, dict[str, Any]] = {}
        for by_name in self._schemas.values():
            for tool, schema in by_name.items():
                seen.setdefault(tool, schema)
        self.tools, self.methods = list(seen.values()), list(seen)

    def _choose_isolation(self) -> None:
        """Process isolation where it can work (see `isolation`), decided once at set-up."""
        self.isolation = choose_isolation(self.isolation, self.spec, {self._where(n): p[0] for n, p in self._pool.items()},
                                          "tools run in threads, where a call past tool_timeout_s cannot be stopped")

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (Ray ships environments to its actors): without the lock and the pooled instances."""
        state = dict(self.__dict__)
        state.pop("_lock", None)
        state["_pool"] = {name: [] for name in self._pool}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _where(self, name: str | None) -> str:
        return self.spec if name is None else f"{self.spec}[{name!r}]"

    def _build(self, name: str | None) -> Any:
        try:
            return self._factories[name]()
        except Exception as e:  # noqa: BLE001 - the user's constructor: one line naming it
            raise EnvironmentClassError(f"{self._where(name)}: constructing it with no arguments failed: "
                                        f"{describe(e)}") from None

    @property
    def name(self) -> str:
        return getattr(self.data, "name", "environment")

    @property
    def tool_sets(self) -> dict[str | None, list[dict[str, Any]]]:
        """Each class's tool schemas by its name (None: the one class)."""
        return {n: list(s.values()) for n, s in self._schemas.items()}

    def environment_of(self, task: Task) -> str | None:
        """The name of the class a task runs in (its `environment` column with several; None with one)."""
        return task.metadata.get(ENVIRONMENT_COLUMN) if self.multi else None

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        tasks = self.data.load(split=split, n=n, seed=seed)
        for t in tasks if self.multi else ():
            if self.environment_of(t) not in self._factories:
                raise EnvironmentClassError(
                    f"task {t.id}: {ENVIRONMENT_COLUMN}={t.metadata.get(ENVIRONMENT_COLUMN)!r} is not among "
                    f"env.environment's names {sorted(map(str, self._factories))} (each row names its class in an "
                    f"{ENVIRONMENT_COLUMN!r} column)")
        return tasks

    def score(self, task: Task, completion: str) -> Score:
        return Score(0.0, error=f"{self.spec} scores whole episodes (environments=); a single text has no episode")

    # -- the pool ------------------------------------------------------------------------------------
    def _take(self, name: str | None) -> Any:
        with self._lock:
            pool = self._pool[name]
            if pool:
                return pool.pop()
        return self._factories[name]()

    def teardown(self, state: EpisodeState) -> None:
        """The episode's instance goes back to its pool, unless a tool call of it was abandoned (still running)."""
        proc = state.data.pop("proc", None)
        if proc is not None:  # an episode that was never scored; its process had a copy, this one is untouched
            proc.kill()
        obj = state.data.get("obj")
        if obj is None or state.data.get("abandoned"):
            return
        with self._lock:
            self._pool[state.data.get("environment")].append(obj)

    # -- episode protocol ---------------------------------------------------------------------------
    def reset(self, task: Task) -> EpisodeState:
        name = self.environment_of(task)
        state = EpisodeState(task=task, data={"tool_calls": 0, "tool_errors": 0, "calls": [], "environment": name})
        row = _row(task)
        if self.multi:  # the routing column is the trainer's, not reset's (as TRL)
            row.pop(ENVIRONMENT_COLUMN, None)
        try:
            obj = self._take(name)
            state.data["obj"] = obj
            ret = obj.reset(**_call_kwargs(obj.reset, row))
            if ret is not None:
                state.data["opening"] = _result_text(ret)
        except Exception as e:  # noqa: BLE001 - the episode is errored with the reason
            state.data["step_error"] = f"(reset) {describe(e)}"
            return state
        if self.isolation == "process" and (self._schemas[name] or self._owns_reward[name]):
            # forked now, in the background: ready by the first call
            state.data["proc"] = ToolProcess(obj, self._shown_cut)
        return state

    def opening(self, state: EpisodeState) -> str | None:
        return state.data.get("opening")

    def step(self, state: EpisodeState, completion: str) -> list[dict[str, Any]] | None:
        """The tool turns for the policy's calls; None (the episode ends) when the turn made none, or when a tool
        failed (raised, or returned what cannot become text): then the episode is errored with that reason
        (`score_episodes`)."""
        state.turn += 1
        state.transcript.append(("policy", completion))
        obj = state.data.get("obj")
        schemas = self._schemas.get(state.data.get("environment"), {})
        calls = parse_tool_calls(completion, max_calls=self.max_calls) if schemas else []
        if not calls or obj is None:
            state.done = True
            return None
        deadline = time.monotonic() + self.turn_budget_s
        replies = []
        for call in calls:
            try:
                ok, text = self._run(obj, schemas, call, deadline, state)
            except ToolFailed as e:
                state.data["tool_calls"] += 1
                state.data["tool_errors"] += 1
                state.data["tool_failure"] = str(e)
                state.data["calls"].append({"tool": getattr(call, "name", None), "ok": False, "result": str(e)[:200]})
                state.done = True
                return None
            state.data["tool_calls"] += 1
            state.data["tool_errors"] += 0 if ok else 1
            if not ok:
                state.data.setdefault("tool_error", text[:200])
            name = getattr(call, "name", None)
            state.data["calls"].append({"tool": name, "ok": ok, "result": text[:200]})
            replies.append({"role": "tool", "content": text, **({"name": name} if name else {})})
        state.transcript.append(("env", "\n".join(r["content"] for r in replies)))
        return replies

    def _run(self, obj: Any, schemas: dict[str, dict[str, Any]], call: ToolCall | CallError, deadline: float,
             state: EpisodeState) -> tuple[bool, str]:
        """(ok, the observation) of one call; `ToolFailed` when the tool itself failed (the episode's outcome)."""
        if isinstance(call, CallError):
            return False, f"error: {call.reason}"
        if call.name not in schemas:
            return False, f"error: unknown tool {call.name!r}; tools: {', '.join(schemas)}"
        bad = _check_arguments(schemas[call.name], call.arguments)
        if bad:
            return False, f"error: {call.name}: {bad}"
        budget = min(self.tool_timeout_s, deadline - time.monotonic())
        if budget <= 0:
            return False, f"error: {call.name}: not run, this turn's tool time is used up"
        kind, out = self._invoke(state, obj, call.name, call.arguments, budget)
        if kind == "timeout":
            raise ToolFailed(f"tool {call.name} timed out after {budget:.3g}s")
        if kind == "failed":
            why = str(out)
            raise ToolFailed(f"tool {call.name} {why}" if why.startswith("raised ") else f"tool {call.name}: {why}")
        text = str(out)
        if len(text) > self.max_result_chars:
            text = text[: self.max_result_chars] + f"... [cut at {self.max_result_chars} characters]"
        return True, text

    def _shown_cut(self, value: Any) -> str:
        """`_shown(value)` cut just past `max_result_chars` (run in the tool process: a result of a gigabyte is cut
        there, not sent through the pipe)."""
        return _shown(value)[: self.max_result_chars + 1]

    def _invoke(self, state: EpisodeState, obj: Any, name: str, args: dict[str, Any], budget: float) -> Outcome:
        """One tool call, bounded by `budget`: in the episode's tool process (killed past it), or in a thread."""
        proc = self._process_for(state, obj)
        if proc is not None:
            return proc.call(name, args, budget)
        fn = getattr(obj, name)
        finished, out = _with_timeout(lambda: _shown(_result_of(fn(**args))), budget)
        if not finished:  # NOTE: the call's thread is abandoned (it cannot be killed) and may still touch `obj`
            state.data["abandoned"] = True
            return "timeout", None
        if isinstance(out, ToolFailed):
            return "failed", str(out)
        if isinstance(out, BaseException):
            return "failed", f"raised {_describe_any(out)}"
        return "ok", out

    def _process_for(self, state: EpisodeState, obj: Any) -> ToolProcess | None:
        """The episode's tool process, forked if need be; None when its calls run in threads here: thread isolation,
        or a process that could not start (out of processes or descriptors: that episode runs in threads, and a
        warning says so once)."""
        if self.isolation != "process" or state.data.get("in_thread"):
            return None
        proc = state.data.get("proc")
        if proc is None:
            proc = state.data["proc"] = ToolProcess(obj, self._shown_cut)
        why = proc.start_error()
        if why is None:
            return proc
        state.data.pop("proc", None)
        state.data["in_thread"] = True
        if not self._said_no_process:
            self._said_no_process = True
            warnings.warn(f"{self.spec}: an episode's tool process could not start ({why}); its calls run in threads, "
                          "where a call past tool_timeout_s cannot be stopped", RuntimeWarning, stacklevel=2)
        return None

    def _bring_back(self, state: EpisodeState) -> None:
        """Process isolation: the episode's `get_reward()` runs in its tool process (killable), and the instance
        comes back from it into `state.data["obj"]` for the rewards to read. Nothing to do for threads."""
        if self.isolation != "process" or state.data.get("obj") is None:
            return
        own = bool(self._owns_reward.get(state.data.get("environment")))
        if "proc" not in state.data and not own:
            return  # no call was made: the parent's instance is the episode's
        proc = self._process_for(state, state.data["obj"])
        if proc is None:
            return  # its calls ran here: so does get_reward (`_own_score`)
        state.data.pop("proc", None)
        reward, attrs, why = proc.finish(own and not state.data.get("tool_failure"), self.tool_timeout_s)
        state.data["own_reward"] = reward
        if attrs is not None:
            vars(state.data["obj"]).clear()
            vars(state.data["obj"]).update(attrs)
        elif reward[0] == "ok" and not state.data.get("tool_failure"):  # (a failed get_reward errors it already)
            label = type(state.data["obj"]).__name__
            state.data["tool_failure"] = (f"the state of {label} could not come back from its tool process ({why}); "
                                          "make its attributes picklable")

    def _own_score(self, state: EpisodeState) -> Score | None:
        """The episode's `get_reward()` (sync or async) as a Score named after its class; None without one."""
        name = state.data.get("environment")
        obj = state.data.get("obj")
        if not self._owns_reward.get(name) or obj is None:
            return None
        label = type(obj).__name__
        kind: str
        if "own_reward" in state.data:  # run in the tool process already (`_bring_back`)
            kind, out = state.data["own_reward"]
        else:
            finished, out = _with_timeout(lambda: _result_of(obj.get_reward()), self.tool_timeout_s)
            kind = "ok" if finished and not isinstance(out, BaseException) else "failed" if finished else "timeout"
            if kind == "timeout":
                state.data["abandoned"] = True
            elif kind == "failed":
                out = f"raised {describe(out)}"
        if kind == "timeout":
            return Score(0.0, error=f"{label}.get_reward: timed out after {self.tool_timeout_s:g}s")
        if kind == "failed":
            return Score(0.0, error=f"{label}.get_reward {out}" if str(out).startswith("raised ")
                         else f"{label}.get_reward: {out}")
        if out is None:
            return Score(0.0, error=f"{label}.get_reward returned None (no reward)")
        sc = as_score(out, where=f"{label}.get_reward")
        return sc if sc.error else Score(sc.value, parts={label: sc.value})

    def score_episodes(self, states: Sequence[EpisodeState]) -> list[Score]:
        """Every episode's score: the configured reward plus `get_reward`. An episode whose tool failed is errored
        with that reason, whatever the rewards would say (see the module docstring), and is not shown to them."""
        for st in states:
            self._bring_back(st)
        failed = [s for s in states if s.data.get("tool_failure")]
        rest = [s for s in states if not s.data.get("tool_failure")]
        user: list[Score | None] = ([None] * len(rest) if self.reward is None or not rest
                                    else list(_score_with_reward(self.reward, rest)))
        by_state = {id(s): _sum_scores(u, self._own_score(s)) for s, u in zip(rest, user)}
        for s in failed:
            by_state[id(s)] = Score(0.0, error=str(s.data["tool_failure"]))
        out = []
        for s in states:
            sc = by_state[id(s)]
            sc.info.update(tool_calls=s.data["tool_calls"], tool_errors=s.data["tool_errors"])
            if "tool_error" in s.data:
                sc.info["tool_error"] = s.data["tool_error"]  # the first failed call's observation, for audit
            if self.multi:
                sc.info["environment"] = s.data.get("environment")
            out.append(sc)
        return out


def _result_of(value: Any) -> Any:
    """A tool's (or get_reward's) result, an async one's coroutine run to its end (in the calling thread)."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


# ------------------------------------------------------------------------------------------------ gym style
@dataclass
class GymEnv:
    """A gym-style class (`reset()` -> observation, `step(action)` -> (observation, reward, done, info)) as a
    rollwise multi-turn environment (see the module docstring)."""

    data: Environment
    factory: Callable[[], Any]
    spec: str
    reward: EpisodeReward | None = None
    """A `rewards.user` scorer with `environments=`; None = the sum of the step rewards."""
    step_timeout_s: float = 25.0
    """The longest one `step` may run; past it the episode's process is killed and the episode errored."""
    isolation: str = "process"
    """Where `step` runs, as `ToolEnv.isolation`: each episode's instance in a forked process of its own, or here."""

    def __post_init__(self) -> None:
        try:
            probe = self.factory()
        except Exception as e:  # noqa: BLE001
            raise EnvironmentClassError(f"{self.spec}: constructing it with no arguments failed: {describe(e)}") from None
        missing = [m for m in ("reset", "step") if not callable(getattr(probe, m, None))]
        if missing:
            raise EnvironmentClassError(f"{self.spec}: environment_api 'gym' needs reset() and step(action); it has "
                                        f"no {' or '.join(missing)}")
        self.isolation = choose_isolation(self.isolation, self.spec, {self.spec: probe},
                                          "step runs in this process, where a step past its time cannot be stopped")

    @property
    def name(self) -> str:
        return getattr(self.data, "name", "environment")

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return self.data.load(split=split, n=n, seed=seed)

    def score(self, task: Task, completion: str) -> Score:
        return Score(0.0, error=f"{self.spec} scores whole episodes; a single text has no episode")

    def reset(self, task: Task) -> EpisodeState:
        state = EpisodeState(task=task, data={"return": 0.0, "steps": 0})
        try:
            obj = self.factory()
            state.data["obj"] = obj
            out = obj.reset(**_call_kwargs(obj.reset, _row(task)))
            obs = out[0] if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) else out
            if obs is not None:
                state.data["opening"] = _result_text(obs)
        except Exception as e:  # noqa: BLE001
            state.data["step_error"] = f"(reset) {describe(e)}"
            return state
        if self.isolation == "process":
            state.data["proc"] = ToolProcess(obj, functools.partial(_gym_outcome, self.spec))
        return state

    def opening(self, state: EpisodeState) -> str | None:
        return state.data.get("opening")

    def step(self, state: EpisodeState, completion: str) -> str | None:
        state.turn += 1
        state.transcript.append(("policy", completion))
        obj = state.data.get("obj")
        if obj is None:
            return None
        proc = state.data.get("proc")
        if proc is not None and proc.start_error() is not None:  # out of processes: this episode steps here
            state.data.pop("proc", None)
            proc = None
        if proc is None:
            text, reward, done = _gym_outcome(self.spec, obj.step(completion))
        else:
            kind, out = proc.call("step", {}, self.step_timeout_s, (completion,))
            if kind != "ok":  # the episode ends errored with the reason (envs.multiturn reads step_error)
                state.data["step_error"] = (f"TimeoutError: took longer than {self.step_timeout_s:g}s (stopped)"
                                            if kind == "timeout" else str(out).removeprefix("raised "))
                state.done = True
                return None
            text, reward, done = out
        state.data["return"] += reward
        state.data["steps"] += 1
        if done:
            state.done = True
            return None
        state.transcript.append(("env", text))
        return text

    def teardown(self, state: EpisodeState) -> None:
        """The episode's process, if it is still there, ends (an episode that was never scored)."""
        proc = state.data.pop("proc", None)
        if proc is not None:
            proc.kill()

    def score_episodes(self, states: Sequence[EpisodeState]) -> list[Score]:
        """`env.reward` with `environments=`, else the sum of the step rewards (errored when it is not a finite
        number); each instance's attributes are brought back from its process first."""
        out: list[Score | None] = [None] * len(states)
        for i, s in enumerate(states):
            proc = s.data.pop("proc", None)
            if proc is None or proc.start_error() is not None:  # it stepped here: the instance is current
                continue
            _, attrs, why = proc.finish(False, self.step_timeout_s)
            if attrs is None and self.reward is not None:
                out[i] = Score(0.0, error=f"the state of {self.spec} could not come back from its process ({why}); "
                                          "make its attributes picklable")
            elif attrs is not None:
                vars(s.data["obj"]).clear()
                vars(s.data["obj"]).update(attrs)
        if self.reward is None:
            return [_finite_return(self.spec, s.data["return"]) for s in states]
        todo = [i for i, sc in enumerate(out) if sc is None]
        for i, sc in zip(todo, _score_with_reward(self.reward, [states[i] for i in todo]) if todo else []):
            out[i] = sc
        return [sc if sc is not None else Score(0.0, error="episode was not scored") for sc in out]


def _gym_outcome(spec: str, out: Any) -> tuple[str, float, bool]:
    """(observation text, reward, done) of what a gym `step` returned; raises on anything else (the step's failure).
    Runs where the step ran (in the episode's process: a slow `str()` is stopped with it)."""
    if not isinstance(out, tuple) or len(out) not in (4, 5):
        raise TypeError(f"{spec}.step returned {type(out).__name__}; expected (observation, reward, done, info) or "
                        "(observation, reward, terminated, truncated, info)")
    obs, reward, *flags, _info = out
    done = any(bool(f) for f in flags)
    return ("" if done else _result_text(obs)), float(reward or 0.0), done


def _finite_return(spec: str, total: float) -> Score:
    """The sum of an episode's step rewards as its Score; errored when it is inf or NaN (a step reward of 1e308
    twice), which would poison its group's advantages."""
    if not math.isfinite(total):
        return Score(0.0, error=f"{spec}: the sum of the step rewards is {total!r}")
    return Score(float(total), parts={"return": float(total)})


ENVIRONMENT_APIS: dict[str, type] = {"tools": ToolEnv, "gym": GymEnv}


def _resolve_class(spec: str | Callable[..., Any], key: str) -> tuple[Any, str]:
    """(the class or factory, how messages name it) of one `env.environment` value."""
    from rollwise.in_memory import qualified_name
    from rollwise.rewards.user import load_object

    if not isinstance(spec, str):
        return spec, qualified_name(spec)
    try:
        cls = load_object(spec)
    except (ValueError, FileNotFoundError) as e:
        raise EnvironmentClassError(f"{key}: {e}") from None
    if not callable(cls):
        raise EnvironmentClassError(f"{key} {spec!r} is a {type(cls).__name__}, not a class")
    return cls, spec


def make_class_env(data: Environment, spec: str | Callable[..., Any] | Mapping[str, str | Callable[..., Any]],
                   api: str, reward: EpisodeReward | None, *, tool_timeout_s: float = 10.0, max_calls: int = 4,
                   turn_budget_s: float = 25.0, isolation: str = "process") -> ToolEnv | GymEnv:
    """The environment `env.environment` / `env.environment_api` name ("file.py:Class", or through the Python API
    the class or a zero-argument factory itself; with 'tools', also a dict of them by name, each row naming its
    own in an `environment` column), over the tasks of `data`."""
    if api not in ENVIRONMENT_APIS:
        raise EnvironmentClassError(f"env.environment_api must be one of {sorted(ENVIRONMENT_APIS)}, got {api!r}")
    if isinstance(spec, Mapping):
        if api == "gym":
            raise EnvironmentClassError("env.environment: environment_api 'gym' takes one class, not a dict of them")
        resolved = {str(k): _resolve_class(v, f"env.environment.{k}") for k, v in spec.items()}
        label = "{" + ", ".join(f"{k}: {lab}" for k, (_, lab) in resolved.items()) + "}"
        return ToolEnv(data, {k: c for k, (c, _) in resolved.items()}, label, reward, tool_timeout_s=tool_timeout_s,
                       max_calls=max_calls, turn_budget_s=turn_budget_s, isolation=isolation)
    cls, label = _resolve_class(spec, "env.environment")
    if api == "gym":
        return GymEnv(data, cls, label, reward, step_timeout_s=turn_budget_s, isolation=isolation)
    return ToolEnv(data, cls, label, reward, tool_timeout_s=tool_timeout_s, max_calls=max_calls,
                   turn_budget_s=turn_budget_s, isolation=isolation)


__all__ = ["ENVIRONMENT_APIS", "ENVIRONMENT_COLUMN", "EnvironmentClassError", "GymEnv", "RESERVED_METHODS", "ToolEnv",
           "make_class_env", "tool_schemas"]
