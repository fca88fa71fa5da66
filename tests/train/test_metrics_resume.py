"""metrics.jsonl on resume: only a torn last line may be dropped; everything else not kept is quarantined byte for
byte, and lines a crash cut off come back from the write-ahead log."""

from __future__ import annotations

import json

from rollwise.train.metrics import prepare_resume, read_metrics


def _line(step, **kw):
    return json.dumps({"step": step, "loss": float(step), **kw})


def test_damaged_middle_line_and_later_steps_are_quarantined_torn_last_line_dropped(tmp_path):
    damaged = '{"step": 2, "loss": 0.\x00\xff garbage'
    text = "\n".join([_line(1), damaged, _line(3), _line(4), _line(5)]) + "\n" + '{"step": 6, "lo'
    (tmp_path / "metrics.jsonl").write_bytes(text.encode("utf-8", "surrogatepass"))
    notes = prepare_resume(tmp_path, 3, restore={2: {"loss": 2.0, "time": {"train": 1.0}}})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    assert read_metrics(tmp_path)[1] == {"step": 2, "loss": 2.0, "time/train": 1.0}  # restored, flattened
    (q,) = list((tmp_path / "quarantine").glob("metrics-*.jsonl"))
    kept = q.read_bytes().split(b"\n")
    assert kept[0] == damaged.encode() and [json.loads(k)["step"] for k in kept[1:3]] == [4, 5] and kept[3] == b""
    assert any("torn last line" in n for n in notes) and any("1 damaged line(s)" in n for n in notes)
    assert any("2 line(s) of steps after 3" in n for n in notes) and any("restored 1 line" in n for n in notes)


def test_a_damaged_last_line_with_its_newline_is_not_torn_and_is_kept(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(_line(1) + "\nnot json\n")
    prepare_resume(tmp_path, 5)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1]
    (q,) = list((tmp_path / "quarantine").glob("metrics-*.jsonl"))
    assert q.read_text() == "not json\n"


def test_a_clean_file_is_left_untouched(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(_line(1) + "\n" + _line(2) + "\n")
    before = path.stat().st_mtime_ns, path.read_bytes()
    assert prepare_resume(tmp_path, 2) == []
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before and not (tmp_path / "quarantine").exists()
