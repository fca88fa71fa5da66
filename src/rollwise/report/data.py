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


BROWSER_COLUMNS = [
    "step", "prompt_id", "group_id", "sample_index", "prompt_token_ids", "completion_token_ids", "logprobs",
    "weight_versions", "loss_mask", "text", "finish_reason", "reward", "reward_parts", "advantage", "status",
    "status_reason", "prompt_text", "token_texts",
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
    light = store.scan(steps=good, columns=["step", "num_generated", "status"])
    notes += [_bad_shard_note(e) for e in light.errors]  # damaged between the two reads
    steps_col = light.table.column("step").to_pylist()
    status_col = light.table.column("status").to_pylist()
    status_by_step: dict[int, dict[str, int]] = {}
    for s, st in zip(steps_col, status_col):
        d = status_by_step.setdefault(int(s), {})
        d[st] = d.get(st, 0) + 1
    lengths = [int(n) for n in light.table.column("num_generated").to_pylist()]

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
    return RolloutData(chosen, lengths, status_by_step, n_rows, len(lengths), embedded_steps, notes)


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
