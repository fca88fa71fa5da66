"""Multi-turn episodes, token in, token out: drive any engine and any `MultiTurnEnvironment`.

Each round sends every live episode's whole token sequence (prompt + everything so far) to one
`engine.generate` call with n=1, appends the sampled token ids *as returned* (loss mask 1, their behaviour
log-probs), hands the sample's text to `env.step`, and appends the observation by tokenizing *only that
reply* (loss mask 0, log-prob 0.0). The conversation is never re-tokenized from text, so the trainer sees
exactly the tokens the policy produced (re-tokenization drift is the classic multi-turn bug).

Episodes end when the environment says so ("stop"), at `max_turns` policy turns ("max_turns"), when
`max_total_tokens` (prompt included) is reached or a policy turn is cut by max_tokens ("length"), or when
the engine aborts ("abort"). The environment's episode score is attached; a scorer that raises gives an
errored Score.

Callers hand in the prompts' token ids (built with the chat template where the model has one) and a
`format_reply(reply_text, last_policy_ids)` that wraps an environment reply as the next chat turn; the rollout
controller does both (`control.episodes`). `env.step` runs with a per-turn timeout, and an environment's
optional `teardown(state)` is called once per episode after scoring.

Deliberately left out: streaming / async rounds (the controller owns scheduling).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rollwise.envs.base import EpisodeState, MultiTurnEnvironment, Task
from rollwise.types import Rollout, SamplingParams, Score, make_rollout

EpisodeEnd = Literal["stop", "length", "max_turns", "abort"]
ENV_WEIGHT_VERSION = -1
"""NOTE: weight version recorded for environment tokens; they are masked out of the loss."""


@dataclass
class Episode:
    """One finished episode. The completion-side lists all have the same length T."""

    task: Task
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)  # [T] policy and env tokens, in order
    loss_mask: list[int] = field(default_factory=list)  # [T] 1 = policy token, 0 = env token
    logprobs: list[float] = field(default_factory=list)  # [T] behaviour log-probs, 0.0 for env tokens
    weight_versions: list[int] = field(default_factory=list)  # [T] ENV_WEIGHT_VERSION for env tokens
    turns: int = 0
    finish_reason: EpisodeEnd | None = None
    score: Score | None = None
    state: EpisodeState | None = None
    texts: list[tuple[str, str]] = field(default_factory=list)
    """(role, text) of every segment, for logs and audit (never used to rebuild tokens)."""

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.token_ids)

    def to_rollout(self, prompt_id: str | None = None, group_id: str | None = None, step: int = 0) -> Rollout:
        """The episode as a `Rollout` (`types.make_rollout`: "truncated" when it hit a turn or token limit)."""
        r = make_rollout(self.task, group_id or self.task.id, self.sample_index, self.prompt_token_ids,
                         token_ids=self.token_ids, logprobs=self.logprobs, weight_versions=self.weight_versions,
                         finish_reason=self.finish_reason, text="".join(t for _, t in self.texts),
                         score=self.score or Score(0.0, error="episode was not scored"), step=step,
                         loss_mask=self.loss_mask, env_info={"turns": self.turns})
        r.prompt_id = prompt_id or self.task.id
        return r


def encode_reply(tokenizer: Any, text: str) -> list[int]:
    """Token ids of an environment reply alone, without BOS/EOS (HF tokenizers and plain encode(text) alike)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return list(ids)


def _encode_prompt(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text))


def _score_episode(env: Any, ep: Episode) -> Score:
    from rollwise.rewards.base import as_score, describe

    step_error = ep.state.data.get("step_error") if ep.state is not None else None
    if step_error:
        return Score(0.0, error=f"{env.name}.step raised {step_error}")
    try:
        if hasattr(env, "score_episode"):
            return as_score(env.score_episode(ep.state), where=f"{env.name}.score_episode")
        policy_text = "\n".join(t for role, t in ep.texts if role == "policy")
        return as_score(env.score(ep.task, policy_text), where=f"{env.name}.score")
    except Exception as e:  # noqa: BLE001 - an errored score, never a silent zero
        return Score(0.0, error=describe(e))


def run_episodes(
    engine: Any,
    tokenizer: Any,
    env: MultiTurnEnvironment,
    tasks: list[Task],
    sampling_params: SamplingParams | Sequence[SamplingParams],
    max_turns: int = 4,
    max_total_tokens: int = 1024,
    *,
    prompts: Sequence[list[int]] | None = None,
    format_reply: Callable[[Any, list[int]], list[int]] | None = None,
    turn_timeout_s: float | None = None,
    turn_end_ids: Collection[int] = (),
    stop: Sequence[str] = (),
    encode: Callable[[Task], list[int]] | None = None,
) -> list[Episode]:
    """Run `params.n` episodes per task (one SamplingParams for all tasks, or one per task); returns them
    task-major (task 0's samples first).

    `engine.generate(list[list[int]], SamplingParams | list) -> list[RequestOutput]`; `tokenizer.encode(text)`
    and `tokenizer.decode(ids)`. prompts: each task's prompt token ids (default: `tokenizer.encode(task.prompt)`);
    format_reply: token ids to append for an environment reply, given the policy turn's ids (default: the reply
    alone); turn_timeout_s: the longest one `env.step` may take before the episode ends errored. If the
    environment has a `stop` attribute, its strings are added to the sampling params' stop strings so a policy
    turn ends at a tool call's closing tag; `stop` adds more.
    turn_end_ids: tokens that end a policy turn without ending the episode (the chat template's end-of-turn token,
    when replies are chat turns); any other EOS ends it. encode: a task's prompt ids, for environments whose
    `opening(state)` returns text to append to the first user turn (`envs.agent`: what the user's `reset` returned).
    An environment with `score_episodes(states) -> list[Score]` is scored once for all episodes of the call (each
    state's `data["episode_texts"]` then holds the episode's (role, text) segments, "policy" and "env").
    """
    if max_turns < 1:
        raise ValueError(f"run_episodes: max_turns must be >= 1, got {max_turns}")
    if max_total_tokens < 2:
        raise ValueError(f"run_episodes: max_total_tokens must be >= 2, got {max_total_tokens}")
    if not tasks:
        return []
    plist = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(tasks)
    if len(plist) != len(tasks):
        raise ValueError(f"run_episodes: {len(plist)} sampling params for {len(tasks)} tasks")
    if prompts is not None and len(prompts) != len(tasks):
        raise ValueError(f"run_episodes: {len(prompts)} prompts for {len(tasks)} tasks")
    env_stops = list(getattr(env, "stop", ())) + [x for x in stop if x not in getattr(env, "stop", ())]
    fmt = format_reply or (lambda text, _ids: encode_reply(tokenizer, text))
    ends = frozenset(turn_end_ids)
    opening = getattr(env, "opening", None)
    episodes: list[Episode] = []
    params_of: dict[int, SamplingParams] = {}  # id(episode) -> its task's params (with the env's stops)
    first: list[SamplingParams] = []
    starts: list[tuple[int, int]] = []  # (first episode, samples) of each round-1 request
    for i, task in enumerate(tasks):
        prompt_ids = list(prompts[i]) if prompts is not None else _encode_prompt(tokenizer, task.prompt)
        sp = plist[i]
        stops = list(sp.stop or []) + [x for x in env_stops if x not in (sp.stop or [])]
        sp = dataclasses.replace(sp, stop=stops or None)
        group: list[Episode] = []
        for j in range(sp.n):
            state = env.reset(task)
            ids = prompt_ids
            extra = opening(state) if callable(opening) else None
            if extra:  # the environment's opening text joins the first user turn: this episode's own prompt
                ids = (encode or (lambda t: _encode_prompt(tokenizer, t.prompt)))(with_opening(task, extra))
            if len(ids) >= max_total_tokens:
                raise ValueError(f"task {task.id}: prompt has {len(ids)} tokens, max_total_tokens is {max_total_tokens}")
            ep = Episode(task=task, sample_index=j, prompt_token_ids=list(ids), state=state)
            ep.texts.append(("prompt", task.prompt if isinstance(task.prompt, str) else str(task.prompt)))
            group.append(ep)
            params_of[id(ep)] = sp
        # Round 1 shares one prefill per distinct prompt: all n samples together unless openings differ.
        same = all(ep.prompt_token_ids == group[0].prompt_token_ids for ep in group)
        for k, ep in enumerate([group[0]] if same else group):
            n = sp.n if same else 1
            seed = sp.seed if same or sp.seed is None else sp.seed + 7919 * k
            first.append(dataclasses.replace(sp, n=n, seed=seed,
                                             max_tokens=min(sp.max_tokens, max_total_tokens - len(ep.prompt_token_ids))))
            starts.append((len(episodes) + (0 if same else k), n))
        episodes += group

    def advance(ep: Episode, sample: Any) -> bool:
        return _advance(ep, sample, env, tokenizer, max_turns, max_total_tokens, params_of[id(ep)].logprobs, fmt,
                        turn_timeout_s, ends)

    outputs = _generate(engine, [episodes[s].prompt_token_ids for s, _ in starts], first)
    live: list[Episode] = []
    for (s0, n), out in zip(starts, outputs):
        if len(out.outputs) != n:
            raise ValueError(f"engine returned {len(out.outputs)} samples for task {episodes[s0].task.id}, expected n={n}")
        for j, sample in enumerate(out.outputs):
            ep = episodes[s0 + j]
            if advance(ep, sample):
                live.append(ep)
    # Later rounds: one sample per episode. NOTE: with a seed, each episode gets its own seed stream per turn
    # (episodes with identical histories must not be forced into identical continuations).
    while live:
        params = []
        for ep in live:
            sp = params_of[id(ep)]
            seed = None if sp.seed is None else sp.seed + 1_000_003 * ep.turns + ep.sample_index
            params.append(dataclasses.replace(sp, n=1, seed=seed, max_tokens=min(sp.max_tokens, max_total_tokens - ep.total_tokens)))
        outputs = _generate(engine, [ep.prompt_token_ids + ep.token_ids for ep in live], params)
        live = [ep for ep, out in zip(live, outputs) if advance(ep, out.outputs[0])]
    batch = getattr(env, "score_episodes", None)
    scores = _score_batch(env, episodes) if callable(batch) else [_score_episode(env, ep) for ep in episodes]
    for ep, sc in zip(episodes, scores):
        ep.score = sc
        _teardown(env, ep)
    return episodes


def with_opening(task: Task, text: str) -> Task:
    """`task` with `text` appended to its first user turn (a string prompt is that turn)."""
    if isinstance(task.prompt, str):
        return dataclasses.replace(task, prompt=f"{task.prompt}\n\n{text}")
    msgs = [dict(m) for m in task.prompt]
    for m in msgs:
        if m.get("role") == "user":
            m["content"] = f"{m['content']}\n\n{text}"
            break
    else:
        msgs.append({"role": "user", "content": text})
    return dataclasses.replace(task, prompt=msgs)


def _score_batch(env: Any, episodes: list[Episode]) -> list[Score]:
    """`env.score_episodes` once for all episodes; an episode whose step raised stays errored with that reason."""
    from rollwise.rewards.base import describe

    out: list[Score | None] = [None] * len(episodes)
    todo = []
    for i, ep in enumerate(episodes):
        err = ep.state.data.get("step_error") if ep.state is not None else None
        if err:
            out[i] = Score(0.0, error=f"{env.name}.step raised {err}")
        else:
            todo.append(i)
    if todo:
        for i in todo:  # what the episode was, as text: the policy's turns and the replies (never used for tokens)
            episodes[i].state.data["episode_texts"] = [(r, t) for r, t in episodes[i].texts if r != "prompt"]
        try:
            got = list(env.score_episodes([episodes[i].state for i in todo]))
            if len(got) != len(todo):
                raise ValueError(f"score_episodes returned {len(got)} scores for {len(todo)} episodes")
        except Exception as e:  # noqa: BLE001 - errored scores, never a silent zero
            got = [Score(0.0, error=describe(e)) for _ in todo]
        for i, sc in zip(todo, got):
            out[i] = sc
    return [s if s is not None else Score(0.0, error="episode was not scored") for s in out]


def _teardown(env: Any, ep: Episode) -> None:
    """The environment's per-episode cleanup hook; a failure there is recorded on the score, never raised."""
    hook = getattr(env, "teardown", None)
    if not callable(hook) or ep.state is None:
        return
    try:
        hook(ep.state)
    except Exception as e:  # noqa: BLE001 - the episode is scored already; keep the reason visible
        from rollwise.rewards.base import describe

        if ep.score is not None:
            ep.score.info["teardown_error"] = describe(e)


def _step_with_timeout(env: Any, state: EpisodeState, text: str, timeout_s: float | None) -> Any:
    """env.step, bounded: past `timeout_s` the episode ends (the stuck call is left to finish in a daemon thread)."""
    if timeout_s is None:
        return env.step(state, text)
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["reply"] = env.step(state, text)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box["error"] = e

    th = threading.Thread(target=call, name="rollwise-env-step", daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise TimeoutError(f"env.step took longer than {timeout_s:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("reply")


def _generate(engine: Any, prompts: list[list[int]], params: list[SamplingParams]) -> list[Any]:
    """One engine call for the whole round: one params when all agree, else one per prompt (the engine protocol
    takes either), so every live episode decodes in the same batch."""
    if all(p == params[0] for p in params):
        return list(engine.generate(prompts, params[0]))
    return list(engine.generate(prompts, params))


def _advance(ep: Episode, out: Any, env: Any, tokenizer: Any, max_turns: int, max_total_tokens: int, want_logprobs: bool,
             format_reply: Callable[[Any, list[int]], list[int]], turn_timeout_s: float | None = None,
             turn_end_ids: frozenset[int] = frozenset()) -> bool:
    """Append one policy turn and the environment's reply; True while the episode goes on."""
    ids = list(out.token_ids)
    lps = list(out.logprobs or [])
    if len(lps) != len(ids):
        if want_logprobs:
            raise ValueError(f"engine returned {len(lps)} log-probs for {len(ids)} tokens (task {ep.task.id})")
        lps = [0.0] * len(ids)
    versions = list(getattr(out, "weight_versions", None) or [0] * len(ids))
    ep.token_ids += ids
    ep.loss_mask += [1] * len(ids)
    ep.logprobs += [float(x) for x in lps]
    ep.weight_versions += versions[: len(ids)] + [versions[-1] if versions else 0] * (len(ids) - len(versions))
    ep.turns += 1
    text = out.text if out.text else tokenizer.decode(ids)
    ep.texts.append(("policy", text))
    if out.finish_reason in ("abort", "length"):
        ep.finish_reason = out.finish_reason
        # NOTE: the environment's step never sees this turn, so its transcript gets it here: a reward reading the
        # episode's turns (envs.agent) scores what the policy wrote, cut or not.
        if ep.state is not None:
            ep.state.transcript.append(("policy", text))
        return False
    try:
        reply = _step_with_timeout(env, ep.state, text, turn_timeout_s)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - the episode ends; scoring records the reason
        from rollwise.rewards.base import describe

        ep.finish_reason = "abort"
        ep.state.data["step_error"] = describe(e)  # type: ignore[union-attr]
        return False
    eos = getattr(tokenizer, "eos_token_id", None)
    if reply is None or (eos is not None and ids and ids[-1] == eos and eos not in turn_end_ids):
        # NOTE: a policy turn that ended with EOS ends the episode even if it also made a call: nothing may
        # follow EOS in a trained sequence. The environment still saw the turn (it may hold the answer). The chat
        # template's end-of-turn token (`turn_end_ids`) is not such an EOS: the template puts turns after it.
        ep.finish_reason = "stop"
        return False
    reply_ids = list(format_reply(reply, ids))
    room = max_total_tokens - ep.total_tokens
    cut = reply_ids[:room]
    ep.token_ids += cut
    ep.loss_mask += [0] * len(cut)
    ep.logprobs += [0.0] * len(cut)
    ep.weight_versions += [ENV_WEIGHT_VERSION] * len(cut)
    shown = reply if isinstance(reply, str) else "\n".join(str(m.get("content", "")) for m in reply)
    ep.texts.append(("env", shown if len(cut) == len(reply_ids) else tokenizer.decode(cut)))
    if len(cut) < len(reply_ids) or ep.total_tokens >= max_total_tokens:
        ep.finish_reason = "length"
        return False
    if ep.turns >= max_turns:
        ep.finish_reason = "max_turns"
        return False
    return True
