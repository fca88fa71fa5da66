"""`rollwise score`: HumanEval and GSM8K acceptance on the real data, broken solutions, malformed records."""

from __future__ import annotations

import gzip
import json
import random
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollwise.cli import score as score_cli
from rollwise.cli.main import main


def _shared_data() -> Path:
    repo = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
    data = repo.parent / "shared" / "data"
    if not data.is_dir():
        pytest.skip(f"real datasets not found at {data} (expected shared/data beside the repository)")
    return data


def _write(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _problems(data: Path) -> list[dict]:
    with gzip.open(data / "humaneval" / "HumanEval.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def test_all_164_canonical_solutions_pass_quickly(tmp_path, capsys):
    data = _shared_data()
    problems = _problems(data)
    inp = _write(tmp_path / "samples.jsonl", [{"task_id": p["task_id"], "completion": p["canonical_solution"]} for p in problems])
    out = tmp_path / "scored.jsonl"
    t0 = time.monotonic()
    rc = main(["score", "--env", "humaneval", "--input", str(inp), "--output", str(out), "--data", str(data)])
    took = time.monotonic() - t0
    print(f"HumanEval: 164 canonical solutions scored in {took:.1f}s")
    assert rc == 0
    rows = _read(out)
    assert len(rows) == 164 and all(r["passed"] is True and r["result"] == "passed" for r in rows)
    assert "pass@1 164/164 = 1.0000" in capsys.readouterr().out
    assert took < 45, f"scoring HumanEval took {took:.1f}s"


BREAKERS = [
    ("return None", lambda sol: "    return None\n"),
    ("raise", lambda sol: "    raise ValueError('broken on purpose')\n"),
    ("syntax", lambda sol: sol + "\n    def (\n"),
    ("off by one", lambda sol: sol.replace("return ", "return 1 + ", 1) if "return " in sol else "    return 0\n"),
    ("exit", lambda sol: "    import sys\n    sys.exit(0)\n"),
]


def test_broken_solutions_fail(tmp_path):
    data = _shared_data()
    problems = random.Random(0).sample(_problems(data), 15)
    records = []
    for i, p in enumerate(problems):
        _, breaker = BREAKERS[i % len(BREAKERS)]
        records.append({"task_id": p["task_id"], "completion": breaker(p["canonical_solution"])})
    records.append({"task_id": problems[0]["task_id"], "completion": "    while True:\n        pass\n"})
    records.append({"task_id": problems[1]["task_id"], "completion": problems[1]["canonical_solution"]})  # control
    out = tmp_path / "scored.jsonl"
    rc = main(["score", "--env", "humaneval", "--input", str(_write(tmp_path / "in.jsonl", records)), "--output", str(out), "--data", str(data)])
    assert rc == 0
    rows = _read(out)
    assert [r["passed"] for r in rows] == [False] * 16 + [True]
    assert all(re.match(r"^(failed: .*|timed out)$", r["result"], re.DOTALL) for r in rows[:16])
    assert rows[15]["result"] == "timed out"
    assert rows[1]["result"] == "failed: broken on purpose"


def test_gsm8k_gold_scores_one_and_shuffled_near_zero(tmp_path, capsys):
    data = _shared_data()
    rows = [json.loads(line) for line in (data / "gsm8k" / "test.jsonl").open()]
    gold = _write(tmp_path / "gold.jsonl", [{**r, "completion": r["answer"]} for r in rows])
    out = tmp_path / "gold.out.jsonl"
    assert main(["score", "--env", "gsm8k", "--input", str(gold), "--output", str(out)]) == 0
    scored = _read(out)
    assert len(scored) == 1319 and all(r["score"] == 1.0 and r["correct"] for r in scored)
    assert "accuracy 1319/1319 = 1.0000" in capsys.readouterr().out
    perm = list(range(len(rows)))
    random.Random(1).shuffle(perm)
    shuffled = _write(tmp_path / "shuf.jsonl", [{**r, "completion": rows[perm[i]]["answer"]} for i, r in enumerate(rows)])
    out2 = tmp_path / "shuf.out.jsonl"
    assert main(["score", "--env", "gsm8k", "--input", str(shuffled), "--output", str(out2)]) == 0
    acc = sum(r["score"] for r in _read(out2)) / len(rows)
    assert acc < 0.03


VALID = {"question": "What is 2+3?", "answer": "2+3=5\n#### 5", "completion": "So 5.\n#### 5"}
MALFORMED = [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('"just a string"', "expected a JSON object, got str"),
    (json.dumps({"question": "q", "answer": "#### 1"}), "missing field 'completion'"),
    (json.dumps({"question": "q", "answer": "#### 1", "completion": 5}), "field 'completion' must be a string, got int"),
    (json.dumps({"answer": "#### 1", "completion": "1"}), "lacks 'question'"),
    (json.dumps({"question": "q", "answer": ["#### 1"], "completion": "1"}), "field 'answer' must be a string, got list"),
    (json.dumps({"question": "q", "answer": "1", "completion": "1"}), "no '#### N'"),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.lists(st.one_of(st.just(-1), st.integers(0, len(MALFORMED) - 1), st.just(-2)), min_size=1, max_size=12),
    huge=st.text(alphabet="0123456789 abc#\n", min_size=2001, max_size=2100),
)
def test_malformed_records_get_one_line_errors_and_the_rest_is_scored(tmp_path, capsys, monkeypatch, layout, huge):
    monkeypatch.setattr(score_cli, "MAX_COMPLETION_CHARS", 2000)
    lines, expected = [], []
    for kind in layout:
        if kind == -1:
            lines.append(json.dumps(VALID))
            expected.append(None)
        elif kind == -2:  # a huge string: over the per-record limit
            lines.append(json.dumps({**VALID, "completion": huge}))
            expected.append("completion is")
        else:
            lines.append(MALFORMED[kind][0])
            expected.append(MALFORMED[kind][1])
    inp = _write(tmp_path / "mixed.jsonl", lines)
    out = tmp_path / "mixed.out.jsonl"
    capsys.readouterr()
    rc = main(["score", "--env", "gsm8k", "--input", str(inp), "--output", str(out)])
    err_lines = capsys.readouterr().err.strip().splitlines()
    n_bad = sum(e is not None for e in expected)
    assert rc == (1 if n_bad else 0)
    assert len(err_lines) == n_bad
    bad_line_numbers = [i + 1 for i, e in enumerate(expected) if e is not None]
    for msg, line_no in zip(err_lines, bad_line_numbers):
        assert msg.startswith(f"{inp}:{line_no}: ")
    for msg, want in zip(err_lines, [e for e in expected if e is not None]):
        assert want in msg
    rows = _read(out)
    assert len(rows) == len(lines)
    for row, e in zip(rows, expected):
        if e is None:
            assert row["score"] == 1.0 and "error" not in row
        else:
            assert e in row["error"]


def test_generic_env_records_and_command_errors(tmp_path, capsys):
    inp = _write(tmp_path / "arith.jsonl", [
        {"prompt": "23+45=", "answer": 68, "completion": "68"},
        {"prompt": "2+2=", "answer": 4, "completion": "5"},
        {"prompt": "2+2=", "completion": "4"},
    ])
    out = tmp_path / "arith.out.jsonl"
    assert main(["score", "--env", "arithmetic", "--input", str(inp), "--output", str(out)]) == 1
    rows = _read(out)
    assert [r.get("score") for r in rows[:2]] == [1.0, 0.0] and rows[2]["error"] == "missing field 'answer'"
    assert "accuracy 1/2 = 0.5000" in capsys.readouterr().out
    assert main(["score", "--env", "gsm8k", "--input", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["score", "--env", "no-such-env", "--input", str(inp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"rollwise score: error: --input {str(tmp_path / 'missing.jsonl')!r}: no such file",
                   err[1]] and err[1].startswith("rollwise score: error: unknown environment 'no-such-env'")


def test_humaneval_unknown_task_id_is_a_record_error(tmp_path, capsys):
    data = _shared_data()
    inp = _write(tmp_path / "he.jsonl", [{"task_id": "HumanEval/9999", "completion": "x"}, {"completion": "x"}])
    rc = main(["score", "--env", "humaneval", "--input", str(inp), "--data", str(data)])
    err = capsys.readouterr().err
    assert rc == 1 and f"{inp}:1: unknown task_id 'HumanEval/9999'" in err and f"{inp}:2: missing field 'task_id'" in err


def test_score_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, rollwise.cli.score, rollwise.envs, rollwise.rewards; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_mbpp_samples_with_integer_task_ids(tmp_path, capsys):
    data = _shared_data()
    recs = json.loads((data / "mbpp" / "sanitized-mbpp.json").read_text())[:3]
    inp = _write(tmp_path / "mbpp.jsonl", [{"task_id": recs[0]["task_id"], "completion": recs[0]["code"]},
                                            {"task_id": f"mbpp/{recs[1]['task_id']}", "completion": recs[1]["code"]},
                                            {"task_id": recs[2]["task_id"], "completion": "def f():\n    pass\n"},
                                            {"task_id": True, "completion": "x"}])
    out = tmp_path / "mbpp.out.jsonl"
    assert main(["score", "--env", "mbpp", "--input", str(inp), "--output", str(out), "--data", str(data)]) == 1
    rows = _read(out)
    assert [r.get("passed") for r in rows[:3]] == [True, True, False] and rows[2]["result"].startswith("failed: ")
    assert rows[3]["error"] == "field 'task_id' must be a string, got bool"
    assert "pass@1 2/3" in capsys.readouterr().out
