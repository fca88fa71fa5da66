"""Plain dataclasses that cross rollwise's stage boundaries.

No torch here: these objects travel between the engine, environments, the controller, the store and the
trainer, and across process boundaries (Ray, HTTP), so they hold lists, numbers and strings only.

Deliberately left out: anything tensor-shaped (that is `train.batch.TrainBatch`) and engine internals
(`engine.request.Sequence`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]
RolloutStatus = Literal["kept", "filtered", "errored", "truncated", "aborted"]
ROLLOUT_STATUSES: tuple[str, ...] = ("kept", "filtered", "errored", "truncated", "aborted")


@dataclass
class Task:
    """One problem (lives here, below envs and rewards, which both use it): what the policy sees (`prompt`), what scoring needs (`answer`, `metadata`).

    `prompt` is text (under a chat template it becomes the user message) or a list of chat messages
    `[{"role": ..., "content": ...}, ...]`; `rollwise.models.prompting.PromptFormat` turns either into token ids.
    """

    id: str
    prompt: str | list[dict[str, Any]]
    answer: Any
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TreeSpec:
    """Tree rollouts (docs/tree.md): a request's `n` samples grow as a tree instead of independently.

    The first `roots` samples start from the prompt; every other sample j is a child of a sample planned in advance
    (BFS order: each sample's k-th branch point gives birth to its k-th child). A sample branches at most once per
    window of `segment_tokens` output tokens: at the window's first position whose next-token entropy (of the
    temperature-scaled distribution) is at least `entropy_threshold` nats ('entropy'), else at the window's end
    ('fixed' branches only there). A child shares its parent's tokens before the branch position and samples its own
    from there with its own seed, so each sample is, marginally, an ordinary sample of the policy. A parent that
    ends before a child's branch point hands that child a copy of itself (no generation, `tree_fork` = its length).
    A root's first window may differ (`first_segment_tokens`), e.g. longer, so the first branch comes after the opening."""

    branch: Literal["entropy", "fixed"] = "entropy"
    fanout: int = 2
    """Children per branch point, the parent's own continuation included (2 = a binary tree)."""
    segment_tokens: int = 8
    entropy_threshold: float = 1.0
    roots: int = 1
    first_segment_tokens: int | None = None
    """A root's first window (None = segment_tokens); with 'fixed', no leaf branches before it."""

    def __post_init__(self) -> None:
        if self.branch not in ("entropy", "fixed"):
            raise ValueError(f"tree.branch must be 'entropy' or 'fixed', got {self.branch!r}")
        for name in ("fanout", "segment_tokens", "roots", "first_segment_tokens"):
            v = getattr(self, name)
            if v is None and name == "first_segment_tokens":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < (2 if name == "fanout" else 1):
                raise ValueError(f"tree.{name} must be an integer >= {2 if name == 'fanout' else 1}, got {v!r}")
        if not isinstance(self.entropy_threshold, (int, float)) or not self.entropy_threshold >= 0:
            raise ValueError(f"tree.entropy_threshold must be a number >= 0, got {self.entropy_threshold!r}")

    def parents(self, n: int) -> list[int | None]:
        """The plan: parent slot of each of `n` samples (None for roots). BFS over branch points: at every level
        each sample already planned gets `fanout - 1` more children, in slot order, until `n` slots are planned."""
        plan: list[int | None] = [None] * min(self.roots, n)
        while len(plan) < n:
            for parent in range(len(plan)):
                for _ in range(self.fanout - 1):
                    if len(plan) < n:
                        plan.append(parent)
        return plan


@dataclass
class SamplingParams:
    """How to sample one request. Validated at construction so bad values fail where they enter."""

    n: int = 1
    """Number of samples per prompt; they share one prefill of the prompt."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 (or 0) disables top-k."""
    max_tokens: int = 16
    stop_token_ids: list[int] | None = None
    """Token ids that end a sample (besides EOS unless `ignore_eos`); the stop token is kept in the output."""
    stop: list[str] | None = None
    """Stop strings: the sample ends once its decoded text contains one; the text is cut before it."""
    seed: int | None = None
    """Per-request seed: same seed, same prompt, same weights -> same output, whatever else is batched."""
    logprobs: bool = True
    ignore_eos: bool = False
    tree: TreeSpec | None = None
    """Grow the `n` samples as a tree (`TreeSpec`); None = independent samples."""

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be a positive integer, got {self.n!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or a non-negative integer, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.stop is not None and isinstance(self.stop, str):
            self.stop = [self.stop]


@dataclass
class CompletionOutput:
    """One sample of a request."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    """Log-prob of each sampled token under the sampling distribution (logits / temperature), float32."""
    finish_reason: FinishReason | None
    text: str = ""
    weight_versions: list[int] = field(default_factory=list)
    """Engine weight version that produced each token (differs within a sample resumed across updates)."""
    tree_parent: int | None = None
    """Tree rollouts: the index of the sample this one branched from (None: a root, or not a tree)."""
    tree_fork: int | None = None
    """Tree rollouts: the output position where this sample's own tokens start; the tokens before it are its
    parent's (equal to len(token_ids) for a copy of a parent that ended before the branch point)."""


@dataclass
class RequestOutput:
    """All samples of one prompt, in order."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt: str | None = None

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


@dataclass
class Score:
    """What a reward function says of one completion. `error` set means the score is not a real zero."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def errored(self) -> bool:
        return self.error is not None


@dataclass
class RolloutSegment:
    """One more token sequence of an episode whose model calls did not all extend one sequence (docs/agents.md).

    An agent's episode is trained as one sequence when every call's prompt extends an earlier call's prompt and
    completion; a call that does not (the agent rewrote its history, or opened another conversation) starts a
    segment. The rollout's own fields hold the first sequence; `Rollout.segments` the others, in call order. Every
    segment shares its episode's reward and advantage: one outcome per episode."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]  # [len(completion_token_ids)] behaviour log-probs (0.0 for env tokens)
    weight_versions: list[int]  # [len(completion_token_ids)]
    loss_mask: list[int]  # [len(completion_token_ids)] 1 = generated by the policy, 0 = tokens the agent added
    reason: str = ""
    """Why this call started a sequence of its own instead of extending one (never empty for a stored segment)."""


@dataclass
class Rollout:
    """One sampled completion with everything needed to train on it and to audit it later."""

    prompt_id: str
    group_id: str
    sample_index: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]  # [len(completion_token_ids)] behaviour log-probs (0.0 for env tokens)
    weight_versions: list[int]  # [len(completion_token_ids)]
    loss_mask: list[int]  # [len(completion_token_ids)] 1 = generated by the policy, 0 = environment tokens
    text: str = ""
    finish_reason: str | None = None
    reward: float | None = None
    reward_parts: dict[str, float] = field(default_factory=dict)
    advantage: float | None = None
    status: RolloutStatus = "kept"
    status_reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    env_info: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    step: int = 0
    tree_parent: int | None = None
    """Tree rollouts: sample index (in the group) of the sample this one branched from; None for roots and plain
    samples."""
    tree_fork: int | None = None
    """Tree rollouts: the completion position where this sample's own tokens start (`CompletionOutput.tree_fork`)."""
    token_advantages: list[float] | None = None
    """Per-token advantages [len(completion_token_ids)] when the estimator gives them (`algo.advantage: tree`);
    None = `advantage` applies to every token."""
    segments: list[RolloutSegment] | None = None
    """An agent episode's further sequences (`RolloutSegment`), trained beside the first with this rollout's
    advantage; None = the rollout is one sequence."""

    @property
    def num_generated(self) -> int:
        return int(sum(self.loss_mask)) + sum(int(sum(s.loss_mask)) for s in self.segments or ())

    @property
    def completion_len(self) -> int:
        """Completion tokens of every sequence: an agent episode's segments count beside its first."""
        return len(self.completion_token_ids) + sum(len(s.completion_token_ids) for s in self.segments or ())

    def sequences(self) -> list[Rollout]:
        """The token sequences to train on: this rollout alone, or its first sequence and one per segment, each a
        plain Rollout with this rollout's reward, status and advantage (what `train.batch.TrainBatch` lays out)."""
        if not self.segments:
            return [self]
        first = dataclasses.replace(self, segments=None)
        out = [first]
        for s in self.segments:
            out.append(dataclasses.replace(
                first, prompt_token_ids=list(s.prompt_token_ids), completion_token_ids=list(s.completion_token_ids),
                logprobs=list(s.logprobs), weight_versions=list(s.weight_versions), loss_mask=list(s.loss_mask),
                token_advantages=None if self.token_advantages is None else
                [float(self.advantage or 0.0)] * len(s.completion_token_ids)))
        return out

    @property
    def has_signal(self) -> bool:
        """Whether training on it moves the policy: some advantage is non-zero (per token when it has them: a tree
        rollout whose GRPO scalar is 0 can still carry credit at its branch points)."""
        if self.token_advantages is not None:
            return any(a != 0 for a in self.token_advantages)
        return abs(self.advantage or 0.0) > 0


def rollout_status(finish_reason: str | None, score: Score | None, max_tokens: int | None = None) -> tuple[str, str]:
    """(status, reason) of one sample or episode: the one place that decides it.

    errored (scoring, or the environment, failed: no reward, never a silent 0) > aborted (stopped before it
    finished, and not scored) > truncated (hit max_tokens, or an episode's turn or token limit; scored as it stands)
    > kept. 'filtered' is set later, by whoever filters (zero-variance groups, dynamic sampling)."""
    if score is not None and score.error is not None:
        return "errored", score.error
    if finish_reason == "abort":
        return "aborted", "aborted before it finished"
    if score is None:
        raise RuntimeError("a finished sample was never scored (a bug in the caller)")
    if finish_reason == "length":
        return "truncated", f"hit max_tokens={max_tokens}" if max_tokens else "hit the token limit"
    if finish_reason == "max_turns":
        return "truncated", "hit the turn limit"
    return "kept", ""


def make_rollout(task: Task, group_id: str, index: int, prompt_token_ids: list[int], *, token_ids: list[int],
                 logprobs: list[float], weight_versions: list[int], finish_reason: str | None, text: str,
                 score: Score | None, step: int, seed: int | None = None, max_tokens: int | None = None,
                 loss_mask: list[int] | None = None, timings: dict[str, float] | None = None,
                 env_info: dict[str, Any] | None = None, tree_parent: int | None = None,
                 tree_fork: int | None = None, segments: list[RolloutSegment] | None = None) -> Rollout:
    """The one constructor of a Rollout from what was generated and its score (status by `rollout_status`);
    used by the rollout controller and by multi-turn episodes alike."""
    status, reason = rollout_status(finish_reason, score, max_tokens)
    scored = status != "aborted" and score is not None and score.error is None
    n = len(token_ids)
    info = {k: v for k, v in (score.info if score is not None else {}).items() if isinstance(v, (int, float, str, bool))}
    return Rollout(
        prompt_id=task.id, group_id=group_id, sample_index=index, prompt_token_ids=list(prompt_token_ids),
        completion_token_ids=list(token_ids), logprobs=list(logprobs),
        weight_versions=list(weight_versions) or [0] * n, loss_mask=list(loss_mask) if loss_mask is not None else [1] * n,
        text=text, finish_reason=finish_reason, reward=float(score.value) if scored else None,  # type: ignore[union-attr]
        reward_parts=dict(score.parts) if score is not None and status != "aborted" else {},
        status=status, status_reason=reason, step=step, seed=seed, timings=dict(timings or {}),  # type: ignore[arg-type]
        env_info={**info, **(env_info or {})}, tree_parent=tree_parent, tree_fork=tree_fork,
        segments=list(segments) if segments else None,
    )


@dataclass
class RolloutGroup:
    """The samples of one prompt: the unit GRPO-style advantages are computed over."""

    prompt_id: str
    group_id: str
    rollouts: list[Rollout]
    dropped: str = ""
    """Why the group was dropped from training ('' = it was not); set by `rollwise.filter.mark`, which, like every
    decision after scoring (zero variance, what trains), lives in the Filter room, not here."""

    @property
    def rewards(self) -> list[float]:
        return [r.reward if r.reward is not None else 0.0 for r in self.rollouts]


ScoreItem = tuple[Task, str, list[int]]
"""One completion to score: its task, its text and its token ids (a batch scorer passes the ids on as TRL's
`completion_ids`; `rewards.concurrent.score_many` takes these)."""
Scorer = Callable[[list[ScoreItem]], list[Score]]
"""`scorer(items) -> scores`, in input order: the controller's scoring (in-process `score_many`, or the Ray backend's
scoring actors)."""


@runtime_checkable
class Tokenizer(Protocol):
    """What rollwise asks of a tokenizer: a `transformers` tokenizer (fast or slow) has all of it.

    It lives here, beside the plain types, because every layer that turns text into ids takes one (the engine,
    prompting, environments, the controller, the trainer) and none of them may depend on `transformers` to name it.
    `apply_chat_template` is called with a conversation and keyword options (`tokenize=`, `add_generation_prompt=`,
    `tools=`); the result is ids or text as `tokenize` asks.
    """

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def bos_token_id(self) -> int | None: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False, **kwargs: Any) -> Any:
        """Text of a flat list of ids (a `str`; transformers types it wider, as it also decodes batches)."""
        ...

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def __len__(self) -> int:
        """The vocabulary, added tokens included (the bound on the token ids a server may send)."""
        ...
