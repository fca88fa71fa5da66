from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from rollwise.cli.main import main
from rollwise.store.writer import RolloutStore


@pytest.fixture
def run_dir(tmp_path, rollouts_for, rollout_factory):
    store = RolloutStore(tmp_path / "run")
    store.write_step(0, rollouts_for(0))
    store.write_step(1, rollouts_for(1, groups=1) + [rollout_factory(step=1, group=5, status="errored", reward=None)])
    return store.run_dir


def test_export_jsonl_stdout(run_dir, capsys):
    assert main(["rollouts", "export", str(run_dir)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 10
    assert rows[0]["completion_token_ids"] == [10, 11, 12, 13, 14] and rows[0]["step"] == 0
    assert rows[-1]["status"] == "errored" and rows[-1]["reward"] is None


def test_export_csv_and_parquet_files(run_dir, tmp_path):
    out_csv, out_pq = tmp_path / "r.csv", tmp_path / "r.parquet"
    assert main(["rollouts", "export", str(run_dir), "--format", "csv", "--output", str(out_csv)]) == 0
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert len(rows) == 10 and json.loads(rows[0]["logprobs"])[0] == pytest.approx(-0.1)
    assert main(["rollouts", "export", str(run_dir), "--format", "parquet", "-o", str(out_pq)]) == 0
    assert pq.read_table(out_pq).num_rows == 10


def test_counts(run_dir, capsys):
    assert main(["rollouts", "counts", str(run_dir)]) == 0
    assert json.loads(capsys.readouterr().out) == {"total": 10, "kept": 9, "filtered": 0, "errored": 1, "truncated": 0, "aborted": 0}


def test_bad_shard_is_one_line_error_unless_skipped(run_dir, tmp_path, capsys):
    shard = run_dir / "rollouts" / "step-000001.parquet"
    shard.write_bytes(shard.read_bytes()[:100])
    out = tmp_path / "out.jsonl"
    assert main(["rollouts", "export", str(run_dir), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(shard) in err and err.startswith("rollwise rollouts: error:")
    assert not out.exists()  # no half-written export left behind
    assert main(["rollouts", "export", str(run_dir), "--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 6 and str(shard) in captured.err
    assert main(["rollouts", "counts", str(run_dir), "--skip-bad"]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 6


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["rollouts", "export", "/nonexistent/run"], "does not exist"),
        (["rollouts", "export", "{empty}"], "holds no rollout shards"),
        (["rollouts", "export", "{run}", "--format", "parquet"], "needs --output"),
    ],
)
def test_user_errors(argv, msg, run_dir, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = [a.replace("{empty}", str(tmp_path / "empty")).replace("{run}", str(run_dir)) for a in argv]
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


def test_help_does_not_import_pyarrow():
    code = "import sys; from rollwise.cli import rollouts; print('pyarrow' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
