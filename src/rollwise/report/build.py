"""`write_report(run_dir)`: one self-contained `report.html` from a run directory.

Everything is inline: CSS, the rollout browser's script, the rollout data as JSON, and the plots as SVG
drawn here in Python. Nothing is fetched when the page opens, so it can be mailed, archived or opened on
a machine with no network.

Plots are chosen by what `metrics.jsonl` holds: a plot whose metrics are all absent is left out and the
page lists what was not recorded.
"""

from __future__ import annotations

import html
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from rollwise.report import svg
from rollwise.report.data import (
    Metrics,
    TIME_SPLIT_PARTS,
    RolloutData,
    TreeData,
    TreeFigures,
    accuracy_curve,
    load_metrics,
    load_rollouts,
    load_summary,
    time_split,
)
from rollwise.report.page import CSS, JS
from rollwise.types import ROLLOUT_STATUSES
from rollwise.train.metrics import TRL_METRIC_ALIASES


@dataclass
class ReportLimits:
    """How much of the rollout store is embedded in the page (the plots always use every step)."""

    max_steps: int = 8
    """Embed the rollouts of at most this many of the latest steps."""
    max_rows: int = 600
    """…and at most this many rollouts, in whole groups, newest first."""
    max_tokens: int = 512
    """…and at most this many completion tokens per rollout."""

    def __post_init__(self) -> None:
        for name in ("max_steps", "max_rows", "max_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"ReportLimits.{name} must be >= 0, got {getattr(self, name)}")


TIME_PARTS = ("time_generate_s", "time_score_s", "time_train_s", "time_sync_s")


@dataclass
class Plot:
    key: str
    title: str
    desc: str
    svg: str


def write_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, limits: ReportLimits | None = None,
                 warn: Callable[[str], None] | None = None) -> Path:
    """Write `RUN_DIR/report.html` (or `output`) and return its path.

    warn: called with one line per rollout shard that could not be read (the page names them too).
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {run} does not exist")
    if not any((run / n).exists() for n in ("metrics.jsonl", "summary.json", "rollouts")):
        raise ValueError(f"{run} has no metrics.jsonl, summary.json or rollouts/: not a rollwise run directory")
    limits = limits or ReportLimits()
    metrics = load_metrics(run / "metrics.jsonl")
    summary, summary_notes = load_summary(run / "summary.json")
    rollouts = load_rollouts(run, max_steps=limits.max_steps, max_rows=limits.max_rows, max_tokens=limits.max_tokens)
    if warn is not None:
        for note in rollouts.notes:
            if note.startswith("skipped unreadable shard"):
                warn(note)
    plots, missing = build_plots(metrics, rollouts, summary)
    notes = metrics.notes + summary_notes + rollouts.notes
    if missing:
        notes.append("not recorded in metrics.jsonl, so not plotted: " + ", ".join(missing))
    page = render(run, summary, metrics, rollouts, plots, notes, limits)
    out = Path(output) if output is not None else run / "report.html"
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def _xy(metrics: Metrics, key: str, x: list[float | None]) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for xv, r in zip(x, metrics.rows):
        v = r.get(key)
        if xv is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(xv)
            ys.append(float(v))
    return xs, ys


def build_plots(metrics: Metrics, rollouts: RolloutData,
                summary: dict[str, Any] | None = None) -> tuple[list[Plot], list[str]]:
    """Every plot the data supports, and the metric names that were expected but absent."""
    plots: list[Plot] = []
    curve = accuracy_curve(metrics, summary or {})
    if curve is not None and len(curve.greedy) > 1:
        unit, div = ("min", 60.0) if curve.train_s[-1] > 300 else ("s", 1.0)
        xs = [x / div for x in curve.train_s]
        drawn = svg.line_chart([svg.Series("greedy", xs, curve.greedy), svg.Series("sampled", xs, curve.sampled)],
                               x_label=f"training wall-clock ({unit}, evaluations excluded)", y_label="held-out accuracy",
                               y_zero=True)
        if drawn:
            plots.append(Plot("accuracy_time", "Held-out accuracy against training time",
                              "One point per evaluation (before, every run.eval_every steps, after); time is the sum of "
                              "the steps' wall-clock, evaluations left out.", drawn))
    steps: list[float | None] = [float(r.get("step", i)) for i, r in enumerate(metrics.rows)]
    wall = metrics.wall_clock()
    wall_max = max((w for w in wall if w is not None), default=0.0)
    wall_unit, wall_div = ("min", 60.0) if wall_max > 300 else ("s", 1.0)
    wall_x = [None if w is None else w / wall_div for w in wall]

    def lines(key: str, title: str, desc: str, names: list[tuple[str, str]], x: list[float | None], x_label: str, y_label: str, y_zero: bool = False) -> None:
        series = [svg.Series(label, *_xy(metrics, k, x)) for k, label in names]
        drawn = svg.line_chart(series, x_label=x_label, y_label=y_label, y_zero=y_zero)
        if drawn:
            plots.append(Plot(key, title, desc, drawn))

    reward = [("reward_mean", "reward mean"), ("accuracy", "accuracy")]
    lines("reward_step", "Reward and accuracy by step", "Mean reward of the step's rollouts and their accuracy.", reward, steps, "step", "value")
    lines("reward_wall", "Reward and accuracy by wall-clock", "The same against time since the run started.", reward, wall_x, f"wall-clock ({wall_unit})", "value")
    if rollouts.lengths:
        h = svg.histogram(rollouts.lengths, x_label="generated tokens per rollout")
        if h:
            plots.append(Plot("resp_len_hist", "Response length distribution", f"All {len(rollouts.lengths)} stored rollouts, every step.", h))
    lines("resp_len_step", "Response length by step", "Mean and longest completion per step.", [("resp_len_mean", "mean"), ("resp_len_max", "max")], steps, "step", "tokens", True)
    lines(
        "zero_var", "Zero-variance groups and truncation", "Share of groups whose samples all got the same reward (no GRPO signal), and share of completions cut at max_tokens.",
        [("zero_var_frac", "zero-variance fraction"), ("truncation_rate", "truncation rate")], steps, "step", "fraction", True,
    )
    lines("throughput", "Generation throughput", "Generated tokens per second of generation.", [("gen_tokens_per_s", "tokens/s")], steps, "step", "tokens/s", True)
    xs = [s for s in steps if s is not None]
    stacks = [svg.Series(k[5:-2], xs, [r.get(k) for r in metrics.rows]) for k in TIME_PARTS]
    bars = svg.stacked_bars(xs, stacks, x_label="step", y_label="seconds")
    if bars:
        plots.append(Plot("time_split", "Where the time goes", "Seconds per step spent generating, scoring, training and syncing weights.", bars))
    split = time_split(metrics)
    if split:
        names = [n for _, n in TIME_SPLIT_PARTS] + ["other"]
        sx = [float(s.step) for s in split]
        tail_bars = svg.stacked_bars(sx, [svg.Series(n, sx, [s.parts[n] for s in split]) for n in names],
                                     x_label="step", y_label="seconds")
        if tail_bars:
            share = sum(s.parts["tail"] for s in split) / max(sum(s.parts[n] for s in split for n in names[:3]), 1e-12)
            plots.append(Plot("time_tail", "Where the time went, the tail apart",
                              "Seconds per step: generating tokens that trained with signal (useful), generating tokens "
                              "that did not (filtered: zero-variance groups, errored, aborted, carried), waiting after 90% "
                              "of the samples had ended (tail), scoring, training, syncing, and the rest of the step. "
                              f"The tail took {100 * share:.0f}% of all generate time.", tail_bars))
    lines("staleness", "Staleness", "Mean age, in weight versions, of the tokens trained on.", [("staleness_mean", "staleness (versions)")], steps, "step", "versions", True)
    lines("logprob_mismatch", "Behaviour vs trainer log-prob mismatch", "Mean |engine log-prob − trainer log-prob| of trained tokens; a jump flags a sampler/trainer disagreement.", [("logprob_mismatch_mean", "mismatch")], steps, "step", "nats", True)
    if rollouts.status_by_step:
        st_steps = sorted(rollouts.status_by_step)
        st_series = [svg.Series(s, st_steps, [rollouts.status_by_step[x].get(s, 0) for x in st_steps]) for s in ROLLOUT_STATUSES]
        b = svg.stacked_bars(st_steps, st_series, x_label="step", y_label="rollouts")
        if b:
            plots.append(Plot("status_by_step", "Rollouts by status", "Every stored rollout accounted for: kept, filtered, errored, truncated, aborted.", b))
    for k, label in (("kl", "KL to reference"), ("entropy", "Entropy"), ("grad_norm", "Gradient norm")):
        lines(k, label, f"`{k}` per step.", [(k, k)], steps, "step", k)

    known = {"step", "wall_s", *TIME_PARTS, *(k for k, _ in TIME_SPLIT_PARTS), "tail_frac", "reward_mean", "accuracy", "zero_var_frac", "resp_len_mean", "resp_len_max",
             "truncation_rate", "gen_tokens_per_s", "staleness_mean", "logprob_mismatch_mean", "kl", "entropy", "grad_norm"}  # fmt: skip
    missing = sorted(k for k in known - {"step"} if not metrics.has(k)) if metrics.rows else []
    elsewhere = {"eval_accuracy", "eval_accuracy_greedy", *TRL_METRIC_ALIASES}  # accuracy plot; TRL's names of plotted keys
    extra = sorted({k for r in metrics.rows for k, v in r.items() if k not in known and k not in elsewhere and isinstance(v, (int, float)) and not isinstance(v, bool)})
    for k in extra:
        lines(f"extra-{k}", k, "Also in metrics.jsonl.", [(k, k)], steps, "step", k)
    return plots, missing


def _json_for_script(obj: Any) -> str:
    # `<` escaped so no string in the data can close the script element.
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _kpi(label: str, value: str) -> str:
    return f'<div class="kpi"><div class="v">{html.escape(value)}</div><div class="k">{html.escape(label)}</div></div>'


def _acc(d: Any) -> str:
    if isinstance(d, dict) and isinstance(d.get("accuracy"), (int, float)):
        return f"{100 * d['accuracy']:.1f}%"
    return "–"


def _count(v: Any) -> int:
    """A rollout count from summary.json: a non-negative int, else 0 (a hand-edited file is not trusted)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def render_card(summary: dict[str, Any], rollouts: RolloutData) -> str:
    """The rollout card section: counts by status, accuracy definition, seeds, hashes, versions."""
    counts = summary.get("rollouts") if isinstance(summary.get("rollouts"), dict) else None
    source = "summary.json"
    if counts is None and rollouts.status_by_step:
        counts = {"total": rollouts.total_rows}
        for per in rollouts.status_by_step.values():
            for k, v in per.items():
                counts[k] = counts.get(k, 0) + v
        source = "the rollout store (summary.json has none)"
    rows = []
    if counts:
        total = _count(counts.get("total"))
        cells = "".join(
            f"<tr><th>{html.escape(k)}</th><td>{_count(counts.get(k))}</td><td>{(100 * _count(counts.get(k)) / total if total else 0):.1f}%</td></tr>"
            for k in ("total", *ROLLOUT_STATUSES)
        )
        rows.append(f"<h3>Rollouts by status <span class='muted'>(from {html.escape(source)})</span></h3><table class='card' id='status-counts'>{cells}</table>")
    info = []
    if summary.get("accuracy_method"):
        info.append(("how accuracy is computed", html.escape(str(summary["accuracy_method"]))))
    for key in ("seeds", "config_hash", "rollout_schema_version"):
        if key in summary:
            info.append((key.replace("_", " "), f"<code>{html.escape(json.dumps(summary[key], ensure_ascii=False))}</code>"))
    if isinstance(summary.get("versions"), dict):
        info.append(("versions", ", ".join(f"{html.escape(k)} <code>{html.escape(str(v))}</code>" for k, v in summary["versions"].items())))
    if isinstance(summary.get("checkpoints"), dict) and summary["checkpoints"]:
        ck = "<br>".join(
            f"{html.escape(label)}/{html.escape(f)}: <code>{html.escape(str(h))}</code>"
            for label, files in summary["checkpoints"].items() if isinstance(files, dict) for f, h in files.items()
        )  # fmt: skip
        info.append(("checkpoint sha256", ck))
    if info:
        rows.append("<table class='card' id='card-info'>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in info) + "</table>")
    if not rows:
        return "<p class='muted'>No rollout card: summary.json is missing and the store is empty.</p>"
    return "".join(rows)


def _tree_row(label: str, f: TreeFigures) -> str:
    ratio = "–" if f.ratio is None else f"{f.ratio:.2f}×"
    cells = [label, str(f.groups), str(f.leaves), str(f.distinct_leaves), str(f.copies),
             f"{f.generated_per_leaf:.1f}", f"{f.independent_per_leaf:.1f}", ratio]
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def render_trees(trees: TreeData | None) -> str:
    """The "Tree rollouts" section ('' for a run without trees): what the trees cost against independent sampling
    (overall, last step, and a line per step), and a drawing of a few groups' trees."""
    if trees is None or not trees.by_step:
        return ""
    steps = sorted(trees.by_step)
    head = "".join(f"<th>{h}</th>" for h in ("", "groups", "leaves", "distinct leaves", "copies",
                                              "generated tokens / leaf", "completion tokens / leaf", "ratio"))
    table = (f"<table class='card' id='tree-figures'><tr>{head}</tr>{_tree_row('all steps', trees.overall)}"
             f"{_tree_row(f'step {steps[-1]}', trees.by_step[steps[-1]])}</table>")
    plot = ""
    if len(steps) > 1:
        per = [trees.by_step[s] for s in steps]
        drawn = svg.line_chart([svg.Series("generated / leaf", steps, [f.generated_per_leaf for f in per]),
                                svg.Series("completion / leaf (independent)", steps, [f.independent_per_leaf for f in per])],
                               x_label="step", y_label="tokens per leaf", y_zero=True)
        if drawn:
            plot = (f'<figure class="plot" id="plot-tree_tokens" data-plot="tree_tokens"><figcaption>Generated tokens '
                    f'per leaf</figcaption><div class="desc">What the trees generated per leaf against the completion '
                    f'tokens per leaf, what independent samples would have generated.</div>{drawn}</figure>')
    figures = []
    for k, d in enumerate(trees.drawn):
        t = d.tree
        cap = (f"step {d.step}, group {d.group_id}: {d.why}. {t.leaves} leaves ({t.distinct_leaves} distinct, "
               f"{len(t.copies)} {'copy' if len(t.copies) == 1 else 'copies'}), {t.generated} tokens generated for "
               f"{t.independent} of completions")
        figures.append(f'<figure class="plot tree" id="tree-{k}" data-tree-group="{html.escape(d.group_id)}" '
                       f'data-step="{int(d.step)}" data-leaves="{int(t.leaves)}"><figcaption>{html.escape(cap)}</figcaption>'
                       f'{svg.tree_chart(t, caption=cap)}</figure>')
    desc = ("A group's samples grow as a tree: a child shares its parent's tokens before its branch point and "
            "generates its own from there; a copy is a child whose parent ended before its branch point. "
            "Generated tokens count each token once (a sample's own, from its fork); completion tokens count every "
            "sample's whole completion, what independent sampling generates.")
    return (f"<h2>Tree rollouts</h2><section id='trees'><p class='muted'>{html.escape(desc)}</p>{table}"
            f"<div class='plots'>{plot}{''.join(figures)}</div></section>")


def render(run: Path, summary: dict[str, Any], metrics: Metrics, rollouts: RolloutData, plots: list[Plot], notes: list[str], limits: ReportLimits) -> str:
    last = metrics.rows[-1] if metrics.rows else {}
    kpis = [
        _kpi("accuracy before", _acc(summary.get("eval_before"))),
        _kpi("accuracy after", _acc(summary.get("eval_after"))),
        _kpi("steps", str(summary.get("steps", len(metrics.rows)))),
        _kpi("wall-clock", f"{summary['wall_s']:.1f} s" if isinstance(summary.get("wall_s"), (int, float)) else "–"),
        _kpi("rollouts stored", str(rollouts.total_rows)),
    ]
    if isinstance(last.get("reward_mean"), (int, float)):
        kpis.append(_kpi("last reward mean", f"{last['reward_mean']:.3f}"))
    # NOTE: a plot's key can be a metrics.jsonl key (its extra plots): escaped in attributes like every string the
    # report did not write itself.
    figures = "".join(
        f'<figure class="plot" id="plot-{html.escape(p.key)}" data-plot="{html.escape(p.key)}"><figcaption>'
        f'{html.escape(p.title)}</figcaption><div class="desc">{html.escape(p.desc)}</div>{p.svg}</figure>'
        for p in plots
    )
    notes_html = ("<ul class='notes'>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>") if notes else ""
    if rollouts.total_rows:
        span = f"steps {rollouts.embedded_steps[0]}–{rollouts.embedded_steps[-1]}" if rollouts.embedded_steps else "no steps"
        cap = (
            f"This page embeds {rollouts.embedded_rows} of the {rollouts.total_rows} stored rollouts ({span}; at most the "
            f"last {limits.max_steps} steps, {limits.max_rows} rollouts in whole groups and {limits.max_tokens} tokens per "
            f"completion). Every rollout is in <code>rollouts/</code>: <code>rollwise rollouts export {html.escape(str(run))}</code>."
        )
    else:
        cap = "No rollouts stored."
    data = {"groups": rollouts.groups}
    title = f"rollwise report — {run.resolve().name}"
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title><style>{CSS}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<div class="muted">{html.escape(str(run))} · generated {generated} · self-contained: no network needed</div>
{notes_html}
<div class="kpis">{''.join(kpis)}</div>
<h2>Rollout card</h2>
<section id="card">{render_card(summary, rollouts)}</section>
<h2>Training curves</h2>
<div class="plots" id="plots">{figures or "<p class='muted'>No metrics to plot.</p>"}</div>
{render_trees(rollouts.trees)}
<h2>Rollout browser</h2>
<p class="muted" id="embed-note">{cap} Tokens are shaded by their behaviour probability: the redder, the less likely the sampled token was.</p>
<div id="browser">
  <div>
    <div id="browser-controls">
      <input id="search" type="search" placeholder="search prompts, prompt or group ids…" autocomplete="off">
      <select id="status-filter"><option value="">any status</option>{''.join(f'<option value="{s}">{s}</option>' for s in ROLLOUT_STATUSES)}</select>
    </div>
    <div class="muted" id="match-count"></div>
    <div id="groups"></div>
  </div>
  <div id="group-view"></div>
</div>
<script type="application/json" id="rollout-data">{_json_for_script(data)}</script>
<script>{JS}</script>
</body></html>
"""
