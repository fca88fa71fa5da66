"""`MetricsLogger`: one JSON object per step in RUN_DIR/metrics.jsonl, the other loggers of `run.loggers`
(train/loggers.py: tensorboard, wandb, mlflow), and a rich progress bar on a terminal.

metrics.jsonl is the record of a run (the report, `pandas.read_json(lines=True)` and DuckDB read it), so each line
is flushed and fsynced as it is written: a run killed at step N has N complete lines, at most followed by one torn
line. A resume (`resume_from_step`, `prepare_resume`) drops only that torn last line; a damaged line elsewhere and
the lines of steps it will log again are moved, byte for byte, to RUN_DIR/quarantine/, never deleted. Non-finite numbers are written as null (JSON has no NaN) and
tensors / numpy scalars as plain numbers. Nested dicts are flattened with '/' ("time/generate").

The display is chosen once, at construction, from whether stdout is a terminal. On a terminal: a rich progress
bar (which counts steps) showing `PROGRESS_FIELDS` (reward, accuracy, tokens/s and the log-prob gap between the
engine and the trainer, read from the keys `run.loop.step_metrics` writes), the step's kept / filtered / errored
rollouts and, for a step that trained nothing, why (`no_signal`); while the run evaluates or waits for its first
step the bar says so (`phase`). Off a terminal (nohup, SLURM, CI, pipes): with `line_every` set, one plain
`step_line` every N steps and after the last, through `line` (the run's log). A logger asked for whose package is
missing is an error, never a silent skip.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable

from rollwise.train.loggers import LoggerContext, MetricLogger, open_loggers, write_all

PROGRESS_FIELDS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward"), ("accuracy", "acc"), ("tokens_per_s", "tok/s"), ("logprob_mismatch_mean", "logprob gap"),
)
"""(metrics key, label) shown next to the progress bar; every key is one `run.loop.step_metrics` writes
(tests/train/test_loggers.py checks), so a renamed metric cannot leave the bar silently blank."""


def _scalar(v: Any) -> Any:
    """A JSON-safe value: numbers as int/float (non-finite -> None), strings and bools kept, else str()."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 0) == 0:  # torch / numpy scalars
        v = v.item()
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'time': {'train': 1.0}} -> {'time/train': 1.0}, values made JSON-safe."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_metrics(v, key + "/"))
        else:
            out[key] = _scalar(v)
    return out


class MetricsLogger:
    """Append-only per-step metrics. Use as a context manager or call `close()`."""

    def __init__(self, run_dir: str | Path, *, total_steps: int | None = None, loggers: Sequence[str] = ("jsonl",),
                 tensorboard: bool | None = None, console: Any = None,
                 show: Sequence[tuple[str, str]] = PROGRESS_FIELDS, resume_from_step: int | None = None,
                 run_config: Mapping[str, Any] | None = None, project: str | None = None,
                 run_name: str | None = None, line_every: int | None = None,
                 line: Callable[[str], None] = print) -> None:
        """run_dir: created if missing. total_steps: length of the progress bar. loggers: `run.loggers` names
        (jsonl is always on); tensorboard: deprecated alias, True adds 'tensorboard', False removes it.
        console: a rich Console (default: stdout); the bar shows only when it is a terminal. show: (metric key,
        label) pairs displayed next to the bar. resume_from_step: keep only lines with step <= this (a resumed
        run re-logs the steps after its checkpoint). run_config: the resolved config, for W&B and MLflow.
        project, run_name: `run.project` and `run.run_name` for the trackers (run_name None: run_dir's name).
        line_every: off a terminal, print `step_line` through `line` every N steps and after the last (None: never).
        Raises LoggerError (one line) when a logger cannot start."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_from_step is not None:
            self._truncate_after(resume_from_step)
        names = list(loggers)
        if tensorboard is not None:
            names = [n for n in names if n != "tensorboard"] + (["tensorboard"] if tensorboard else [])
        ctx = LoggerContext(self.run_dir, run_name=run_name or self.run_dir.name, project=project,
                            config=dict(run_config or {}),
                            resumed=bool(resume_from_step))
        self.loggers: list[MetricLogger] = open_loggers(names, ctx)  # chosen once, here
        self._t0 = time.time()
        self.show = tuple(show)
        self.last: dict[str, Any] = {}

        from rich.console import Console

        self.console = console if console is not None else Console()
        self.total_steps = total_steps
        self._progress = None
        self._task = None
        self._line = line if line_every is not None and not self.console.is_terminal else None
        self._line_every = line_every or 1
        self._shown = ""  # the last step's description on the bar (`phase_done` puts it back)
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      TextColumn("{task.description}"), console=self.console, transient=False)
            self._progress.start()
            self._task = self._progress.add_task("", total=total_steps, completed=resume_from_step or 0)

    def _truncate_after(self, step: int) -> None:
        self.resume_notes = prepare_resume(self.run_dir, step)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one line {"step": step, "wall_s": ..., **metrics} (flattened, JSON-safe); return it."""
        rec: dict[str, Any] = {"step": int(step)}
        rec["wall_s"] = round(time.time() - self._t0, 3)
        rec.update(flatten_metrics(metrics))
        self.loggers = write_all(self.loggers, int(step), rec)
        if self._progress is not None and self._task is not None:
            shown = [f"{label}={_fmt(rec[k])}" for k, label in self.show if rec.get(k) is not None]
            counts = _step_counts(rec)
            shown += [counts] if counts else []
            shown += [f"no signal: {rec['no_signal']}"] if rec.get("no_signal") else []
            self._shown = "  ".join(shown)
            self._progress.update(self._task, completed=int(step), description=self._shown)
        if self._line is not None and (step % self._line_every == 0 or step == self.total_steps):
            self._line(step_line(rec, self.total_steps))
        self.last = rec
        return rec

    def phase(self, label: str, *, echo: bool = False) -> None:
        """Say what the run is doing between steps (evaluating, generating the first step): the bar's label on a
        terminal; off one, a plain line when `echo` and the plain lines are on."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=label)
        elif echo and self._line is not None:
            self._line(label)

    def phase_done(self) -> None:
        """The bar shows the last step's figures again (after a `phase` that no step line follows)."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=self._shown)

    def print_table(self, title: str, rows: Mapping[str, Any]) -> None:
        """A two-column rich table (e.g. accuracy before/after), on a terminal only."""
        if not self.console.is_terminal:
            return
        from rich.table import Table

        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in flatten_metrics(rows).items():
            table.add_row(k, _fmt(v))
        self.console.print(table)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        loggers, self.loggers = self.loggers, []
        for lg in loggers:  # metrics.jsonl is first: closed even if a tracker's close fails
            try:
                lg.close()
            except Exception as e:  # noqa: BLE001 - a tracker failing to close must not hide the run's result
                sys.stderr.write(f"rollwise: logger '{lg.name}' failed to close: {type(e).__name__}: {e}\n")

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def rollout_counts(counts: Mapping[str, Any]) -> str:
    """'12 kept, 4 filtered, 0 errored' from rollout counts by status (truncated and aborted too when there are
    any; other keys, such as 'total', ignored); '' when there are none."""
    from rollwise.filter import SHOWN
    from rollwise.types import ROLLOUT_STATUSES

    if not any(s in counts for s in ROLLOUT_STATUSES):
        return ""
    return ", ".join(f"{int(counts.get(s) or 0)} {s}" for s in ROLLOUT_STATUSES if s in SHOWN or counts.get(s))


def _step_counts(rec: Mapping[str, Any]) -> str:
    """`rollout_counts` of a flattened metrics line (`rollouts/<status>` keys)."""
    return rollout_counts({k.split("/", 1)[1]: v for k, v in rec.items() if k.startswith("rollouts/")})


def step_line(rec: Mapping[str, Any], total: int | None = None) -> str:
    """One step as a plain line: 'step 2/4: reward 0.250, acc 0.125; 12 kept, 4 filtered, 0 errored; 1.3s,
    212 tok/s', then '; no signal: WHY' for a step that trained nothing."""
    step = rec.get("step")
    head = f"step {step}/{total}" if total else f"step {step}"
    nums = [f"{label} {rec[k]:.3f}" for k, label in (("reward_mean", "reward"), ("accuracy", "acc"))
            if isinstance(rec.get(k), (int, float))]
    head += ": " + ", ".join(nums) if nums else ""
    tail = [c for c in [_step_counts(rec)] if c]
    timing = []
    if isinstance(rec.get("step_s"), (int, float)):
        timing.append(f"{rec['step_s']:.1f}s")
    if isinstance(rec.get("tokens_per_s"), (int, float)):
        timing.append(f"{rec['tokens_per_s']:.0f} tok/s")
    if timing:
        tail.append(", ".join(timing))
    if rec.get("no_signal"):
        tail.append(f"no signal: {rec['no_signal']}")
    return "; ".join([head, *tail])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _step_of(line: bytes) -> int | None:
    """The step of a metrics line, None when the line is damaged (not a JSON object with an integer step)."""
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    step = rec.get("step") if isinstance(rec, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def prepare_resume(run_dir: str | Path, step: int, restore: Mapping[int, Mapping[str, Any]] | None = None) -> list[str]:
    """Make RUN_DIR/metrics.jsonl hold the lines of steps <= `step`, in step order, before a resume appends.

    A torn last line (no final newline: the write a crash interrupted) is dropped. Every other line that is not
    kept - damaged ones anywhere, and those of steps after `step`, which the resumed run logs again - is moved to
    RUN_DIR/quarantine/metrics-<time>.jsonl exactly as it was. restore: lines for steps <= `step` that the file
    lacks (the resume rebuilt them from the rollout store's write-ahead log), inserted in order. Returns one
    human-readable line per thing done (empty when nothing was)."""
    path = Path(run_dir) / "metrics.jsonl"
    restore = dict(restore or {})
    if not path.exists() and not restore:
        return []
    raw = path.read_bytes() if path.exists() else b""
    lines = raw.split(b"\n")
    torn = lines.pop() if lines else b""  # b"" when the file ends with a newline
    notes = []
    if torn.strip():
        notes.append(f"metrics.jsonl: dropped a torn last line ({len(torn)} bytes, a write cut short by the crash)")
    keep: dict[int, bytes] = {}
    quarantined: list[bytes] = []
    damaged = later = duplicate = 0
    for line in lines:
        s = _step_of(line)
        if s is None:
            if line.strip():
                damaged += 1
                quarantined.append(line)
        elif s > step:
            later += 1
            quarantined.append(line)
        elif s in keep:  # a step logged twice: the later line wins, the earlier one is kept aside
            duplicate += 1
            quarantined.append(keep[s])
            keep[s] = line
        else:
            keep[s] = line
    filled = 0
    for s, rec in restore.items():
        if s <= step and s not in keep:
            keep[s] = json.dumps({"step": int(s), **flatten_metrics(rec)}, allow_nan=False).encode()
            filled += 1
    if quarantined:
        qdir = Path(run_dir) / "quarantine"
        qdir.mkdir(parents=True, exist_ok=True)
        qpath = qdir / f"metrics-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.jsonl"
        with open(qpath, "wb") as f:
            f.write(b"".join(q + b"\n" for q in quarantined))
            f.flush()
            os.fsync(f.fileno())
        what = [f"{n} {k}" for n, k in ((damaged, "damaged line(s)"), (later, f"line(s) of steps after {step}"),
                                        (duplicate, "duplicate line(s)")) if n]
        notes.append(f"metrics.jsonl: moved {', '.join(what)} to {qpath}")
    if filled:
        notes.append(f"metrics.jsonl: restored {filled} line(s) from the rollout store's write-ahead log")
    if notes:
        tmp = path.with_suffix(".jsonl.tmp")
        with open(tmp, "wb") as f:
            f.write(b"".join(keep[s] + b"\n" for s in sorted(keep)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return notes


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All complete lines of RUN_DIR/metrics.jsonl (a torn last line is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


TRL_METRIC_ALIASES: dict[str, str] = {
    "reward": "reward_mean",
    "frac_reward_zero_std": "zero_var_frac",
    "completions/mean_length": "resp_len_mean",
    "completions/max_length": "resp_len_max",
    "completions/clipped_ratio": "truncation_rate",
    "clip_ratio/region_mean": "clip_frac",
    "learning_rate": "lr",
}
"""TRL's GRPOTrainer metric name -> the rollwise key of each step's record it repeats (same value). `kl`,
`entropy`, `grad_norm` and `loss` already have TRL's names; `reward_std`, `completions/min_length` and
`rewards/<name>/mean` / `rewards/<name>/std` are computed by `trl_metrics`."""

TRL_COMPUTED_METRICS: tuple[str, ...] = (
    "reward_std", "completions/min_length", "rewards/<name>/mean", "rewards/<name>/std",
)
"""TRL metric names `trl_metrics` computes from the rollouts (no rollwise key holds them)."""


def _std(xs: Sequence[float]) -> float | None:
    """Sample std (n - 1), as TRL's nanstd; None below two values."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _metric_name(name: str) -> str:
    """A reward's name as every logger takes it in a metric name (MLflow refuses '<', ':', ...): other characters
    than letters, digits, '_', '-', '.' and ' ' become '_' ('<lambda>' -> '_lambda_')."""
    return "".join(c if c.isalnum() or c in "_-. " else "_" for c in str(name)) or "_"


def trl_metrics(rec: Mapping[str, Any], rollouts: Sequence[Any], shaping: Sequence[str] = ()) -> dict[str, Any]:
    """TRL's names for a step's metrics, so a dashboard built for TRL's GRPOTrainer reads a rollwise run: the
    `TRL_METRIC_ALIASES` of `rec` (a step record) plus `TRL_COMPUTED_METRICS` from `rollouts` (Rollout objects).
    `rewards/<name>/mean` is per reward function (`Rollout.reward_parts`, leaving out the `shaping` parts, which
    are rollwise's own terms). A value that does not exist this step is left out."""
    out: dict[str, Any] = {trl: rec[ours] for trl, ours in TRL_METRIC_ALIASES.items() if rec.get(ours) is not None}
    rewards = [float(r.reward) for r in rollouts if r.reward is not None and math.isfinite(r.reward)]
    std = _std(rewards)
    if std is not None:
        out["reward_std"] = std
    lens = [r.completion_len for r in rollouts]
    if lens:
        out["completions/min_length"] = int(min(lens))
    parts: dict[str, list[float]] = {}
    for r in rollouts:
        for name, v in r.reward_parts.items():
            if name not in shaping and isinstance(v, (int, float)) and math.isfinite(v):
                parts.setdefault(name, []).append(float(v))
    for name, vals in parts.items():
        tag = _metric_name(name)
        out[f"rewards/{tag}/mean"] = sum(vals) / len(vals)
        s = _std(vals)
        if s is not None:
            out[f"rewards/{tag}/std"] = s
    return out
