"""`rollwise rollouts …`: look at a run's rollout store without writing code.

  rollwise rollouts export RUN_DIR [--format jsonl|csv|parquet] [--output F] [--skip-bad]
  rollwise rollouts counts RUN_DIR [--skip-bad]
  rollwise rollouts verify RUN_DIR      (every page's checksum; exit 1 and one line per bad shard)

pyarrow is imported inside `run`, after parsing, so `rollwise --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rollwise.cli.terminal import say


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

    v = sub.add_parser("verify", help="read every shard whole, checking page checksums; exit 1 if any is bad")
    v.add_argument("run_dir", metavar="RUN_DIR")


def _open_store(run_dir: str):
    from rollwise.store.writer import RolloutStore

    from rollwise.cli.paths import run_dir as checked_run_dir

    path = checked_run_dir(run_dir)
    store = RolloutStore(path)
    if not store.steps():
        raise ValueError(f"{store.dir} holds no rollout shards (step-NNNNNN.parquet)")
    return store


def _tables(store, skip_bad: bool, columns=None):
    """Shard by shard, so an export of a long run never holds the whole store in memory."""
    from rollwise.store.writer import ShardError

    for path in store.shards():
        try:
            yield store.read_shard(path, columns)
        except ShardError as err:
            if not skip_bad:
                raise
            say(f"rollwise rollouts: skipping unreadable shard: {err}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    store = _open_store(args.run_dir)
    if args.rollouts_command == "verify":
        return _verify(store)
    if args.rollouts_command == "counts":
        from rollwise.store.card import normalise_counts

        counts: dict[str, int] = {}
        for t in _tables(store, args.skip_bad, ["status"]):
            for s in t.column("status").to_pylist():
                counts[s] = counts.get(s, 0) + 1
        print(json.dumps(normalise_counts(counts)))
        return 0
    if args.format == "parquet" and not args.output:
        raise ValueError("--format parquet needs --output F")
    from rollwise.cli.paths import output_file

    output_file(args.output)
    try:
        n = _export(store, args)
    except BaseException:
        if args.output:  # no half-written export left behind
            Path(args.output).unlink(missing_ok=True)
        raise
    if args.output:
        say(f"wrote {n} rollouts to {args.output}", file=sys.stderr)
    return 0


def _verify(store) -> int:
    shards = store.shards()
    errors = store.verify(strict=False)
    for err in errors:
        say(f"rollwise rollouts: bad shard: {err}", file=sys.stderr)
    if errors:
        print(f"{len(errors)} of {len(shards)} shards unreadable; the others verified")
        return 1
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in shards)
    print(f"{len(shards)} shards, {rows} rollouts: all pages verified")
    return 0


def _export(store, args: argparse.Namespace) -> int:
    from rollwise.store.schema import ROLLOUT_SCHEMA

    n = 0
    tables = _tables(store, args.skip_bad)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(args.output, ROLLOUT_SCHEMA, compression="zstd", write_page_checksum=True) as w:
            for t in tables:
                w.write_table(t)
                n += t.num_rows
        return n
    out = open(args.output, "w", encoding="utf-8", newline="") if args.output else sys.stdout
    try:
        if args.format == "csv":
            import csv

            w = csv.writer(out)
            w.writerow(ROLLOUT_SCHEMA.names)
            for t in tables:
                for row in t.to_pylist():
                    # List-valued cells as JSON text, so every cell is one value.
                    w.writerow([json.dumps(v) if isinstance(v, list) else ("" if v is None else v) for v in row.values()])
                    n += 1
        else:
            for t in tables:
                for row in t.to_pylist():
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    n += 1
    finally:
        if out is not sys.stdout:
            out.close()
        else:
            out.flush()
    return n
