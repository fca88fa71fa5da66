"""write_report without a browser: content, caps, robustness, escaping, CLI."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import pytest

from rollwise.cli.main import main
from rollwise.report import ReportLimits, write_report
from rollwise.report.data import load_metrics
from rollwise.report.svg import Series, histogram, line_chart, nice_ticks, stacked_bars
from rollwise.store.writer import RolloutStore


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="rollout-data">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1))


def test_report_is_self_contained(run_dir):
    path = write_report(run_dir)
    assert path == run_dir / "report.html"
    page = path.read_text()
    # No external resources of any kind: only the SVG namespace URI is allowed to look like a URL.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) <= {"http://www.w3.org/2000/svg"}
    assert "<link" not in page and "@import" not in page
    assert path.stat().st_size < 1_000_000


def test_plots_and_notes(run_dir):
    page = write_report(run_dir).read_text()
    plots = re.findall(r'data-plot="([^"]+)"', page)
    assert {"reward_step", "reward_wall", "resp_len_hist", "time_split", "staleness", "status_by_step", "extra-lr"} <= set(plots)
    assert "skipped 1 unparsable line(s) (21)" in page  # the line a kill cut short
    assert "75.0%" in page and "29.0%" in page  # eval before/after
    assert "how accuracy is computed" in page and "errored" in page


def test_embedding_caps_are_applied_and_stated(run_dir):
    page = write_report(run_dir, limits=ReportLimits(max_steps=3, max_rows=20, max_tokens=2)).read_text()
    groups = _embedded(page)["groups"]
    # 20 rows in whole groups of 4, newest step first
    assert len(groups) == 5 and {g["step"] for g in groups} == {19}
    assert all(len(s["lp"]) <= 2 and len(s["tok"]) <= 2 for g in groups for s in g["samples"])
    assert "embeds 20 of the 480 stored rollouts" in page and "at most the last 3 steps" in page


def test_rollout_text_cannot_break_out_of_the_page(tmp_path, run_dir):
    store = RolloutStore(run_dir)
    rs = store.read(steps=[19])
    rs[0].text = "</script><script>alert(1)</script>"
    rs[0].reward_parts = {"x": float("nan")}
    store.write_step(19, rs)
    store2 = RolloutStore(run_dir, decode=lambda ids: "</script><img src=x onerror=alert(1)>")
    store2.write_step(18, store.read(steps=[18]))
    page = write_report(run_dir).read_text()
    assert page.count("</script>") == 2  # the data block's and the script's own
    data = _embedded(page)
    assert any((g["prompt"] or "").startswith("</script><img") for g in data["groups"] if g["step"] == 18)


class _Markup:
    """Every element and attribute of a page, as a browser's tokenizer sees them."""

    def __init__(self, page: str) -> None:
        from html.parser import HTMLParser

        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        outer = self

        class P(HTMLParser):
            def handle_starttag(self, tag, attrs):
                outer.tags.append(tag)
                outer.attrs.extend(attrs)

        P().feed(page)


HOSTILE = '"><img src=x onerror=alert(1)><b x="'


def _no_markup_from_the_run(page: str) -> None:
    markup = _Markup(page)
    assert not [a for a, _ in markup.attrs if a.startswith("on")], "an event handler from the run folder"
    assert "img" not in markup.tags and markup.tags.count("script") == 2


def test_a_metrics_key_cannot_add_markup_to_the_report(run_dir):
    """A metrics key landed unescaped in its plot's id= and data-plot= attributes: a live onmouseover. Now every
    string the report did not write itself is escaped; the plot is still drawn, under its escaped key."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    hostile_key = 'x" onmouseover="alert(1)'
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in [json.loads(x) for x in lines[:-1]]:
            f.write(json.dumps({**r, hostile_key: 1.0, HOSTILE: 2.0}) + "\n")
    page = write_report(run_dir).read_text()
    _no_markup_from_the_run(page)
    assert f'data-plot="extra-{html.escape(hostile_key)}"' in page


def test_summary_strings_cannot_add_markup_to_the_report(run_dir):
    """The card's counts from summary.json landed raw in its table (and a string count stopped the report with a
    TypeError); version and checkpoint names are escaped too."""
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["rollouts"] = {"total": HOSTILE, "kept": HOSTILE, HOSTILE: 3}
    summary["versions"] = {HOSTILE: HOSTILE}
    summary["checkpoints"] = {HOSTILE: {HOSTILE: HOSTILE}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    _no_markup_from_the_run(write_report(run_dir).read_text())


def test_missing_summary_and_metrics(tmp_path, run_dir):
    (run_dir / "summary.json").unlink()
    (run_dir / "metrics.jsonl").unlink()
    page = write_report(run_dir).read_text()
    assert "summary.json not found" in page and "metrics.jsonl not found" in page
    assert 'data-plot="resp_len_hist"' in page and 'data-plot="status_by_step"' in page
    assert "from the rollout store" in page  # counts fall back to the store


def test_bad_shard_is_named_on_the_page(run_dir):
    bad = run_dir / "rollouts" / "step-000019.parquet"
    bad.write_bytes(bad.read_bytes()[:50])
    page = write_report(run_dir).read_text()
    assert str(bad) in page and "skipped unreadable shard" in page
    assert {g["step"] for g in _embedded(page)["groups"]} == set(range(11, 19))


def _shard_damage():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("shard_damage", Path(__file__).parents[1] / "store" / "shard_damage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_undecodable_step_is_named_not_dropped_silently(run_dir, capsys):
    """Step 19's status column still reads but its log-prob pages do not: the page says so (it used to vanish)."""
    bad = run_dir / "rollouts" / "step-000019.parquet"
    _shard_damage().scramble(bad, "logprobs")
    RolloutStore(run_dir).read_shard(bad, ["step", "num_generated", "status"])  # the light columns are fine
    page = write_report(run_dir).read_text()
    assert f"skipped unreadable shard {bad}" in page and "step 19 is left out of the browser" in page
    assert {g["step"] for g in _embedded(page)["groups"]} == set(range(11, 19))


def test_corrupt_page_of_an_old_step_is_named_on_the_page_and_by_the_cli(run_dir, tmp_path, capsys):
    """4 flipped bytes in step 3's log-probs (outside the embedded steps): named, not read as a different number."""
    bad = run_dir / "rollouts" / "step-000003.parquet"
    _shard_damage().flip_silently(bad, "logprobs")
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--output", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "page checksum does not match" in err[0]
    page = out.read_text()
    assert "step 3 is left out" in page and str(bad) in page


def test_not_a_run_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "nope")
    with pytest.raises(ValueError, match="not a rollwise run directory"):
        write_report(tmp_path)


def test_metrics_resume_duplicates_keep_last(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 0, "reward_mean": 0.1}\n{"step": 1, "reward_mean": 0.2}\n{"step": 1, "reward_mean": 0.3}\n[1]\n')
    m = load_metrics(p)
    assert [(r["step"], r["reward_mean"]) for r in m.rows] == [(0, 0.1), (1, 0.3)]
    assert m.notes and "line(s) (4)" in m.notes[0]


def test_wall_clock_elapsed_or_durations(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps({"step": i, "wall_s": w}) for i, w in enumerate([1.0, 2.5, 4.0])))
    assert load_metrics(p).wall_clock() == [1.0, 2.5, 4.0]
    p.write_text("\n".join(json.dumps({"step": i, "wall_s": w}) for i, w in enumerate([1.0, 1.5, 1.0])))
    assert load_metrics(p).wall_clock() == [1.0, 2.5, 3.5]


def test_svg_helpers():
    assert nice_ticks(0, 1) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(-0.4, 19.4) == [-5.0, 0.0, 5.0, 10.0, 15.0, 20.0]
    assert nice_ticks(3, 3)[0] <= 3 <= nice_ticks(3, 3)[-1]
    assert line_chart([Series("a", [0, 1], [float("nan"), float("inf")])], x_label="x", y_label="y") is None
    svg = line_chart([Series("a", [0, 1, 2], [1, 2, 3]), Series("b", [], [])], x_label="x", y_label="y")
    assert svg.count('class="data line"') == 1 and ">a<" in svg and ">b<" not in svg
    assert histogram([], x_label="x") is None
    assert histogram([5, 5, 5], x_label="x").count('class="data bar"') == 1
    bars = stacked_bars([0, 1], [Series("p", [0, 1], [1.0, None]), Series("q", [0, 1], [2.0, 3.0])], x_label="s", y_label="t")
    assert bars.count('class="data bar"') == 3


def test_cli(run_dir, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "--output", str(out), "--max-steps", "1"]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out
    assert {g["step"] for g in _embedded(out.read_text())["groups"]} == {19}
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["report", str(run_dir), "--max-rows", "-1"]) == 2


def test_cli_modules_import_no_heavy_deps():
    code = "import sys; from rollwise.cli import rollouts, report; print('pyarrow' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_accuracy_curve_sums_step_costs_without_evaluations_and_the_page_draws_it(tmp_path):
    """The curve the report draws and bench/time_to_accuracy.py reads: one point per evaluation, cost summed over
    the steps up to it (step_s already leaves the evaluation out), the before and after points from summary.json."""
    from rollwise.report.build import build_plots
    from rollwise.report.data import RolloutData, accuracy_curve

    rows = [{"step": 1, "step_s": 2.0, "gen_tokens": 10, "cpu_s": 3.0},
            {"step": 2, "step_s": 4.0, "gen_tokens": 20, "cpu_s": 5.0, "eval_accuracy_greedy": 0.5,
             "eval_accuracy": 0.25, "time_eval_s": 99.0},
            {"step": 3, "step_s": 1.0, "gen_tokens": 5, "cpu_s": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = {"eval_before": {"accuracy": 0.0, "accuracy_greedy": 0.1},
               "eval_after": {"accuracy": 0.5, "accuracy_greedy": 0.75}, "steps": 3}
    c = accuracy_curve(load_metrics(tmp_path / "metrics.jsonl"), summary)
    assert c.steps == [0, 2, 3] and c.train_s == [0.0, 6.0, 7.0] and c.tokens == [0, 30, 35]
    assert c.cpu_s == [0.0, 8.0, 9.0] and c.greedy == [0.1, 0.5, 0.75] and c.sampled == [0.0, 0.25, 0.5]
    assert c.first_reaching(0.5) == 1 and c.first_reaching(0.8) is None
    assert accuracy_curve(load_metrics(tmp_path / "metrics.jsonl"), {}) is None  # nothing before training
    rows[0].pop("cpu_s")  # an older run without CPU seconds: no CPU cost rather than a wrong one
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert accuracy_curve(load_metrics(tmp_path / "metrics.jsonl"), summary).cpu_s[1:] == [None, None]
    plots, _ = build_plots(load_metrics(tmp_path / "metrics.jsonl"), RolloutData([], [], {}, 0, 0, []), summary)
    assert "accuracy_time" in [p.key for p in plots]


def test_trl_named_copies_of_plotted_metrics_get_no_plot_of_their_own(run_dir):
    """metrics.jsonl repeats some keys under TRL's names (train.metrics.TRL_METRIC_ALIASES): the report plots each
    value once, and still plots TRL-only values such as reward_std."""
    from rollwise.train.metrics import TRL_METRIC_ALIASES

    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    out = []
    for line in lines[:-1]:
        rec = json.loads(line)
        rec.update({trl: rec[ours] for trl, ours in TRL_METRIC_ALIASES.items() if ours in rec})
        rec["reward_std"] = 0.3
        out.append(json.dumps(rec))
    path.write_text("\n".join([*out, lines[-1]]))
    plots = set(re.findall(r'data-plot="([^"]+)"', write_report(run_dir).read_text()))
    assert not {f"extra-{k}" for k in TRL_METRIC_ALIASES} & plots
    assert {"extra-lr", "extra-reward_std"} <= plots


def test_where_the_time_went_panel(run_dir):
    """The controller's split of the generate phase (useful / filtered / tail) beside scoring, training and syncing,
    stacked per step; "other" is what is left of step_s."""
    from rollwise.report.data import time_split

    page = write_report(run_dir).read_text()
    m = re.search(r'<figure class="plot" id="plot-time_tail".*?</figure>', page, re.S)
    assert m, "no where-the-time-went panel"
    panel = m.group(0)
    for name in ("useful", "filtered", "tail", "score", "train", "sync", "other"):
        assert f">{name}</text>" in panel, name
    assert panel.count('class="data bar"') == 20 * 7  # 20 steps, seven parts each
    assert "extra-time_tail_s" not in page and "extra-tail_frac" not in page  # not plotted twice
    steps = time_split(load_metrics(run_dir / "metrics.jsonl"))
    assert len(steps) == 20 and steps[0].parts["tail"] == 0.2 and steps[0].parts["other"] == pytest.approx(0.03)
    assert sum(steps[0].parts.values()) == pytest.approx(steps[0].step_s)


def test_time_split_from_hand_made_records(tmp_path):
    from rollwise.report.data import time_split, time_split_totals

    rows = [
        {"step": 1, "time_generate_s": 5.0},  # no tail measured (a batch engine): left out
        {"step": 2, "time_tail_s": 2.0, "tail_frac": 0.5, "time_gen_useful_s": 1.0, "time_gen_filtered_s": 1.0,
         "time_score_s": 0.5, "time_train_s": 3.0, "time_sync_s": 0.5, "step_s": 8.5},
        # asynchronous: generation overlapped training, the parts exceed step_s, nothing is "other"
        {"step": 3, "time_tail_s": 1.0, "tail_frac": 0.25, "time_gen_useful_s": 3.0, "time_gen_filtered_s": 0.0,
         "time_train_s": 3.0, "step_s": 4.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steps = time_split(load_metrics(tmp_path / "metrics.jsonl"))
    assert [s.step for s in steps] == [2, 3]
    assert steps[0].parts == {"useful": 1.0, "filtered": 1.0, "tail": 2.0, "score": 0.5, "train": 3.0, "sync": 0.5,
                              "other": 0.5}
    assert steps[1].parts["other"] == 0.0 and steps[1].parts["score"] == 0.0 and steps[1].tail_frac == 0.25
    tot = time_split_totals(steps)
    assert tot["tail"] == 3.0 and tot["useful"] == 4.0 and tot["tail_frac"] == pytest.approx(3.0 / 8.0)
