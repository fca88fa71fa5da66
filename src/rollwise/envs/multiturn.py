"""Multi-turn episodes, token in, token out: drive any engine and any `MultiTurnEnvironment`.

Each round sends every live episode's whole token sequence (prompt + everything so far) to one
`engine.generate` call with n=1, appends the sampled token ids *as returned* (loss mask 1, their behaviour
log-probs), hands the sample's text to `env.step`, and appends the observation by tokenizing *only that
reply* (loss mask 0, log-prob 0.0). The conversation is never re-tokenized from text, so the trainer sees
exactly the tokens the policy produced (re-tokenization drift is the classic multi-turn bug).

Episodes end when the environment says so ("stop"), at `max_turns` policy turns ("max_turns"), when
`max_total_tokens` (prompt included) is reached or a policy turn is cut by max_tokens ("length"), or when
the engine aborts ("abort"). An environment step that raises or runs past its timeout ends the episode too
("stop": the policy's turn was whole), errored with the reason. The environment's episode score is attached; a
scorer that raises gives an errored Score.

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
from typing import Any, Literal, Protocol

from rollwise.envs.base import EpisodeState, MultiTurnEnvironment, Reply, Task
from rollwise.types import (CompletionOutput, RequestOutput, Rollout, RolloutSegment, SamplingParams, Score, Tokenizer,
                            make_rollout)

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
    segments: list[RolloutSegment] = field(default_factory=list)
    """An agent episode's further token sequences (`envs.user_agent`); the fields above hold its first."""

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.token_ids)

    def to_rollout(self, prompt_id: str | None = None, group_id: str | None = None, step: int = 0) -> Rollout:
        """The episode as a `Rollout` (`types.make_rollout`: "truncated" when it hit a turn or token limit)."""
        r = make_rollout(self.task, group_id or self.task.id, self.sample_index, self.prompt_token_ids,
                         token_ids=self.token_ids, logprobs=self.logprobs, weight_versions=self.weight_versions,
                         finish_reason=self.finish_reason, text="".join(t for _, t in self.texts),
                         score=self.score or Score(0.0, error="episode was not scored"), step=step,
                         loss_mask=self.loss_mask, env_info={"turns": self.turns}, segments=self.segments)
        r.prompt_id = prompt_id or self.task.id
        return r


class BatchGenerator(Protocol):
    """What an episode round asks of an engine: the batch `generate` of `engine.protocol.Engine`, alone (the rollout
    controller hands in its driver's counting wrapper, evaluation the engine itself)."""

    def generate(self, prompts: Sequence[list[int]],
                 sampling_params: SamplingParams | Sequence[SamplingParams]) -> list[RequestOutput]: ...


ReplyFormatter = Callable[[Reply, list[int]], list[int]]
"""`format_reply(reply, policy_turn_ids) -> ids` to append for an environment reply (`control.episodes`)."""


def encode_reply(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of an environment reply alone, without BOS/EOS (HF tokenizers and plain encode(text) alike)."""
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except TypeError:
        ids = tokenizer.encode(text)
    return list(ids)


def _encode_prompt(tokenizer: Tokenizer, task: Task) -> list[int]:
    if not isinstance(task.prompt, str):
        raise ValueError(f"task {task.id}: a message-list prompt needs its token ids from the caller (prompts= or "
                         "encode=, built with the chat template); the plain tokenizer encodes text only")
    return list(tokenizer.encode(task.prompt))


def _state_of(ep: Episode) -> EpisodeState:
    """The episode's environment state; `run_episodes` opens every episode with one."""
    if ep.state is None:
        raise RuntimeError(f"episode {ep.task.id}/{ep.sample_index} has no environment state")
    return ep.state


_MISSING = object()


def _score_episode(env: MultiTurnEnvironment, ep: Episode) -> Score:
    from rollwise.rewards.base import as_score, describe

    step_error = ep.state.data.get("step_error") if ep.state is not None else None
    if step_error:
        return Score(0.0, error=f"{env.name}.step raised {step_error}")
    try:
        own = getattr(env, "score_episode", _MISSING)  # optional (`MultiTurnEnvironment`)
        if own is not _MISSING:
            if not callable(own):
                raise TypeError(f"{env.name}.score_episode is a {type(own).__name__}, not a method")
            return as_score(own(_state_of(ep)), where=f"{env.name}.score_episode")
        policy_text = "\n".join(t for role, t in ep.texts if role == "policy")
        return as_score(env.score(ep.task, policy_text), where=f"{env.name}.score")
    except Exception as e:  # noqa: BLE001 - an errored score, never a silent zero
        return Score(0.0, error=describe(e))


def run_episodes(
    engine: BatchGenerator,
    tokenizer: Tokenizer,
    env: MultiTurnEnvironment,
    tasks: list[Task],
    sampling_params: SamplingParams | Sequence[SamplingParams],
    max_turns: int = 4,
    max_total_tokens: int = 1024,
    *,
    prompts: Sequence[list[int]] | None = None,
    format_reply: ReplyFormatter | None = None,
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
    plist = _params_per_task(tasks, sampling_params, prompts)
    rounds = _Rounds(engine, tokenizer, env, max_turns, max_total_tokens,
                     format_reply or _plain_replies(tokenizer),
                     turn_timeout_s, frozenset(turn_end_ids))
    opener = _Opener(tokenizer, env, max_total_tokens, _stops_of(env, stop),
                     encode or (lambda t: _encode_prompt(tokenizer, t)))
    episodes: list[Episode] = []
    first: list[_FirstRequest] = []
    for i, task in enumerate(tasks):
        sp = opener.params(plist[i])
        group = opener.open(task, list(prompts[i]) if prompts is not None else _encode_prompt(tokenizer, task), sp)
        first += _first_requests(group, sp, len(episodes), max_total_tokens)
        episodes += group
        for ep in group:
            rounds.params_of[id(ep)] = sp
    rounds.run(episodes, first)
    _score_all(env, episodes)
    return episodes


def _plain_replies(tokenizer: Tokenizer) -> ReplyFormatter:
    """The default `format_reply`: a text reply's own ids, with no chat turn around it, as plain text (a reply holding
    `<|im_end|>` or an EOS token's text never becomes that token: `models.plain_text`)."""
    from rollwise.models.plain_text import encode_parts

    def fmt(reply: Reply, _policy_ids: list[int]) -> list[int]:
        if not isinstance(reply, str):
            raise ValueError("an environment that replies with chat messages needs format_reply= "
                             "(control.episodes.chat_reply_formatter): the plain tokenizer encodes text only")
        return encode_parts(tokenizer, [(reply, True)])

    return fmt


def _params_per_task(tasks: Sequence[Task], sampling_params: SamplingParams | Sequence[SamplingParams],
                     prompts: Sequence[list[int]] | None) -> list[SamplingParams]:
    """One SamplingParams per task (the one given, repeated, or the list as it is), checked against the prompts."""
    plist = [sampling_params] * len(tasks) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
    if len(plist) != len(tasks):
        raise ValueError(f"run_episodes: {len(plist)} sampling params for {len(tasks)} tasks")
    if prompts is not None and len(prompts) != len(tasks):
        raise ValueError(f"run_episodes: {len(prompts)} prompts for {len(tasks)} tasks")
    return plist


def _stops_of(env: MultiTurnEnvironment, stop: Sequence[str]) -> list[str]:
    """The environment's own stop strings (a tool call's closing tag), then the caller's others."""
    own = getattr(env, "stop", ())
    return list(own) + [x for x in stop if x not in own]


@dataclass
class _FirstRequest:
    """One round-1 engine request: `n` samples of one prompt, for episodes start .. start+n-1 of the call."""

    start: int
    n: int
    params: SamplingParams


@dataclass
class _Opener:
    """Opens a task's episodes: resets the environment once per episode and builds each episode's prompt."""

    tokenizer: Tokenizer
    env: MultiTurnEnvironment
    max_total_tokens: int
    env_stops: list[str]
    encode: Callable[[Task], list[int]]
    """A task's prompt ids, for an episode whose environment opening joins the first user turn."""

    def params(self, sp: SamplingParams) -> SamplingParams:
        """The task's params with the environment's stop strings added."""
        stops = list(sp.stop or []) + [x for x in self.env_stops if x not in (sp.stop or [])]
        return dataclasses.replace(sp, stop=stops or None)

    def open(self, task: Task, prompt_ids: list[int], sp: SamplingParams) -> list[Episode]:
        """`sp.n` fresh episodes of `task`, each with its environment state and prompt ids."""
        opening = getattr(self.env, "opening", None)
        group: list[Episode] = []
        for j in range(sp.n):
            state = self.env.reset(task)
            ids = prompt_ids
            extra = opening(state) if callable(opening) else None
            if extra:  # the environment's opening text joins the first user turn: this episode's own prompt
                ids = self.encode(with_opening(task, extra, getattr(self.env, "opening_sep", "\n\n")))
            if len(ids) >= self.max_total_tokens:
                raise ValueError(f"task {task.id}: prompt has {len(ids)} tokens, max_total_tokens is "
                                 f"{self.max_total_tokens}")
            ep = Episode(task=task, sample_index=j, prompt_token_ids=list(ids), state=state)
            ep.texts.append(("prompt", task.prompt if isinstance(task.prompt, str) else str(task.prompt)))
            group.append(ep)
        return group


def _first_requests(group: list[Episode], sp: SamplingParams, offset: int,
                    max_total_tokens: int) -> list[_FirstRequest]:
    """Round 1 shares one prefill per distinct prompt: all n samples together unless openings differ (then one
    request per episode, each with a seed of its own). `offset`: the group's first episode within the call."""
    same = all(ep.prompt_token_ids == group[0].prompt_token_ids for ep in group)
    out = []
    for k, ep in enumerate([group[0]] if same else group):
        n = sp.n if same else 1
        seed = sp.seed if same or sp.seed is None else sp.seed + 7919 * k
        params = dataclasses.replace(sp, n=n, seed=seed,
                                     max_tokens=min(sp.max_tokens, max_total_tokens - len(ep.prompt_token_ids)))
        out.append(_FirstRequest(offset + (0 if same else k), n, params))
    return out


@dataclass
class _Rounds:
    """Takes every episode of a call through its turns: one engine call per round for all live episodes."""

    engine: BatchGenerator
    tokenizer: Tokenizer
    env: MultiTurnEnvironment
    max_turns: int
    max_total_tokens: int
    format_reply: ReplyFormatter
    turn_timeout_s: float | None
    turn_end_ids: frozenset[int]
    params_of: dict[int, SamplingParams] = field(default_factory=dict)
    """id(episode) -> its task's params (with the environment's stops)."""

    def run(self, episodes: list[Episode], first: list[_FirstRequest]) -> None:
        live = self.first_round(episodes, first)
        while live:
            live = self.next_round(live)

    def advance(self, ep: Episode, sample: CompletionOutput) -> bool:
        return _advance(ep, sample, self.env, self.tokenizer, self.max_turns, self.max_total_tokens,
                        self.params_of[id(ep)].logprobs, self.format_reply, self.turn_timeout_s, self.turn_end_ids)

    def first_round(self, episodes: list[Episode], first: list[_FirstRequest]) -> list[Episode]:
        """Round 1 (see `_first_requests`); the episodes that go on."""
        outputs = _generate(self.engine, [episodes[r.start].prompt_token_ids for r in first], [r.params for r in first])
        live: list[Episode] = []
        for r, out in zip(first, outputs):
            if len(out.outputs) != r.n:
                raise ValueError(f"engine returned {len(out.outputs)} samples for task {episodes[r.start].task.id}, "
                                 f"expected n={r.n}")
            for j, sample in enumerate(out.outputs):
                ep = episodes[r.start + j]
                if self.advance(ep, sample):
                    live.append(ep)
        return live

    def next_round(self, live: list[Episode]) -> list[Episode]:
        """A later round: one sample per live episode; the episodes that go on.
        NOTE: with a seed, each episode gets its own seed stream per turn (episodes with identical histories must not
        be forced into identical continuations)."""
        params = []
        for ep in live:
            sp = self.params_of[id(ep)]
            seed = None if sp.seed is None else sp.seed + 1_000_003 * ep.turns + ep.sample_index
            params.append(dataclasses.replace(sp, n=1, seed=seed,
                                              max_tokens=min(sp.max_tokens, self.max_total_tokens - ep.total_tokens)))
        outputs = _generate(self.engine, [ep.prompt_token_ids + ep.token_ids for ep in live], params)
        return [ep for ep, out in zip(live, outputs) if self.advance(ep, out.outputs[0])]


def _score_all(env: MultiTurnEnvironment, episodes: list[Episode]) -> None:
    """Attach every episode's score (one `score_episodes` call when the environment has it), then tear it down."""
    batch = getattr(env, "score_episodes", None)  # optional: scores all of a call's episodes at once
    scores = _score_batch(env, batch, episodes) if callable(batch) else [_score_episode(env, ep) for ep in episodes]
    for ep, sc in zip(episodes, scores):
        ep.score = sc
        _teardown(env, ep)


def with_opening(task: Task, text: str, sep: str = "\n\n") -> Task:
    """`task` with `text` appended to its last user turn after `sep` (none when that turn is empty; a string prompt
    is that turn). A tool class's environment passes sep="" (`envs.agent.ToolEnv.opening_sep`): TRL appends what
    `reset` returns as it is, so an empty prompt becomes exactly that text."""
    if isinstance(task.prompt, str):
        return dataclasses.replace(task, prompt=f"{task.prompt}{sep if task.prompt else ''}{text}")
    msgs = [dict(m) for m in task.prompt]
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = f"{m['content']}{sep if m['content'] else ''}{text}"
            break
    else:
        msgs.append({"role": "user", "content": text})
    return dataclasses.replace(task, prompt=msgs)


def _score_batch(env: MultiTurnEnvironment, score_episodes: Callable[[list[EpisodeState]], Sequence[Score]],
                 episodes: list[Episode]) -> list[Score]:
    """`env.score_episodes` (`score_episodes`) once for all episodes; an episode whose step raised stays errored with that reason."""
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
        states = [_state_of(episodes[i]) for i in todo]
        for i, st in zip(todo, states):  # what the episode was, as text: the policy's turns and the replies
            st.data["episode_texts"] = [(r, t) for r, t in episodes[i].texts if r != "prompt"]  # (never for tokens)
        try:
            got = list(score_episodes(states))
            if len(got) != len(todo):
                raise ValueError(f"score_episodes returned {len(got)} scores for {len(todo)} episodes")
        except Exception as e:  # noqa: BLE001 - errored scores, never a silent zero
            got = [Score(0.0, error=describe(e)) for _ in todo]
        for i, sc in zip(todo, got):
            out[i] = sc
    return [s if s is not None else Score(0.0, error="episode was not scored") for s in out]


def _teardown(env: MultiTurnEnvironment, ep: Episode) -> None:
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


def _step_with_timeout(env: MultiTurnEnvironment, state: EpisodeState, text: str,
                       timeout_s: float | None) -> Reply | None:
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
    reply: Reply | None = box.get("reply")
    return reply


def _describe_safe(e: BaseException, describe: Callable[[BaseException], str]) -> str:
    """`describe(e)`, or the exception's type alone when its message itself cannot be made."""
    try:
        return describe(e)
    except Exception:  # noqa: BLE001 - e.g. an exception carrying an int past the digit limit
        return type(e).__name__


def _generate(engine: BatchGenerator, prompts: list[list[int]], params: list[SamplingParams]) -> list[RequestOutput]:
    """One engine call for the whole round: one params when all agree, else one per prompt (the engine protocol
    takes either), so every live episode decodes in the same batch."""
    if all(p == params[0] for p in params):
        return list(engine.generate(prompts, params[0]))
    return list(engine.generate(prompts, params))


def _advance(ep: Episode, out: CompletionOutput, env: MultiTurnEnvironment, tokenizer: Tokenizer, max_turns: int,
             max_total_tokens: int, want_logprobs: bool, format_reply: ReplyFormatter,
             turn_timeout_s: float | None = None, turn_end_ids: frozenset[int] = frozenset()) -> bool:
    """Append one policy turn and the environment's reply; True while the episode goes on."""
    ids, text = _append_policy_turn(ep, out, tokenizer, want_logprobs)
    if out.finish_reason in ("abort", "length"):
        ep.finish_reason = out.finish_reason
        # NOTE: the environment's step never sees this turn, so its transcript gets it here: a reward reading the
        # episode's turns (envs.agent) scores what the policy wrote, cut or not.
        if ep.state is not None:
            ep.state.transcript.append(("policy", text))
        return False
    state = _state_of(ep)
    try:
        reply = _step_with_timeout(env, state, text, turn_timeout_s)
    except Exception as e:  # noqa: BLE001 - the episode ends; scoring records the reason
        from rollwise.rewards.base import describe

        # NOTE: not "abort": the policy's turn was generated in full and the environment failed on it (a gym step
        # raising on the policy's text, or running past its timeout). That is the episode's outcome: errored with
        # the reason, and trained on as a wrong answer (`filter.FINISHED`), never left out of the loss.
        ep.finish_reason = "stop"
        state.data["step_error"] = _describe_safe(e, describe)
        return False
    eos = getattr(tokenizer, "eos_token_id", None)
    if reply is None or (eos is not None and ids and ids[-1] == eos and eos not in turn_end_ids):
        # NOTE: a policy turn that ended with EOS ends the episode even if it also made a call: nothing may
        # follow EOS in a trained sequence. The environment still saw the turn (it may hold the answer). The chat
        # template's end-of-turn token (`turn_end_ids`) is not such an EOS: the template puts turns after it.
        ep.finish_reason = "stop"
        return False
    if not _append_reply(ep, reply, list(format_reply(reply, ids)), tokenizer, max_total_tokens):
        ep.finish_reason = "length"
        return False
    if ep.turns >= max_turns:
        ep.finish_reason = "max_turns"
        return False
    return True


def _append_policy_turn(ep: Episode, out: CompletionOutput, tokenizer: Tokenizer,
                        want_logprobs: bool) -> tuple[list[int], str]:
    """Append a policy turn's tokens as the engine returned them (loss mask 1, their behaviour log-probs and weight
    versions); its (ids, text)."""
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
    return ids, text


def _append_reply(ep: Episode, reply: Reply, reply_ids: list[int], tokenizer: Tokenizer,
                  max_total_tokens: int) -> bool:
    """Append an environment reply's ids (loss mask 0, log-prob 0.0), cut at the token budget; False when the
    budget is reached."""
    room = max_total_tokens - ep.total_tokens
    cut = reply_ids[:room]
    ep.token_ids += cut
    ep.loss_mask += [0] * len(cut)
    ep.logprobs += [0.0] * len(cut)
    ep.weight_versions += [ENV_WEIGHT_VERSION] * len(cut)
    shown = reply if isinstance(reply, str) else "\n".join(str(m.get("content", "")) for m in reply)
    ep.texts.append(("env", shown if len(cut) == len(reply_ids) else tokenizer.decode(cut)))
    return not (len(cut) < len(reply_ids) or ep.total_tokens >= max_total_tokens)
