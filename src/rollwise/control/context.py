"""What a policy may use in one step (`StepContext`), the groups it fills (`PendingGroup`), and how a finished
group becomes `Rollout`s (`build_group`, through `make_rollout`, which decides each status)."""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rollwise import filter as room
from rollwise.control.driver import Driver, SampleRequest
from rollwise.control.episodes import EpisodeSource
from rollwise.control.ledger import Accounting
from rollwise.engine.speculative import DraftSpec
from rollwise.types import (CompletionOutput, RolloutGroup, RolloutSegment, SamplingParams, Score, Scorer, Task,
                            Tokenizer, make_rollout)

TaskSource = Callable[[int], list[Task]]
"""`take(k)` -> the next k training tasks (the loop's seeded, resumable data order)."""
ParamsFn = Callable[[Task, int, SamplingParams], SamplingParams]
"""Per-sample sampling params override `(task, sample_index, base) -> params` (benches draw lengths with it); when
set, every sample is its own request, so each can get its own params."""


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
    prompts: dict[int, list[int]] = field(default_factory=dict)
    """Multi-turn episodes: sample -> its own prompt ids, where the environment's opening (what `reset` returned)
    made them differ from the group's; the rollout trains on the prompt the episode was generated from."""
    segments: dict[int, list[RolloutSegment]] = field(default_factory=dict)
    """Agent episodes: sample -> its further token sequences (`types.RolloutSegment`)."""

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
    score_fn: Scorer
    params_fn: ParamsFn | None
    acc: Accounting
    prior: Callable[[str], tuple[float, float]]
    """Beta(a, b) belief about a prompt's pass rate (the posterior when enabled, else the config prior)."""
    rules: room.FilterRules = room.DEFAULT_RULES
    """The Filter room's rules (which groups are informative), the same the loop applies after the step."""
    episodes: EpisodeSource | None = None
    """For a multi-turn environment or an agent function: samples are whole episodes."""
    drafts: Callable[[str], DraftSpec | None] | None = None
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
        todo = [(g, j, o) for g, j in pairs if (o := g.outputs[j]) is not None and o.finish_reason != "abort"]
        if not todo:
            return
        t0 = time.perf_counter()
        scores = self.score_fn([(g.task, o.text, list(o.token_ids)) for g, _, o in todo])
        took = time.perf_counter() - t0
        self.acc.score_s += took
        if len(scores) != len(todo):
            raise RuntimeError(f"the scorer returned {len(scores)} scores for {len(todo)} completions")
        for (g, j, _), s in zip(todo, scores):
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
            self._run_episodes(self.episodes, reqs)
            return
        for (g, r), outs in zip(reqs, self.driver.run([r for _, r in reqs])):
            self.place(g, r, outs)
        self.score([(g, j) for g, js in zip(groups, idx) for j in js])

    def _run_episodes(self, runner: EpisodeSource, reqs: list[tuple[PendingGroup, SampleRequest]]) -> None:
        """Multi-turn: each requested sample is an episode; all of them go through the engine together, round by
        round, and come back scored by the environment."""
        t0 = time.perf_counter()
        eps = runner.run(self.driver.counting_engine(), [g.task for g, _ in reqs], [r.params for _, r in reqs])
        took = time.perf_counter() - t0
        k = 0
        for g, r in reqs:
            for i in range(r.count):
                ep, j = eps[k], r.start + i
                k += 1
                # NOTE: an episode may end at "max_turns", which `types.FinishReason` (an engine's reasons) leaves out;
                # `make_rollout` reads it as truncated. The ignore goes when that type names the episodes' reasons.
                g.outputs[j] = CompletionOutput(j, list(ep.token_ids), list(ep.logprobs), ep.finish_reason,  # type: ignore[arg-type]
                                                "".join(t for role, t in ep.texts if role != "prompt"),
                                                list(ep.weight_versions))
                g.loss_masks[j] = list(ep.loss_mask)
                if ep.prompt_token_ids != g.prompt_token_ids:
                    g.prompts[j] = list(ep.prompt_token_ids)
                if ep.segments:
                    g.segments[j] = list(ep.segments)
                if ep.score is not None:
                    ep.score.info["turns"] = ep.turns  # lands in the rollout's env_info
                g.scores[j] = ep.score
                g.gen_s[j] = took


def default_encoder(tokenizer: Tokenizer) -> Callable[[Task], list[int]]:
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
        rollouts.append(make_rollout(g.task, g.group_id, j, g.prompts.get(j, g.prompt_token_ids), token_ids=o.token_ids,
                                     logprobs=o.logprobs, weight_versions=o.weight_versions,
                                     finish_reason=o.finish_reason, text=o.text, score=sc, step=step, seed=g.seed,
                                     max_tokens=max_tokens, timings=t, loss_mask=g.loss_masks.get(j),
                                     tree_parent=o.tree_parent, tree_fork=o.tree_fork,
                                     segments=g.segments.get(j)))
    return RolloutGroup(g.task.id, g.group_id, rollouts)


mark = room.mark
"""Re-mark a group's trainable rollouts and drop the group from training: the Filter room's `filter.mark`."""


def informative(group: RolloutGroup, rules: room.FilterRules = room.DEFAULT_RULES) -> bool:
    """A group that carries a GRPO signal, as the Filter room says (`filter.informative`)."""
    return room.informative(group, rules)


class Stopping(Protocol):
    """A stopping rule: generates the requested samples of some groups itself, and may abort them mid-way."""

    def generate(self, ctx: StepContext, groups: Sequence[PendingGroup], indices: Sequence[Sequence[int]]) -> None: ...


