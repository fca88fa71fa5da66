"""What the report reads from a run directory, tolerant of runs that crashed or are still going.

- `metrics.jsonl`: one JSON object per step. A line cut short by a kill is skipped and noted; a step
  logged twice (a resumed run re-running it) keeps its last record.
- `summary.json`: absent while a run is going; the page says so.
- `rollouts/`: every shard is read once whole (page checksums verified); a bad shard is skipped and named,
  with its step, on the page and to the caller's `warn`. Only the last `max_steps` steps, up to
  `max_rows` rollouts in whole groups, are embedded for the browser; the length histogram and the
  status counts use every shard (a few small columns).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
import re
from typing import Any

SHARD_STEP = re.compile(r"^step-(\d+)\.parquet$")


@dataclass
class Metrics:
    rows: list[dict[str, Any]]
    """One record per step, ascending by step."""
    notes: list[str] = field(default_factory=list)

    def has(self, key: str) -> bool:
        return any(_num(r.get(key)) for r in self.rows)

    def wall_clock(self) -> list[float | None]:
        """Seconds since the run started, per record.

        `wall_s` is read as elapsed time when it increases from step to step; otherwise as each step's
        own duration, and summed.
        """
        vals = [r.get("wall_s") for r in self.rows]
        nums = [float(v) for v in vals if _num(v)]
        if len(nums) < 1:
            return [None] * len(vals)
        increasing = all(b > a for a, b in zip(nums, nums[1:]))
        if increasing:
            return [float(v) if _num(v) else None for v in vals]
        out, total = [], 0.0
        for v in vals:
            if _num(v):
                total += float(v)
                out.append(total)
            else:
                out.append(None)
        return out


def _num(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_metrics(path: Path) -> Metrics:
    if not path.is_file():
        return Metrics([], [f"{path.name} not found: no per-step plots"])
    by_step: dict[Any, dict[str, Any]] = {}
    notes = []
    bad = []
    for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad.append(n)
            continue
        if not isinstance(rec, dict):
            bad.append(n)
            continue
        by_step[rec.get("step", f"line{n}")] = rec
    if bad:
        notes.append(f"{path.name}: skipped {len(bad)} unparsable line(s) ({', '.join(map(str, bad[:5]))}{'…' if len(bad) > 5 else ''})")
    rows = sorted(by_step.values(), key=lambda r: (not _num(r.get("step")), r.get("step") if _num(r.get("step")) else 0))
    return Metrics(rows, notes)


def load_summary(path: Path) -> tuple[dict[str, Any], list[str]]:
    if not path.is_file():
        return {}, [f"{path.name} not found: the run has not finished (or crashed); no eval figures or card"]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        return {}, [f"{path.name} is not valid JSON ({e.msg} at line {e.lineno}); ignored"]
    if not isinstance(data, dict):
        return {}, [f"{path.name} is not a JSON object; ignored"]
    return data, []


@dataclass
class RolloutData:
    groups: list[dict[str, Any]]
    """Browser groups, newest step first: {step, group_id, prompt_id, prompt, samples: […]}."""
    lengths: list[int]
    """Generated tokens per rollout, every shard."""
    status_by_step: dict[int, dict[str, int]]
    embedded_rows: int
    total_rows: int
    embedded_steps: list[int]
    notes: list[str] = field(default_factory=list)
    trees: TreeData | None = None
    """Tree rollouts' figures and drawings (None: no rollout carries tree links)."""


BROWSER_COLUMNS = [
    "step", "prompt_id", "group_id", "sample_index", "prompt_token_ids", "completion_token_ids", "logprobs",
    "weight_versions", "loss_mask", "text", "finish_reason", "reward", "reward_parts", "advantage", "status",
    "status_reason", "prompt_text", "token_texts", "tree_parent", "tree_fork",
]  # fmt: skip


def load_rollouts(run_dir: Path, *, max_steps: int, max_rows: int, max_tokens: int) -> RolloutData:
    from rollwise.store.writer import RolloutStore

    store = RolloutStore(run_dir)
    notes: list[str] = []
    if not store.steps():
        return RolloutData([], [], {}, 0, 0, [], ["no rollout shards in rollouts/: nothing to browse"])
    # Every page of every shard is read once with its checksum verified, so a corrupt step is named here
    # even when it is older than the steps the browser embeds (whose other columns are never read).
    bad = store.verify(strict=False)
    notes += [_bad_shard_note(e) for e in bad]
    bad_paths = {e.path for e in bad}
    good = [s for s in store.steps() if store.shard_path(s) not in bad_paths]
    light = store.scan(steps=good, columns=["step", "num_generated", "status", "tree_parent", "tree_fork"])
    notes += [_bad_shard_note(e) for e in light.errors]  # damaged between the two reads
    steps_col = light.table.column("step").to_pylist()
    status_col = light.table.column("status").to_pylist()
    status_by_step: dict[int, dict[str, int]] = {}
    for s, st in zip(steps_col, status_col):
        d = status_by_step.setdefault(int(s), {})
        d[st] = d.get(st, 0) + 1
    lengths = [int(n) for n in light.table.column("num_generated").to_pylist()]
    linked = [p is not None or f is not None for p, f in zip(light.table.column("tree_parent").to_pylist(),
                                                               light.table.column("tree_fork").to_pylist())]
    tree_steps = sorted({int(s) for s, t in zip(steps_col, linked) if t})
    trees = load_trees(store, tree_steps) if tree_steps else None
    if trees is not None:
        notes += trees.notes

    readable = sorted({int(p.name[5:-8]) for p in light.shards})
    wanted = readable[-max_steps:] if max_steps > 0 else []
    browse = store.scan(steps=wanted, columns=BROWSER_COLUMNS)
    notes += [_bad_shard_note(e) for e in browse.errors]
    table = browse.table
    groups: dict[tuple[int, str], dict[str, Any]] = {}
    for row in table.to_pylist():
        key = (row["step"], row["group_id"])
        g = groups.get(key)
        if g is None:
            g = groups[key] = {
                "step": row["step"],
                "group_id": row["group_id"],
                "prompt_id": row["prompt_id"],
                "prompt": row["prompt_text"],
                "prompt_ids": None if row["prompt_text"] is not None else row["prompt_token_ids"][:max_tokens],
                "samples": [],
            }
        g["samples"].append(_sample(row, max_tokens))
    ordered = sorted(groups.values(), key=lambda g: (-g["step"], g["group_id"]))
    chosen, n_rows = [], 0
    for g in ordered:
        if n_rows + len(g["samples"]) > max_rows and chosen:
            break
        g["samples"].sort(key=lambda s: s["i"])
        chosen.append(g)
        n_rows += len(g["samples"])
    embedded_steps = sorted({g["step"] for g in chosen})
    return RolloutData(chosen, lengths, status_by_step, n_rows, len(lengths), embedded_steps, notes, trees)


def _bad_shard_note(e: Any) -> str:
    m = SHARD_STEP.match(e.path.name)
    step = f"step {int(m.group(1))}" if m else "a step"
    return f"skipped unreadable shard {e} ({step} is left out of the browser, the length histogram and the status counts)"


def _clean(v: float | None, nd: int = 4) -> float | None:
    return round(v, nd) if v is not None and math.isfinite(v) else None


def _sample(row: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    ids = row["completion_token_ids"]
    n = len(ids)
    texts = row["token_texts"]
    mask = row["loss_mask"]
    versions = row["weight_versions"]
    s: dict[str, Any] = {
        "i": row["sample_index"],
        "reward": _clean(row["reward"]),
        "adv": _clean(row["advantage"]),
        "status": row["status"],
        "reason": row["status_reason"],
        "finish": row["finish_reason"],
        "parts": json.loads(row["reward_parts"]),
        "n": n,
        "ids": ids[:max_tokens],
        "lp": [_clean(x, 3) for x in row["logprobs"][:max_tokens]],
        "text": row["text"] if texts is None else None,
        "tok": None if texts is None else texts[:max_tokens],
        "versions": [min(versions), max(versions)] if versions else None,
    }
    if any(m == 0 for m in mask):
        s["mask"] = mask[:max_tokens]
    if row["tree_parent"] is not None:
        s["tree"] = [row["tree_parent"], row["tree_fork"]]  # branched from sample tree[0] at token tree[1]
    s["parts"] = {k: _clean(v) if isinstance(v, float) else v for k, v in s["parts"].items()}
    return s


@dataclass
class AccuracyCurve:
    """Held-out accuracy against training cost: one point per evaluation (before training, every `run.eval_every`
    steps, after). Cost is cumulative over the steps up to the point: `train_s` sums `step_s` (the loop's step
    wall-clock, evaluations excluded), `tokens` the generated tokens, `cpu_s` the process CPU seconds (None where a
    record lacks them: a run from before they were logged). The same definitions for every run, so curves of
    different runs compare (bench/time_to_accuracy.py reads runs through this)."""

    steps: list[int]
    train_s: list[float]
    tokens: list[int]
    cpu_s: list[float | None]
    greedy: list[float]
    sampled: list[float]

    def first_reaching(self, target: float) -> int | None:
        """Index of the first point whose greedy accuracy is >= target, or None."""
        return next((i for i, a in enumerate(self.greedy) if a >= target - 1e-9), None)


def accuracy_curve(metrics: Metrics, summary: dict[str, Any]) -> AccuracyCurve | None:
    """The run's accuracy curve; None without an evaluation before training (`summary.eval_before`)."""
    before = summary.get("eval_before") if isinstance(summary.get("eval_before"), dict) else None
    if before is None or not _num(before.get("accuracy_greedy")):
        return None
    c = AccuracyCurve([0], [0.0], [0], [0.0], [float(before["accuracy_greedy"])], [float(before.get("accuracy", 0.0))])
    t = cpu = 0.0
    tok = 0
    cpu_ok = True
    for r in metrics.rows:
        if not _num(r.get("step")):
            continue
        t += float(r.get("step_s", 0.0)) if _num(r.get("step_s")) else 0.0
        tok += int(r.get("gen_tokens", 0)) if _num(r.get("gen_tokens")) else 0
        cpu_ok = cpu_ok and _num(r.get("cpu_s"))
        cpu += float(r["cpu_s"]) if cpu_ok else 0.0
        if _num(r.get("eval_accuracy_greedy")):
            c.steps.append(int(r["step"]))
            c.train_s.append(t)
            c.tokens.append(tok)
            c.cpu_s.append(cpu if cpu_ok else None)
            c.greedy.append(float(r["eval_accuracy_greedy"]))
            c.sampled.append(float(r.get("eval_accuracy", 0.0)))
    after = summary.get("eval_after") if isinstance(summary.get("eval_after"), dict) else None
    if after is not None and _num(after.get("accuracy_greedy")) and metrics.rows:
        c.steps.append(int(summary.get("steps", metrics.rows[-1].get("step", 0))))
        c.train_s.append(t)
        c.tokens.append(tok)
        c.cpu_s.append(cpu if cpu_ok else None)
        c.greedy.append(float(after["accuracy_greedy"]))
        c.sampled.append(float(after.get("accuracy", 0.0)))
    return c


# ------------------------------------------------------------------------------------------- where the time went
TIME_SPLIT_PARTS: tuple[tuple[str, str], ...] = (
    ("time_gen_useful_s", "useful"), ("time_gen_filtered_s", "filtered"), ("time_tail_s", "tail"),
    ("time_score_s", "score"), ("time_train_s", "train"), ("time_sync_s", "sync"))
"""metrics.jsonl key -> short name of each part of a step's time (docs/outputs.md defines them); "other" is the
step's remaining wall-clock."""


@dataclass
class StepTime:
    """Where one step's wall-clock went, seconds per part (`TIME_SPLIT_PARTS`' short names, plus "other")."""

    step: int
    parts: dict[str, float]
    step_s: float | None
    """The step's wall-clock (None in a record without it)."""
    tail_frac: float
    """The tail's share of the generate phase."""


def time_split(metrics: Metrics) -> list[StepTime]:
    """Per step with a measured tail (`time_tail_s`): the generate phase split into useful, filtered and tail
    seconds, then scoring, training and syncing, and "other": step_s minus those parts, when positive (bookkeeping,
    advantages, the store; in an asynchronous run generation overlaps training, so the parts can exceed step_s and
    "other" is 0). Steps without a measured tail (batch engines, older runs) are left out."""
    out = []
    for r in metrics.rows:
        if not (_num(r.get("time_tail_s")) and _num(r.get("step"))):
            continue
        parts = {name: float(r[k]) if _num(r.get(k)) else 0.0 for k, name in TIME_SPLIT_PARTS}
        step_s = float(r["step_s"]) if _num(r.get("step_s")) else None
        parts["other"] = max(0.0, step_s - sum(parts.values())) if step_s is not None else 0.0
        out.append(StepTime(int(r["step"]), parts, step_s,
                            float(r["tail_frac"]) if _num(r.get("tail_frac")) else 0.0))
    return out


def time_split_totals(steps: Sequence[StepTime]) -> dict[str, float]:
    """Seconds per part summed over steps, and `tail_frac`: the tail's share of all generate time."""
    tot = {name: sum(s.parts.get(name, 0.0) for s in steps) for name in [n for _, n in TIME_SPLIT_PARTS] + ["other"]}
    gen = tot["useful"] + tot["filtered"] + tot["tail"]
    tot["tail_frac"] = tot["tail"] / gen if gen > 0 else 0.0
    return tot


# ------------------------------------------------------------------------------------------------- tree rollouts
# NOTE on the tree of a group: sample i owns completion positions [fork_i, len_i) (a root from 0); positions before
# its fork are its parent's path. Its branch point is a position on its parent's path, which lies on the parent's
# own span or, when it forks before the parent's own tokens start, on an ancestor's: the sample it hangs from (its
# "owner") is the first one up the chain whose own span starts at or before the fork. Each sample's own span is cut
# at the forks of the samples hanging from it; the pieces are the tree's segments (edges), every generated token in
# exactly one. A copy (fork == len, with a parent) owns no token: its leaf is a point on its parent's path.


@dataclass(frozen=True)
class TreeSample:
    """What the tree maths needs of one sample of a group (a store row's tree columns and its length)."""

    index: int
    length: int
    """Completion tokens."""
    parent: int | None = None
    fork: int | None = None
    """Where its own tokens start; None or 0 for a root."""
    reward: float | None = None


@dataclass(frozen=True)
class TreeSegment:
    """One edge of a group's tree: `end - start` consecutive tokens of one sample's own span."""

    sample: int
    start: int
    end: int
    parent: int | None
    """Index (in `GroupTree.segments`) of the segment this one continues; None: it starts at the prompt."""

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass
class GroupTree:
    """A group's samples as a tree of token segments (`group_tree`)."""

    samples: list[TreeSample]
    """By sample index."""
    segments: list[TreeSegment]
    """Owners before the samples hanging from them; within a sample, in position order."""
    owner: dict[int, int | None]
    """Sample -> the sample on whose own span it branches (its parent, or an ancestor when it forks before the
    parent's own tokens start); None for a root."""
    fork: dict[int, int]
    """Sample -> where its own tokens start (0 for a root)."""
    leaf: dict[int, int | None]
    """Sample -> the segment its completion ends on (None: an empty completion, at the prompt)."""

    @property
    def leaves(self) -> int:
        return len(self.samples)

    @property
    def copies(self) -> list[int]:
        """Samples that are a copy of their parent, which ended before their branch point (no token of their own)."""
        return [s.index for s in self.samples if s.parent is not None and self.fork[s.index] == s.length]

    @property
    def distinct_leaves(self) -> int:
        return len(set(self.leaf.values()))

    @property
    def generated(self) -> int:
        """Tokens the tree generated: sum over samples of len - fork (= the segments' tokens)."""
        return sum(s.length - self.fork[s.index] for s in self.samples)

    @property
    def independent(self) -> int:
        """Tokens the same completions cost as independent samples: sum of their lengths."""
        return sum(s.length for s in self.samples)


def group_tree(samples: Sequence[TreeSample]) -> GroupTree:
    """A group's samples (parent links, forks, lengths) as segments of one tree; a one-line ValueError naming the
    sample when the links cannot be a tree (a parent not in the group, a cycle, a fork outside the sample or past
    the end of the path it branches from)."""
    by: dict[int, TreeSample] = {}
    for s in samples:
        if s.index in by:
            raise ValueError(f"sample {s.index} appears twice in the group")
        if s.length < 0:
            raise ValueError(f"sample {s.index}: negative length {s.length}")
        by[s.index] = s
    fork: dict[int, int] = {}
    for i, s in by.items():
        if s.parent is None:
            if s.fork not in (None, 0):
                raise ValueError(f"sample {i}: tree_fork {s.fork} without a tree_parent")
            fork[i] = 0
            continue
        if s.parent not in by:
            raise ValueError(f"sample {i}: tree_parent {s.parent} is not a sample of the group")
        if s.fork is None or not 0 <= s.fork <= s.length:
            raise ValueError(f"sample {i}: tree_fork {s.fork} is outside [0, {s.length}]")
        fork[i] = s.fork
    depth: dict[int, int] = {}
    for i in by:
        chain, cur = [], i
        while cur is not None and cur not in depth:
            if cur in chain:
                raise ValueError(f"sample {i}: its tree_parent links form a cycle")
            chain.append(cur)
            cur = by[cur].parent
        d = -1 if cur is None else depth[cur]
        for c in reversed(chain):
            d += 1
            depth[c] = d
    owner: dict[int, int | None] = {}
    cuts: dict[int, set[int]] = {i: {fork[i], s.length} for i, s in by.items()}
    for i, s in by.items():
        o = s.parent
        if o is None:
            owner[i] = None
            continue
        while fork[o] > fork[i]:  # the fork lies before o's own tokens: on an ancestor's span (a root's starts at 0)
            o = by[o].parent  # type: ignore[assignment]
        if fork[i] > by[o].length:
            raise ValueError(f"sample {i}: forks at token {fork[i]}, after sample {o}'s path ends ({by[o].length} tokens)")
        owner[i] = o
        cuts[o].add(fork[i])
    # Owners first (an owner is an ancestor, so its depth is smaller), so a child's first segment can find its parent.
    order = sorted(by, key=lambda i: (depth[i], i))
    segments: list[TreeSegment] = []
    ending: dict[tuple[int, int], int] = {}

    def node(i: int, d: int) -> int | None:
        """The segment of sample i's path that ends at position d (None: d is the prompt's end)."""
        while d == fork[i] and owner[i] is not None:
            i = owner[i]  # type: ignore[assignment]
        return None if d == fork[i] else ending[(i, d)]

    for i in order:
        pts = sorted(cuts[i])
        for a, b in zip(pts, pts[1:]):
            parent = node(i, a)
            ending[(i, b)] = len(segments)
            segments.append(TreeSegment(i, a, b, parent))
    leaf = {i: node(i, by[i].length) for i in by}
    return GroupTree([by[i] for i in sorted(by)], segments, owner, fork, leaf)


@dataclass
class TreeFigures:
    """Tree rollouts' cost, summed over groups: what the tree generated against what independent samples would."""

    groups: int = 0
    leaves: int = 0
    distinct_leaves: int = 0
    copies: int = 0
    generated: int = 0
    independent: int = 0

    def add(self, t: GroupTree) -> None:
        self.groups += 1
        self.leaves += t.leaves
        self.distinct_leaves += t.distinct_leaves
        self.copies += len(t.copies)
        self.generated += t.generated
        self.independent += t.independent

    @property
    def generated_per_leaf(self) -> float:
        return self.generated / self.leaves if self.leaves else 0.0

    @property
    def independent_per_leaf(self) -> float:
        return self.independent / self.leaves if self.leaves else 0.0

    @property
    def ratio(self) -> float | None:
        """Generated tokens over independent sampling's (None when the completions are all empty)."""
        return self.generated / self.independent if self.independent else None


@dataclass
class DrawnTree:
    step: int
    group_id: str
    why: str
    """Why this group is drawn ("first group of the last step", ...)."""
    tree: GroupTree


@dataclass
class TreeData:
    """The tree section's data: figures per step and overall, and a few groups to draw."""

    by_step: dict[int, TreeFigures]
    overall: TreeFigures
    drawn: list[DrawnTree]
    notes: list[str] = field(default_factory=list)


TREE_COLUMNS = ["step", "group_id", "sample_index", "completion_token_ids", "tree_parent", "tree_fork", "reward"]


def load_trees(store: Any, steps: Sequence[int]) -> TreeData | None:
    """Tree figures of the `steps` (readable shards whose rollouts carry tree links); None when no group has a tree.

    A group carries a tree when a sample has a tree_parent or a tree_fork; other groups (plain sampling in the same
    run) are left out of the figures. One shard at a time, keeping only the groups to draw."""
    import pyarrow.compute as pc

    by_step: dict[int, TreeFigures] = {}
    overall = TreeFigures()
    notes: list[str] = []
    last: DrawnTree | None = None
    widest: DrawnTree | None = None
    for step in steps:
        scan = store.scan(steps=[step], columns=TREE_COLUMNS)
        if scan.errors:  # damaged since the first read
            notes.append(f"step {step}: {scan.errors[0]}; left out of the tree figures")
            continue
        table = scan.table
        lengths = pc.list_value_length(table.column("completion_token_ids")).to_pylist()
        cols = {c: table.column(c).to_pylist() for c in TREE_COLUMNS if c != "completion_token_ids"}
        groups: dict[str, list[TreeSample]] = {}
        for k in range(table.num_rows):
            groups.setdefault(cols["group_id"][k], []).append(TreeSample(
                int(cols["sample_index"][k]), int(lengths[k] or 0), cols["tree_parent"][k], cols["tree_fork"][k],
                cols["reward"][k]))
        figures = TreeFigures()
        first = True
        for gid, samples in groups.items():
            if all(s.parent is None and s.fork is None for s in samples):
                continue
            try:
                tree = group_tree(samples)
            except ValueError as e:
                notes.append(f"step {step} group {gid}: {e}; left out of the tree figures")
                continue
            figures.add(tree)
            overall.add(tree)
            if first:
                last, first = DrawnTree(step, gid, "first group of the last step with trees", tree), False
            if widest is None or tree.distinct_leaves > widest.tree.distinct_leaves:
                widest = DrawnTree(step, gid, "the group with the most distinct leaves", tree)
        if figures.groups:
            by_step[step] = figures
    if not by_step and not notes:
        return None
    drawn: list[DrawnTree] = []
    if last is not None and widest is not None:
        if widest.tree.distinct_leaves == last.tree.distinct_leaves:  # as wide as the newest: one drawing says it
            drawn = [DrawnTree(last.step, last.group_id, f"{last.why}; no group has more distinct leaves", last.tree)]
        else:
            drawn = [last, widest]
    return TreeData(by_step, overall, drawn, notes)
