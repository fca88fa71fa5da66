"""The rollout controller: decide what to generate each step, and account for every token of it.

The idea. A step asks the controller for a batch of scored `RolloutGroup`s. The controller hands a *policy*
(one module each: uniform, dynamic, adaptive, early_stop, partial) a `StepContext` with everything it may use
(an engine `Driver`, a source of tasks already filtered by the optional prompt selector, the sampling params,
scoring) and gets groups back. It then checks that every rollout has a status and that the token ledger
balances, and keeps cross-step state (the pass-rate posterior, partial samples carried to the next step).

The controller runs every step of every loop (uniform is the default policy), on any engine of
`engine.protocol`. Two engine shapes are supported by the `Driver`:
- step-level (`add_request` / `step` / `abort`, i.e. `EngineCore` or `llm.engine`): the samples of a group go
  in one request (n = K, one prefill of the prompt, a seed derived from the step, the group and the first
  sample's index), or one request per sample where a policy must see, score or abort each on its own
  (early_stop) or where per-sample params are set; the driver measures how much of the engine's batch sits
  empty while the long tail finishes;
- batch (`generate`: `RemoteEngine`, `MultiEngine`, `RayEngines`): whole batches. Remote engines also offer the
  step-level interface over streaming requests (`stepwise()`), opened only when a policy submits (early_stop,
  partial); Ray engine actors do not, and the config refuses those two policies there.

Every sample becomes a `Rollout` through one function, `make_rollout`, which decides its status.

NOTE on the token ledger (checked every step by `Accounting.check`):
    generated_tokens = rollout_tokens - shared_tokens + carried_out_tokens - carried_in_tokens
where rollout_tokens counts every policy-generated completion token of the step's rollouts (any status, aborted
included; a multi-turn episode's environment tokens, loss mask 0, are not generated), shared_tokens those a tree
rollout took from its parent (`Rollout.tree_fork`: generated once, for the parent), and carried_* count the tokens of samples held over between steps (partial rollouts). The rollout counts add
up too: kept + filtered + errored + truncated + aborted = rollouts.

Deliberately left out: cross-step scheduling of the trainer (that is the async loop) and any knowledge of
advantages beyond "which groups have zero reward variance" (advantages are computed by the loop, after).
"""

from __future__ import annotations

import dataclasses
import math
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollwise import filter as room
from rollwise.engine.protocol import step_engine
from rollwise.rewards.concurrent import score_many
from rollwise.types import (ROLLOUT_STATUSES, CompletionOutput, RequestOutput, Rollout, RolloutGroup, SamplingParams,
                            Score, Task, make_rollout)

TaskSource = Callable[[int], list[Task]]
"""`take(k)` -> the next k training tasks (the loop's seeded, resumable data order)."""
ParamsFn = Callable[[Task, int, SamplingParams], SamplingParams]
"""Per-sample sampling params override `(task, sample_index, base) -> params` (benches draw lengths with it); when
set, every sample is its own request, so each can get its own params."""


# ------------------------------------------------------------------------------------------------- accounting


@dataclass
class Accounting:
    """Where one step's rollouts and tokens went. Every count is per step; `check` proves they add up."""

    rollouts: dict[str, int] = field(default_factory=lambda: {s: 0 for s in ROLLOUT_STATUSES})
    """Rollouts by final status (kept / filtered / errored / truncated / aborted)."""
    groups: int = 0
    """Groups returned this step."""
    zero_variance_groups: int = 0
    """Returned groups whose valid rewards are all equal (no GRPO signal)."""
    generated_tokens: int = 0
    """Tokens the engine produced during this step (for every sample, finished, aborted or carried)."""
    rollout_tokens: int = 0
    """Completion tokens of this step's rollouts, any status."""
    aborted_tokens: int = 0
    """Completion tokens of rollouts the controller aborted (status 'aborted'): spent, never trained."""
    shared_tokens: int = 0
    """Completion tokens of tree rollouts that are their parent's (generated once, counted in rollout_tokens for
    every leaf that shares them)."""
    carried_in_tokens: int = 0
    """Tokens of samples carried into this step from earlier ones (partial rollouts)."""
    carried_out_tokens: int = 0
    """Tokens of unfinished samples carried from this step into the next one."""
    useful_tokens: int = 0
    """Tokens of trainable rollouts with a non-zero advantage (filled by `finalize`, after advantages)."""
    trained_tokens: int = 0
    """Tokens of trainable (kept / truncated) rollouts."""
    skipped_prompts: int = 0
    """Prompts the selector skipped (posterior: almost surely all-correct or all-wrong)."""
    prompts: int = 0
    """Prompts sampled this step (a prompt refilled by dynamic sampling counts again)."""
    rounds: int = 0
    """Generation rounds (dynamic sampling and adaptive refill in rounds)."""
    direct_groups: int = 0
    """adaptive: groups sampled in full at once because the prompt was believed mixed (no pilot)."""
    gen_s: float = 0.0
    """Wall time in the engine."""
    score_s: float = 0.0
    """Wall time scoring."""
    idle_s: float = 0.0
    """Engine time left idle waiting for the long tail: sum over engine steps of step time x the fraction of
    the step's batch capacity (the most samples in flight at once this step) that was empty. 0 for batch-only
    engines, where it cannot be observed."""
    staleness_mean: float = 0.0
    """Mean age, in weight versions, of the trained tokens (version trained - version that sampled them)."""
    staleness_max: int = 0
    """Largest such age."""
    spec_acceptance: float | None = None
    """Speculative rollouts (rollout.speculative; None when off): accepted / tested draft tokens this step."""
    spec_tokens_per_forward: float | None = None
    """Tokens a sample gained per engine decode step it was in (1.0 = no gain from drafts)."""
    spec_saved_s: float | None = None
    """Estimated engine seconds saved by drafts (engine.speculative.SpecStats.saved_s_est)."""

    def check(self) -> None:
        """Raise if the ledger does not balance (a bug in a policy, never a user error)."""
        if (self.generated_tokens
                != self.rollout_tokens - self.shared_tokens + self.carried_out_tokens - self.carried_in_tokens):
            raise AssertionError(
                f"token ledger does not balance: generated {self.generated_tokens} != rollouts {self.rollout_tokens}"
                f" - shared {self.shared_tokens} + carried out {self.carried_out_tokens} - carried in {self.carried_in_tokens}")

    @property
    def total_rollouts(self) -> int:
        return sum(self.rollouts.values())

    def metrics(self) -> dict[str, float]:
        """Flat `control_*` metrics for metrics.jsonl (staleness under the loop's own key names)."""
        m: dict[str, float] = {f"control_{k}": float(getattr(self, k)) for k in (
            "groups", "zero_variance_groups", "generated_tokens", "aborted_tokens", "shared_tokens", "carried_in_tokens",
            "carried_out_tokens", "useful_tokens", "skipped_prompts", "prompts", "rounds", "direct_groups", "idle_s")}
        m["control_zero_var_frac"] = self.zero_variance_groups / max(self.groups, 1)
        m["control_tokens_per_useful_group"] = self.generated_tokens / max(self.groups - self.zero_variance_groups, 1)
        m["control_gen_tokens_per_useful_token"] = self.generated_tokens / max(self.useful_tokens, 1)
        m["staleness_mean"] = self.staleness_mean
        m["staleness_max"] = float(self.staleness_max)
        for k in ("spec_acceptance", "spec_tokens_per_forward", "spec_saved_s"):
            if getattr(self, k) is not None:
                m[f"control_{k}"] = float(getattr(self, k))
        return m


# ------------------------------------------------------------------------------------------------- the engine


@dataclass
class SampleRequest:
    """Samples start .. start+count-1 of one group as one engine request (they share the prompt's prefill)."""

    group_id: str
    start: int
    count: int
    prompt_token_ids: list[int]
    params: SamplingParams
    """n == count; a seed of its own (see `sample_params`)."""
    partial: list[CompletionOutput] | None = None
    """Resume these aborted samples instead of starting fresh (partial rollouts)."""
    submitted_at: float = 0.0
    """perf_counter() when the request went to the engine (for the rollouts' `timings`)."""
    drafts: Any = None
    """Speculative rollouts: an `engine.speculative.DraftSpec` for the engine (step-level engines only)."""

    @property
    def request_id(self) -> str:
        return f"{self.group_id}/{self.start}"


class Driver:
    """Runs requests on an engine and keeps the books: engine time, generated tokens, idle batch capacity."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.core = step_engine(engine)
        # A batch engine that can also stream (RemoteEngine, MultiEngine of them) offers its step-level interface
        # through `stepwise()`; it is opened only when a policy submits (batch policies keep batched generate).
        self._stepwise_factory = getattr(engine, "stepwise", None) if self.core is None else None
        if self.core is None and not callable(getattr(engine, "generate", None)):
            raise ValueError(f"{type(engine).__name__} is not an engine: it has neither add_request/step/abort nor generate")
        self.inflight: dict[str, tuple[SampleRequest, int]] = {}  # request id -> (request, tokens at submit)
        self.reset()

    def reset(self) -> None:
        self.gen_s = 0.0
        self.idle_s = 0.0
        self.generated_tokens = 0
        self._peak = 0
        self._spec0 = self._spec_counts()

    def _spec_counts(self) -> tuple[float, ...] | None:
        sp = getattr(getattr(self.core, "stats", None), "spec", None)
        if sp is None:
            return None
        return (sp.accepted_tokens, sp.tested_tokens, sp.decode_emitted, sp.decode_seq_steps, sp.saved_s_est)

    def spec_books(self) -> tuple[float, float, float, float] | None:
        """(acceptance, tokens per forward, seconds saved, draft tokens tested) of the drafts verified since `reset`;
        None if none were."""
        now, before = self._spec_counts(), self._spec0
        if now is None or before is None:
            return None
        acc, tested, emitted, seq_steps, saved = (a - b for a, b in zip(now, before))
        if not tested:
            return None
        return acc / tested, emitted / max(seq_steps, 1), saved, tested

    @property
    def stepwise(self) -> bool:
        return self.core is not None or callable(self._stepwise_factory)

    @property
    def speculative(self) -> bool:
        """Drafts can be verified: the in-process step engine only."""
        return self.core is not None and self._stepwise_factory is None

    @property
    def weight_version(self) -> int:
        src = self.core if self.core is not None else self.engine
        return int(getattr(src, "weight_version", 0))

    def _live_samples(self) -> int:
        """Samples still generating: the engine's own count when it has one, else the in-flight requests' sizes."""
        for src in (getattr(self.core, "scheduler", None), self.core):
            n = getattr(src, "num_unfinished_seqs", None)
            if isinstance(n, int):
                return n
        return sum(r.count for r, _ in self.inflight.values())

    def submit(self, req: SampleRequest) -> None:
        if self.core is None and callable(self._stepwise_factory):
            self.core = self._stepwise_factory()
        if self.core is None:
            raise RuntimeError("submit needs a step-level engine (add_request/step/abort)")
        req.submitted_at = time.perf_counter()
        if req.drafts is not None:
            self.core.add_request(req.request_id, req.prompt_token_ids, req.params, partial=req.partial,
                                  drafts=req.drafts)
        else:
            self.core.add_request(req.request_id, req.prompt_token_ids, req.params, partial=req.partial)
        self.inflight[req.request_id] = (req, sum(len(o.token_ids) for o in req.partial or []))
        self._peak = max(self._peak, self._live_samples())

    def step(self) -> list[tuple[SampleRequest, list[CompletionOutput]]]:
        """One engine step; the requests that finished in it (all their samples)."""
        n_before = len(self.inflight)
        live = self._live_samples()
        t0 = time.perf_counter()
        outs = self.core.step()
        dt = time.perf_counter() - t0
        self.gen_s += dt
        if self._peak:
            self.idle_s += dt * (1.0 - min(live, self._peak) / self._peak)
        done = [self._close(o) for o in outs]
        if not outs and n_before and not self.core.has_unfinished():
            raise RuntimeError(f"engine went idle with {n_before} requests in flight")
        return done

    def abort(self, request_id: str) -> tuple[SampleRequest, list[CompletionOutput]] | None:
        """Stop a request now; its partial outputs (unfinished samples: finish_reason 'abort'), or None when it
        was not in flight."""
        if request_id not in self.inflight:
            return None
        out = self.core.abort(request_id)
        if out is None:
            raise RuntimeError(f"engine lost request {request_id!r}")
        return self._close(out)

    def ended_early(self, request_id: str, pending: set[int]) -> tuple[list[int], list[CompletionOutput]]:
        """Samples at positions `pending` of an in-flight request that have ended (a tree's leaves end one by one):
        their positions in the request and their outputs. Nothing on an engine that reports samples only with their
        whole request."""
        finished = getattr(self.core, "finished_slots", None)
        if request_id not in self.inflight or not callable(finished):
            return [], []
        new = [j for j in finished(request_id) if j in pending]
        return (new, list(self.core.snapshot(request_id, new).outputs)) if new else ([], [])

    def _close(self, out: RequestOutput) -> tuple[SampleRequest, list[CompletionOutput]]:
        req, before = self.inflight.pop(out.request_id)
        self.generated_tokens += own_tokens(out.outputs) - before
        if not self.inflight:
            self._peak = 0  # the next wave of submissions sets its own capacity
        return req, list(out.outputs)

    def counting_engine(self) -> Any:
        """The engine's batch `generate`, with the time and tokens booked here (multi-turn episodes call it)."""
        drv = self

        class _Counting:
            tokenizer = getattr(drv.engine, "tokenizer", None)

            def generate(self, prompts: Any, params: Any) -> list[RequestOutput]:
                t0 = time.perf_counter()
                outs = drv.engine.generate(prompts, params)
                drv.gen_s += time.perf_counter() - t0
                drv.generated_tokens += sum(own_tokens(r.outputs) for r in outs)
                return outs

        return _Counting()

    def run(self, reqs: Sequence[SampleRequest]) -> list[list[CompletionOutput]]:
        """Generate every request to completion; outputs in the order of `reqs`."""
        if not reqs:
            return []
        if self.core is None or self._stepwise_factory is not None:  # batch engines: one batched call
            t0 = time.perf_counter()
            for r in reqs:
                r.submitted_at = t0
            outs = self.engine.generate([r.prompt_token_ids for r in reqs], [r.params for r in reqs])
            self.gen_s += time.perf_counter() - t0
            got = [list(o.outputs) for o in outs]
            self.generated_tokens += sum(own_tokens(os_) for os_ in got)
            return got
        for r in reqs:
            self.submit(r)
        done: dict[str, list[CompletionOutput]] = {}
        while len(done) < len(reqs):
            for req, outs in self.step():
                done[req.request_id] = outs
        return [done[r.request_id] for r in reqs]


# ------------------------------------------------------------------------------------------------- the step


def own_tokens(outputs: Sequence[CompletionOutput]) -> int:
    """Tokens the engine generated for these samples: a tree sample's tokens before its fork are its parent's."""
    return sum(len(o.token_ids) - (o.tree_fork or 0) for o in outputs)


def sample_params(base: SamplingParams, group_index: int, start: int, count: int) -> SamplingParams:
    """Params for samples start .. start+count-1 of the step's group `group_index`: n=count and a seed of their own.

    A whole group in one request gets the seed `step_seed * 1_000_003 + group_index` (the engine derives sample j's
    draws from it and j); a request for a later run of samples mixes `start` in, so samples are reproducible and
    distinct within a group however it is split into requests.
    NOTE: one seed shared by every group of a step (vLLM's semantics for one call) would make sample j of every
    group draw the same uniform numbers: a needless correlation across an RL batch."""
    if base.seed is None:
        return dataclasses.replace(base, n=count)
    group_seed = base.seed * 1_000_003 + group_index
    seed = group_seed if start == 0 else (group_seed * 1_000_003 + zlib.crc32(f"{start}".encode())) % (1 << 62)
    return dataclasses.replace(base, n=count, seed=seed)


@dataclass
class PendingGroup:
    """A group being generated: its task, prompt, and samples so far (None = not finished yet)."""

    task: Task
    group_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput | None]
    scores: list[Score | None]
    seed: int | None = None
    """The step's sampling seed (stored on each rollout)."""
    index: int = 0
    """The group's index within its step (seeds its samples: `sample_params`)."""
    gen_s: list[float | None] = field(default_factory=list)
    """Per sample: seconds from its request's submission to its finish (the rollout's timings['generate_s'])."""
    score_s: list[float | None] = field(default_factory=list)
    """Per sample: wall time of the scoring call that scored it (timings['score_s'])."""
    loss_masks: dict[int, list[int]] = field(default_factory=dict)
    """Multi-turn episodes: sample -> loss mask (0 for environment tokens); single-turn samples are all policy."""

    @property
    def size(self) -> int:
        return len(self.outputs)


@dataclass
class StepContext:
    """What a policy may use in one step."""

    driver: Driver
    take: TaskSource
    """Next k tasks, already passed through the prompt selector."""
    params: SamplingParams
    """The step's base sampling params (n = the group size K)."""
    step: int
    batch_groups: int
    """Target number of groups (rollout.prompts_per_step)."""
    encode: Callable[[Task], list[int]]
    score_fn: Callable[[list[tuple[Task, str]]], list[Score]]
    params_fn: ParamsFn | None
    acc: Accounting
    prior: Callable[[str], tuple[float, float]]
    """Beta(a, b) belief about a prompt's pass rate (the posterior when enabled, else the config prior)."""
    rules: room.FilterRules = room.DEFAULT_RULES
    """The Filter room's rules (which groups are informative), the same the loop applies after the step."""
    episodes: Any = None
    """`control.episodes.EpisodeRunner` for a multi-turn environment: samples are whole episodes."""
    drafts: Callable[[str], Any] | None = None
    """Speculative rollouts: `drafts(task_id)` -> the drafts for a new request of that prompt (control/drafts.py)."""
    stop: Stopping | None = None
    """A stopping rule every `generate` runs under (control/early_stop.py `EarlyStop`), whatever the allocation."""
    _next_group: int = 0

    @property
    def group_size(self) -> int:
        return self.params.n

    def new_group(self, task: Task, size: int) -> PendingGroup:
        index = self._next_group
        self._next_group += 1
        self.acc.prompts += 1
        return PendingGroup(task, f"s{self.step}-g{index}", self.encode(task), [None] * size, [None] * size,
                            self.params.seed, index, [None] * size, [None] * size)

    def requests(self, g: PendingGroup, indices: Sequence[int],
                 partial: Sequence[CompletionOutput | None] | None = None) -> list[SampleRequest]:
        """Requests for the given sample indices of a group: one per contiguous run of indices, or one per sample
        when a per-sample params override is set (it may give each sample its own length). `partial[j]` (aligned
        with the group's slots) resumes sample j; a finished one is handed back as it is."""
        idx = sorted(indices)
        if not idx:
            return []
        runs: list[list[int]] = []
        for j in idx:
            if runs and j == runs[-1][-1] + 1 and self.params_fn is None:
                runs[-1].append(j)
            else:
                runs.append([j])
        out = []
        for run in runs:
            sp = sample_params(self.params, g.index, run[0], len(run))
            if self.params_fn is not None:
                sp = self.params_fn(g.task, run[0], sp)
            part = [partial[j] for j in run] if partial is not None else None
            drafts = self.drafts(g.task.id) if self.drafts is not None else None
            out.append(SampleRequest(g.group_id, run[0], len(run), g.prompt_token_ids, sp, part, drafts=drafts))
        return out

    def place(self, g: PendingGroup, req: SampleRequest, outs: list[CompletionOutput],
              positions: Sequence[int] | None = None) -> None:
        """Store a request's outputs into its group's slots; `positions`: the request positions `outs` are (default
        0, 1, ...: all of them)."""
        took = time.perf_counter() - req.submitted_at if req.submitted_at else None
        for i, o in zip(range(len(outs)) if positions is None else positions, outs):
            g.outputs[req.start + i] = o
            g.gen_s[req.start + i] = took

    def score(self, pairs: list[tuple[PendingGroup, int]]) -> None:
        """Score finished, non-aborted samples (concurrently) into their groups."""
        todo = [(g, j) for g, j in pairs if g.outputs[j] is not None and g.outputs[j].finish_reason != "abort"]
        if not todo:
            return
        t0 = time.perf_counter()
        scores = self.score_fn([(g.task, g.outputs[j].text, list(g.outputs[j].token_ids)) for g, j in todo])
        took = time.perf_counter() - t0
        self.acc.score_s += took
        if len(scores) != len(todo):
            raise RuntimeError(f"the scorer returned {len(scores)} scores for {len(todo)} completions")
        for (g, j), s in zip(todo, scores):
            g.scores[j] = s
            g.score_s[j] = took

    def generate(self, groups: Sequence[PendingGroup], indices: Sequence[Sequence[int]] | None = None) -> None:
        """Generate and score the given sample indices of each group (default: all of them) in one batch."""
        idx = indices if indices is not None else [range(g.size) for g in groups]
        if self.stop is not None:
            self.stop.generate(self, groups, idx)
            return
        reqs = [(g, r) for g, js in zip(groups, idx) for r in self.requests(g, js)]
        if self.episodes is not None:
            self._run_episodes(reqs)
            return
        for (g, r), outs in zip(reqs, self.driver.run([r for _, r in reqs])):
            self.place(g, r, outs)
        self.score([(g, j) for g, js in zip(groups, idx) for j in js])

    def _run_episodes(self, reqs: list[tuple[PendingGroup, SampleRequest]]) -> None:
        """Multi-turn: each requested sample is an episode; all of them go through the engine together, round by
        round, and come back scored by the environment."""
        t0 = time.perf_counter()
        eps = self.episodes.run(self.driver.counting_engine(), [g.task for g, _ in reqs], [r.params for _, r in reqs])
        took = time.perf_counter() - t0
        k = 0
        for g, r in reqs:
            for i in range(r.count):
                ep, j = eps[k], r.start + i
                k += 1
                g.outputs[j] = CompletionOutput(j, list(ep.token_ids), list(ep.logprobs), ep.finish_reason,  # type: ignore[arg-type]
                                                "".join(t for role, t in ep.texts if role != "prompt"),
                                                list(ep.weight_versions))
                g.loss_masks[j] = list(ep.loss_mask)
                if ep.score is not None:
                    ep.score.info["turns"] = ep.turns  # lands in the rollout's env_info
                g.scores[j] = ep.score
                g.gen_s[j] = took


def default_encoder(tokenizer: Any) -> Callable[[Task], list[int]]:
    """`encode(task)`: the task's prompt as `models.prompting.PromptFormat()` builds it (the chat template when the
    tokenizer has one; otherwise the text with the tokenizer's default special tokens). The loop passes its own
    encoder, built from `env.chat_template` / `env.system_prompt`."""
    from rollwise.models.prompting import PromptFormat

    return PromptFormat().task_encoder(tokenizer)


def build_group(g: PendingGroup, step: int, max_tokens: int) -> RolloutGroup:
    """Lay a finished pending group out as Rollouts (`make_rollout` decides each status)."""
    rollouts = []
    for j, (o, sc) in enumerate(zip(g.outputs, g.scores)):
        if o is None:
            raise RuntimeError(f"group {g.group_id} sample {j} was never generated")
        t = {k: v for k, v in (("generate_s", g.gen_s[j] if j < len(g.gen_s) else None),
                               ("score_s", g.score_s[j] if j < len(g.score_s) else None)) if v is not None}
        rollouts.append(make_rollout(g.task, g.group_id, j, g.prompt_token_ids, token_ids=o.token_ids,
                                     logprobs=o.logprobs, weight_versions=o.weight_versions,
                                     finish_reason=o.finish_reason, text=o.text, score=sc, step=step, seed=g.seed,
                                     max_tokens=max_tokens, timings=t, loss_mask=g.loss_masks.get(j),
                                     tree_parent=o.tree_parent, tree_fork=o.tree_fork))
    return RolloutGroup(g.task.id, g.group_id, rollouts)


mark = room.mark
"""Re-mark a group's trainable rollouts and drop the group from training: the Filter room's `filter.mark`."""


def informative(group: RolloutGroup, rules: room.FilterRules = room.DEFAULT_RULES) -> bool:
    """A group that carries a GRPO signal, as the Filter room says (`filter.informative`)."""
    return room.informative(group, rules)


class Stopping(Protocol):
    """A stopping rule: generates the requested samples of some groups itself, and may abort them mid-way."""

    def generate(self, ctx: StepContext, groups: Sequence[PendingGroup], indices: Sequence[Sequence[int]]) -> None: ...


class Policy(Protocol):
    """A generation policy: given the step's context, return the step's scored groups."""

    def run(self, ctx: StepContext) -> list[RolloutGroup]: ...


class Selector(Protocol):
    """A prompt selector: skips prompts not worth sampling now, learns from every scored rollout."""

    def skip(self, task_id: str, group_size: int) -> bool: ...

    def observe(self, groups: Sequence[RolloutGroup]) -> None: ...

    def on_weights(self, versions_moved: int) -> None: ...

    def belief(self, task_id: str) -> tuple[float, float]: ...


# ------------------------------------------------------------------------------------------------- controller


@dataclass
class ControlStep:
    """One step's result: the groups (every rollout with a status) and the books."""

    groups: list[RolloutGroup]
    accounting: Accounting


class RolloutController:
    """Runs one policy (and optionally a prompt selector) step after step; owns their cross-step state."""

    def __init__(self, policy: Policy, env: Any, tokenizer: Any, *, selector: Selector | None = None,
                 prior: tuple[float, float] = (0.5, 0.5), max_skip_factor: int = 4, score_workers: int = 8,
                 score_timeout_s: float | None = 30.0, params_fn: ParamsFn | None = None,
                 encode: Callable[[Task], list[int]] | None = None,
                 scorer: Callable[[list[tuple[Task, str]]], list[Score]] | None = None, episodes: Any = None,
                 drafts: Any = None, rules: room.FilterRules | None = None, stop: Stopping | None = None,
                 refill: bool = True) -> None:
        """rules: the Filter room's rules the run applies (which groups are informative; default
        `filter.DEFAULT_RULES`); encode: a task's prompt token ids (default: the tokenizer's plain encoding of
        `task.prompt`);
        scorer: `scorer(items) -> scores` in input order (default: `score_many` over `env` in this process; the
        Ray backend passes its scoring actors); episodes: a `control.episodes.EpisodeRunner` when the environment is
        multi-turn (samples are then whole episodes, scored by the environment); drafts: a `control.drafts.DraftStore`
        for speculative rollouts (fed every step's groups; step-level engines only); stop: a stopping rule
        (`early_stop.EarlyStop`) every policy's generation runs under; refill: replace prompts the selector skips
        (true, the step keeps its size) or not (false: the step samples fewer groups, at least one)."""
        if max_skip_factor < 1:
            raise ValueError(f"max_skip_factor must be >= 1, got {max_skip_factor}")
        self.policy = policy
        self.env = env
        self.tokenizer = tokenizer
        self.encode = encode if encode is not None else default_encoder(tokenizer)
        self.scorer = scorer
        self.episodes = episodes
        self.selector = selector
        self.prior = prior
        self.max_skip_factor = max_skip_factor
        self.score_workers = score_workers
        self.score_timeout_s = score_timeout_s
        self.params_fn = params_fn
        self.drafts = drafts
        self.rules = rules if rules is not None else room.DEFAULT_RULES
        self.stop = stop
        self.refill = refill
        self._driver: Driver | None = None
        self._version: int | None = None

    def _score(self, items: list[tuple[Task, str]]) -> list[Score]:
        if self.scorer is not None:
            return self.scorer(items)
        return score_many(self.env, items, max_workers=max(1, min(self.score_workers, len(items))),
                          timeout_s=self.score_timeout_s)

    def _selecting(self, source: TaskSource, acc: Accounting, group_size: int) -> TaskSource:
        sel = self.selector
        if sel is None:
            return source

        def take(k: int) -> list[Task]:
            out: list[Task] = []
            drawn = 0
            if not self.refill:  # k prompts drawn, the skipped ones not replaced; the first kept if all are skipped
                got = source(k)
                for t in got:
                    if sel.skip(t.id, group_size):
                        acc.skipped_prompts += 1
                    else:
                        out.append(t)
                if not out and got:
                    acc.skipped_prompts -= 1
                    out.append(got[0])
                return out
            while len(out) < k:
                for t in source(k - len(out)):
                    drawn += 1
                    # NOTE: after max_skip_factor x k draws everything is accepted, so a step always fills even
                    # when the selector would skip the whole data set.
                    if drawn <= self.max_skip_factor * k and sel.skip(t.id, group_size):
                        acc.skipped_prompts += 1
                    else:
                        out.append(t)
            return out

        return take

    def run_step(self, engine: Any, source: TaskSource, params: SamplingParams, *, step: int,
                 batch_groups: int) -> ControlStep:
        """Generate and score one step's groups. `params.n` is the group size; `batch_groups` the target."""
        if batch_groups < 1:
            raise ValueError(f"batch_groups must be >= 1, got {batch_groups}")
        if self._driver is None or self._driver.engine is not engine:
            self._driver = Driver(engine)
        drv = self._driver
        drv.reset()
        v = drv.weight_version
        if self.selector is not None and self._version is not None and v != self._version:
            self.selector.on_weights(v - self._version)
        self._version = v
        acc = Accounting()
        sel = self.selector
        ctx = StepContext(drv, self._selecting(source, acc, params.n), params, step, batch_groups, self.encode,
                          self._score, self.params_fn, acc,
                          prior=(sel.belief if sel is not None else (lambda _tid: self.prior)), rules=self.rules,
                          episodes=self.episodes,
                          drafts=self.drafts.for_task if self.drafts is not None and drv.speculative else None,
                          stop=self.stop)
        groups = self.policy.run(ctx)
        acc.gen_s, acc.idle_s, acc.generated_tokens = drv.gen_s, drv.idle_s, drv.generated_tokens
        books = drv.spec_books()
        if books is not None:
            acc.spec_acceptance, acc.spec_tokens_per_forward, acc.spec_saved_s, tested = books
            if self.drafts is not None:  # the next requests' cold-start acceptance estimate
                self.drafts.observe_acceptance(acc.spec_acceptance * tested, tested)
        if self.drafts is not None:
            self.drafts.observe(groups)
        acc.groups = len(groups)
        acc.zero_variance_groups = sum(room.zero_variance(g, self.rules) for g in groups)
        for g in groups:
            for r in g.rollouts:
                if r.status not in acc.rollouts:
                    raise RuntimeError(f"rollout {r.group_id}/{r.sample_index} has unknown status {r.status!r}")
                acc.rollouts[r.status] += 1
                acc.rollout_tokens += sum(r.loss_mask)  # policy tokens (a multi-turn episode's env tokens aside)
                acc.shared_tokens += r.tree_fork or 0
                if r.status == "aborted":
                    acc.aborted_tokens += sum(r.loss_mask)
        acc.check()  # carried_in/out_tokens were set by the policy (partial rollouts), 0 otherwise
        if sel is not None:
            sel.observe(groups)
        return ControlStep(groups, acc)

    def finalize(self, result: ControlStep, trained_version: int,
                 trained: Sequence[Rollout] | None = None) -> Accounting:
        """After the loop assigned advantages and statuses: useful tokens and staleness of what trains.

        trained: the rollouts the Filter room selected (`filter.select`); default: ask it (`filter.trains`)."""
        acc = result.accounting
        ages: list[int] = []
        acc.useful_tokens = acc.trained_tokens = 0
        acc.rollouts = {s: 0 for s in ROLLOUT_STATUSES}
        chosen = {id(r) for r in trained} if trained is not None else None
        for g in result.groups:
            for r in g.rollouts:
                acc.rollouts[r.status] += 1
                if not (id(r) in chosen if chosen is not None else room.trains(r, g, self.rules)):
                    continue
                n = len(r.completion_token_ids)
                acc.trained_tokens += n
                if r.has_signal:
                    acc.useful_tokens += n
                ages.extend(trained_version - w for w in r.weight_versions)
        acc.staleness_mean = sum(ages) / len(ages) if ages else 0.0
        acc.staleness_max = max(ages) if ages else 0
        return acc


def beta_all_equal(a: float, b: float, r: int, success: bool) -> float:
    """P(the next r samples all succeed (or all fail)) when the pass rate is Beta(a, b): B(a+r, b) / B(a, b)."""
    if r <= 0:
        return 1.0
    x, y = (a, b) if success else (b, a)
    return math.exp(math.lgamma(x + r) + math.lgamma(x + y) - math.lgamma(x) - math.lgamma(x + y + r))
