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

Deliberately left out: streaming / async rounds (the controller owns scheduling) and chat templates
(prompts are the task's text; wrap the tokenizer to add one).
"""

from __future__ import annotations

import dataclasses
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
    sampling_params: SamplingParams,
    max_turns: int = 4,
    max_total_tokens: int = 1024,
) -> list[Episode]:
    """Run `sampling_params.n` episodes per task; returns them task-major (task 0's samples first).

    `engine.generate(list[list[int]], SamplingParams) -> list[RequestOutput]`; `tokenizer.encode(text)`
    and `tokenizer.decode(ids)`. If the environment has a `stop` attribute, its strings are added to the
    sampling params' stop strings so a policy turn ends at a tool call's closing tag.
    """
    if max_turns < 1:
        raise ValueError(f"run_episodes: max_turns must be >= 1, got {max_turns}")
    if max_total_tokens < 2:
        raise ValueError(f"run_episodes: max_total_tokens must be >= 2, got {max_total_tokens}")
    if not tasks:
        return []
    stops = list(sampling_params.stop or []) + [s for s in getattr(env, "stop", ()) if s not in (sampling_params.stop or [])]
    episodes: list[Episode] = []
    for task in tasks:
        prompt_ids = _encode_prompt(tokenizer, task.prompt)
        if len(prompt_ids) >= max_total_tokens:
            raise ValueError(f"task {task.id}: prompt has {len(prompt_ids)} tokens, max_total_tokens is {max_total_tokens}")
        for j in range(sampling_params.n):
            ep = Episode(task=task, sample_index=j, prompt_token_ids=prompt_ids, state=env.reset(task))
            ep.texts.append(("prompt", task.prompt))
            episodes.append(ep)

    # Round 1: each task's prompt once with n samples (one shared prefill, the engine's own seeding).
    first = [dataclasses.replace(sampling_params, stop=stops or None,
                                 max_tokens=min(sampling_params.max_tokens, max_total_tokens - len(episodes[i * sampling_params.n].prompt_token_ids)))
             for i in range(len(tasks))]
    outputs = _generate(engine, [episodes[i * sampling_params.n].prompt_token_ids for i in range(len(tasks))], first)
    live: list[Episode] = []
    for i, out in enumerate(outputs):
        if len(out.outputs) != sampling_params.n:
            raise ValueError(f"engine returned {len(out.outputs)} samples for task {tasks[i].id}, expected n={sampling_params.n}")
        for j, sample in enumerate(out.outputs):
            ep = episodes[i * sampling_params.n + j]
            if _advance(ep, sample, env, tokenizer, max_turns, max_total_tokens, sampling_params.logprobs):
                live.append(ep)
    # Later rounds: one sample per episode. NOTE: with a seed, each sample index gets its own seed stream
    # (episodes with identical histories must not be forced into identical continuations), which costs one
    # engine call per distinct sample index; without a seed every live episode goes in one call.
    while live:
        params = []
        for ep in live:
            seed = None if sampling_params.seed is None else sampling_params.seed + 1_000_003 * ep.turns + ep.sample_index
            params.append(dataclasses.replace(sampling_params, n=1, stop=stops or None, seed=seed,
                                              max_tokens=min(sampling_params.max_tokens, max_total_tokens - ep.total_tokens)))
        outputs = _generate(engine, [ep.prompt_token_ids + ep.token_ids for ep in live], params)
        live = [ep for ep, out in zip(live, outputs)
                if _advance(ep, out.outputs[0], env, tokenizer, max_turns, max_total_tokens, sampling_params.logprobs)]
    for ep in episodes:
        ep.score = _score_episode(env, ep)
    return episodes


def _generate(engine: Any, prompts: list[list[int]], params: list[SamplingParams]) -> list[Any]:
    """One engine call when all params agree (the usual case), else one call per distinct params."""
    if all(p == params[0] for p in params):
        return list(engine.generate(prompts, params[0]))
    outs: list[Any] = [None] * len(prompts)
    groups: dict[int, list[int]] = {}
    keys: list[SamplingParams] = []
    for i, p in enumerate(params):
        k = next((ki for ki, kp in enumerate(keys) if kp == p), None)
        if k is None:
            keys.append(p)
            k = len(keys) - 1
        groups.setdefault(k, []).append(i)
    for k, idx in groups.items():
        for i, o in zip(idx, engine.generate([prompts[i] for i in idx], keys[k])):
            outs[i] = o
    return outs


def _advance(ep: Episode, out: Any, env: Any, tokenizer: Any, max_turns: int, max_total_tokens: int, want_logprobs: bool) -> bool:
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
    if out.finish_reason == "abort":
        ep.finish_reason = "abort"
        return False
    if out.finish_reason == "length":
        ep.finish_reason = "length"
        return False
    try:
        reply = env.step(ep.state, text)
    except Exception as e:  # noqa: BLE001 - the episode ends; scoring records the reason
        from rollwise.rewards.base import describe

        ep.finish_reason = "abort"
        ep.state.data["step_error"] = describe(e)  # type: ignore[union-attr]
        return False
    eos = getattr(tokenizer, "eos_token_id", None)
    if reply is None or (eos is not None and ids and ids[-1] == eos):
        # NOTE: a policy turn that ended with EOS ends the episode even if it also made a call: nothing may
        # follow EOS in a trained sequence. The environment still saw the turn (it may hold the answer).
        ep.finish_reason = "stop"
        return False
    reply_ids = encode_reply(tokenizer, reply)
    room = max_total_tokens - ep.total_tokens
    cut = reply_ids[:room]
    ep.token_ids += cut
    ep.loss_mask += [0] * len(cut)
    ep.logprobs += [0.0] * len(cut)
    ep.weight_versions += [ENV_WEIGHT_VERSION] * len(cut)
    ep.texts.append(("env", reply if len(cut) == len(reply_ids) else tokenizer.decode(cut)))
    if len(cut) < len(reply_ids) or ep.total_tokens >= max_total_tokens:
        ep.finish_reason = "length"
        return False
    if ep.turns >= max_turns:
        ep.finish_reason = "max_turns"
        return False
    return True
