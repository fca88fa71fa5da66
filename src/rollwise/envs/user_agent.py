"""The user's own agent code as a rollout source (`env.agent: path/to/file.py:function`; docs/agents.md).

    def agent(client: openai.OpenAI, row: dict) -> str | float | dict | None:
        ...any logic: its own tools, loops, sub-calls through `client` (chat.completions or completions)...

Per episode rollwise calls the function with an `openai.OpenAI` client whose base URL is the episode's own address
on the recording endpoint (`envs.agent_endpoint`), serving the current policy, and the dataset row (`prompt` and
every other column). What the function returns is what the reward needs:

- a string: the episode's completion, scored by the configured reward like a single-turn completion (TRL's
  `completions`; the row's columns come as keyword arguments);
- None: the text of the last model call is the completion;
- a number: the episode's reward itself (no reward function runs);
- a dict: `completion` (str, optional: else the last call's text), `reward` (a number, optional: then it is the
  reward), and any other keys, passed to a TRL-style reward as extra keyword lists (as TRL passes a `rollout_func`'s
  extra fields to its reward functions).

The one rule on failures holds: an exception in the agent, running past `env.agent_timeout_s`, more than
`env.agent_max_calls` model calls, no model call at all, or a return value of another kind is that episode's
outcome: an errored rollout with the reason, scored as a wrong answer (`algo.errored_reward`). Only the engine
failing (the endpoint's `failure`) stops the run.

Deliberately left out: async agent functions (wrap them with `asyncio.run`), killing a hung agent (its thread is
abandoned, and its later calls get a 410), and agents that need the policy's weights outside the endpoint.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollwise.envs.agent_endpoint import AgentEndpoint, EpisodeLog
from rollwise.envs.agent_record import assemble
from rollwise.envs.base import Environment
from rollwise.envs.multiturn import BatchGenerator, Episode
from rollwise.rewards.base import as_score, describe
from rollwise.types import SamplingParams, Score, Task

AgentFn = Callable[..., Any]


class AgentSpecError(ValueError):
    """An `env.agent` that cannot be used; one line naming it and what to fix."""


def load_agent(spec: str | AgentFn) -> AgentFn:
    """The function `env.agent` names ("file.py:fn" or "module:fn"), or the function itself (Python API)."""
    from rollwise.envs.registry import load_object

    fn = spec if callable(spec) else load_object(spec)
    if not callable(fn):
        raise AgentSpecError(f"env.agent {spec!r} is a {type(fn).__name__}, not a function")
    if inspect.iscoroutinefunction(fn):
        raise AgentSpecError(f"env.agent {spec!r} is an async function; give a plain function (wrap it with "
                             "asyncio.run)")
    try:
        inspect.signature(fn).bind(None, {})
    except TypeError:
        raise AgentSpecError(f"env.agent {spec!r} must take (client, row): an openai.OpenAI client and the dataset "
                             "row") from None
    except ValueError:
        pass  # a builtin without a signature: tried at the first episode
    return fn


@dataclass
class UserAgentEnv:
    """A dataset environment whose episodes are the user's agent function (see the module docstring)."""

    data: Environment
    """Tasks and scoring (e.g. the `dataset` environment with `env.reward`)."""
    agent: AgentFn
    spec: str

    @property
    def name(self) -> str:
        return getattr(self.data, "name", "agent")

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        return self.data.load(split=split, n=n, seed=seed)

    def score(self, task: Task, completion: str) -> Score:
        return self.data.score(task, completion)

    def __getattr__(self, name: str) -> Any:
        """What else the data environment offers (a built-in task's `charset` for the warm-up model, its demos)."""
        if name.startswith("__") or name == "data":
            raise AttributeError(name)
        return getattr(self.data, name)


def is_agent_env(env: object) -> bool:
    return isinstance(env, UserAgentEnv)


@dataclass
class _Outcome:
    """What one episode's agent function came to."""

    log: EpisodeLog
    task: Task
    sample_index: int
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def _row(task: Task) -> dict[str, Any]:
    return {"prompt": task.prompt, **task.metadata}


def _client(base_url: str, timeout_s: float) -> Any:
    import openai

    # NOTE: no retries: a refused call (the cap, a closed episode) must reach the agent once, not three times.
    return openai.OpenAI(base_url=base_url, api_key="rollwise", max_retries=0, timeout=timeout_s)


def _run_one(endpoint: AgentEndpoint, agent: AgentFn, out: _Outcome, timeout_s: float) -> None:
    """Run the agent on one episode in a daemon thread, for at most `timeout_s`."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            client = _client(endpoint.base_url(out.log.episode_id), timeout_s)
            box["value"] = agent(client, _row(out.task))
        except BaseException as e:  # noqa: BLE001 - the episode's outcome
            box["error"] = e

    t0 = time.perf_counter()
    th = threading.Thread(target=body, name="rollwise-agent", daemon=True)
    th.start()
    th.join(timeout_s)
    out.seconds = time.perf_counter() - t0
    endpoint.finish(out.log)  # NOTE: from here on the episode takes no calls, whatever its thread still does
    if th.is_alive():
        out.error = f"agent ran past env.agent_timeout_s={timeout_s:g}s"
    elif "error" in box:
        out.error = f"agent raised {describe(box['error'])}"
    else:
        out.value = box.get("value")


def _final(out: _Outcome) -> tuple[str, float | None, dict[str, Any], str | None]:
    """(completion, direct reward or None, extra reward columns, error) of an episode's return value."""
    calls = out.log.calls
    last = calls[-1].text if calls else ""
    if out.log.error:
        return last, None, {}, out.log.error
    if out.error:
        return last, None, {}, out.error
    if not calls and out.log.truncated:
        return "", None, {}, "the agent's first prompt did not fit the episode's token budget (env.max_episode_tokens)"
    if not calls:
        return "", None, {}, "agent made no model call"
    v = out.value
    if v is None:
        return last, None, {}, None
    if isinstance(v, str):
        return v, None, {}, None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not math.isfinite(float(v)):
            return last, None, {}, f"agent returned the reward {v!r}"
        return last, float(v), {}, None
    if isinstance(v, dict):
        extra = {k: x for k, x in v.items() if k not in ("completion", "reward")}
        comp = v.get("completion", last)
        if not isinstance(comp, str):
            return last, None, {}, f"agent returned a completion of type {type(comp).__name__}, not a string"
        r = v.get("reward")
        if r is not None and (isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(float(r))):
            return comp, None, {}, f"agent returned the reward {r!r}, not a finite number"
        return comp, None if r is None else float(r), extra, None
    return last, None, {}, f"agent returned a {type(v).__name__}; return a string, a number, a dict or None"


def _score(env: UserAgentEnv, outs: list[_Outcome]) -> list[tuple[str, Score]]:
    """Each episode's completion text and score: errors and direct rewards as they are, the rest by the reward."""
    finals = [_final(o) for o in outs]
    scores: list[Score | None] = [None] * len(outs)
    todo = []
    for i, (_, direct, _, err) in enumerate(finals):
        if err is not None:
            scores[i] = Score(0.0, error=err)
        elif direct is not None:
            scores[i] = Score(direct)
        else:
            todo.append(i)
    if todo:
        reward = getattr(env.data, "reward", None)
        batch = getattr(reward, "score_batch", None)
        tasks = [outs[i].task for i in todo]
        comps = [finals[i][0] for i in todo]
        if callable(batch):
            keys = sorted({k for i in todo for k in finals[i][2]})
            extra = {k: [finals[i][2].get(k) for i in todo] for k in keys} or None
            try:
                got = list(batch(tasks, comps, None, extra=extra))
            except Exception as e:  # noqa: BLE001 - errored scores, never a silent zero
                got = [Score(0.0, error=describe(e)) for _ in todo]
        else:
            got = []
            for t, c in zip(tasks, comps):
                try:
                    got.append(as_score(env.data.score(t, c), where=f"{env.name}.score"))
                except Exception as e:  # noqa: BLE001
                    got.append(Score(0.0, error=describe(e)))
        for i, s in zip(todo, got):
            scores[i] = s
    return [(f[0], s if s is not None else Score(0.0, error="episode was not scored")) for f, s in zip(finals, scores)]


def _episode(out: _Outcome, text: str, score: Score, fallback_prompt: list[int]) -> Episode:
    segs = assemble(out.log.calls)
    first = segs[0] if segs else None
    finish = "length" if out.log.truncated or any(c.finish_reason == "length" for c in out.log.calls[-1:]) else "stop"
    if score.error is not None:
        finish = "stop"  # NOTE: an errored episode finished as an outcome: scored as a wrong answer, never dropped
    ep = Episode(task=out.task, sample_index=out.sample_index,
                 prompt_token_ids=list(first.prompt_token_ids) if first else list(fallback_prompt),
                 token_ids=list(first.completion_token_ids) if first else [],
                 loss_mask=list(first.loss_mask) if first else [], logprobs=list(first.logprobs) if first else [],
                 weight_versions=list(first.weight_versions) if first else [], turns=len(out.log.calls),
                 finish_reason=finish, score=score)  # type: ignore[arg-type]
    ep.segments = segs[1:]
    ep.texts = [("policy", text)]
    score.info.update(agent_calls=len(out.log.calls), agent_segments=len(segs),
                      agent_extended=sum(c.extended for c in out.log.calls), agent_s=round(out.seconds, 3))
    if out.log.overridden:
        score.info["agent_sampling_overridden"] = out.log.overridden
    return ep


@dataclass
class AgentEpisodes:
    """Runs the user's agent for every requested episode at once, over one endpoint that lives as long as the run."""

    env: UserAgentEnv
    endpoint: AgentEndpoint
    encode: Callable[[Task], list[int]]
    """A task's prompt ids: the prompt recorded for an episode that made no call (it still counts)."""
    timeout_s: float = 120.0
    max_calls: int = 8
    max_total_tokens: int = 1024
    concurrency: int = 64
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("openai") is None:
            raise AgentSpecError("env.agent needs the openai package for its client: pip install 'rollwise[agents]' "
                                 "(or pip install openai)")

    def fit_context(self, context_tokens: int) -> None:
        """Bound each call's prompt + completion by the engine's context too (known once the engine is built): a
        prompt the engine would refuse must be the episode's 'truncated', never the engine's failure."""
        self.max_total_tokens = min(self.max_total_tokens, int(context_tokens))

    def run(self, engine: BatchGenerator, tasks: Sequence[Task], params: Sequence[SamplingParams]) -> list[Episode]:
        """`params[i].n` episodes of `tasks[i]`, task-major, each its own agent run; all of them at once."""
        outs: list[_Outcome] = []
        for task, sp in zip(tasks, params):
            for j in range(sp.n):
                # NOTE: the task's id is mixed in: params shared by several tasks must not share their episodes' draws
                seed = None if sp.seed is None else (sp.seed * 7919 + zlib.crc32(f"{task.id}/{j}".encode())) % (1 << 62)
                log = self.endpoint.open(dataclasses.replace(sp, n=1, seed=seed), self.max_calls,
                                         self.max_total_tokens)
                outs.append(_Outcome(log, task, j))
        gate = threading.Semaphore(self.concurrency)

        def supervise(o: _Outcome) -> None:
            with gate:
                _run_one(self.endpoint, self.env.agent, o, self.timeout_s)

        with self._lock, self.endpoint.serving(engine):
            threads = [threading.Thread(target=supervise, args=(o,), name="rollwise-agent-episode", daemon=True)
                       for o in outs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if self.endpoint.failure is not None:  # outside every episode: the run stops
            raise RuntimeError(f"the engine serving the agent's calls failed: {describe(self.endpoint.failure)}") \
                from self.endpoint.failure
        scored = _score(self.env, outs)
        return [_episode(o, text, sc, self.encode(o.task) if not o.log.calls else []) for o, (text, sc) in zip(outs, scored)]

    def close(self) -> None:
        self.endpoint.close()


__all__ = ["AgentEpisodes", "AgentSpecError", "UserAgentEnv", "is_agent_env", "load_agent"]
