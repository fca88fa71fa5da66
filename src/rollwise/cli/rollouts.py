"""`rollwise rollouts …`: look at a run's rollout store without writing code.

  rollwise rollouts export RUN_DIR [--format jsonl|csv|parquet] [--output F] [--skip-bad]
  rollwise rollouts counts RUN_DIR [--skip-bad]

pyarrow is imported inside `run`, after parsing, so `rollwise --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("rollouts", help="export or count the rollouts stored in a run directory")
    sub = p.add_subparsers(dest="rollouts_command", metavar="ACTION", required=True)

    e = sub.add_parser("export", help="write every stored rollout as JSONL, CSV or one Parquet file")
    e.add_argument("run_dir", metavar="RUN_DIR")
    e.add_argument("--format", choices=("jsonl", "csv", "parquet"), default="jsonl")
    e.add_argument("--output", "-o", metavar="F", help="output file (default: stdout for jsonl/csv; required for parquet)")
    e.add_argument("--skip-bad", action="store_true", help="skip unreadable shards (named on stderr) instead of failing")

    c = sub.add_parser("counts", help="print rollout counts by status as JSON")
    c.add_argument("run_dir", metavar="RUN_DIR")
    c.add_argument("--skip-bad", action="store_true", help="skip unreadable shards (named on stderr) instead of failing")


def _open_store(run_dir: str):
    from rollwise.store.writer import RolloutStore

    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    store = RolloutStore(path)
    if not store.steps():
        raise ValueError(f"{store.dir} holds no rollout shards (step-NNNNNN.parquet)")
    return store


def _load(store, skip_bad: bool):
    scan = store.scan()
    if scan.errors and not skip_bad:
        raise scan.errors[0]
    for err in scan.errors:
        print(f"rollwise rollouts: skipping unreadable shard: {err}", file=sys.stderr)
    return scan.table


def run(args: argparse.Namespace) -> int:
    store = _open_store(args.run_dir)
    table = _load(store, args.skip_bad)
    if args.rollouts_command == "counts":
        from rollwise.store.card import normalise_counts

        statuses = table.column("status").to_pylist()
        print(json.dumps(normalise_counts({s: statuses.count(s) for s in set(statuses)})))
        return 0
    if args.format == "parquet":
        if not args.output:
            raise ValueError("--format parquet needs --output F")
        import pyarrow.parquet as pq

        pq.write_table(table, args.output, compression="zstd")
    elif args.format == "jsonl":
        _write_text(args.output, (json.dumps(row, ensure_ascii=False) + "\n" for row in table.to_pylist()))
    else:
        _write_text(args.output, _csv_lines(table))
    if args.output:
        print(f"wrote {table.num_rows} rollouts from {len(store.steps())} shards to {args.output}", file=sys.stderr)
    return 0


def _csv_lines(table):
    """CSV with list-valued columns as JSON text, so every cell is one value."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(table.column_names)
    yield buf.getvalue()
    for row in table.to_pylist():
        buf.seek(0)
        buf.truncate()
        w.writerow([json.dumps(v) if isinstance(v, list) else ("" if v is None else v) for v in row.values()])
        yield buf.getvalue()


def _write_text(output: str | None, chunks) -> None:
    if output is None:
        for c in chunks:
            sys.stdout.write(c)
        sys.stdout.flush()
        return
    with open(output, "w", encoding="utf-8", newline="") as f:
        for c in chunks:
            f.write(c)
