"""`RolloutStore`: every rollout of a run, one Parquet shard per step, written atomically.

Layout: `RUN_DIR/rollouts/step-000012.parquet`, one shard per training step, nothing else. A shard is
written to a temp file in the same directory, flushed and fsynced, renamed over its final name, and the
directory is fsynced: a SIGKILL at any moment leaves either the complete old shard (or none) or the
complete new one, never a half-written `step-*.parquet`. The temp files a crash leaves behind end in
`.tmp`, so neither our reader nor `read_parquet('RUN_DIR/rollouts/*.parquet')` sees them, and the next
writer removes them.

NOTE on exactly-once after a resume: writing a step replaces that step's shard, so a resumed run that
re-runs step N does not duplicate it. A shard is also the step's write-ahead log record: `write_step(...,
journal=...)` puts a JSON record (what was trained, in what order, the RNG and loop state after the step, its
metrics line) into the shard's Parquet key-value metadata under `rollwise.journal`, so the rows and the record
land in one atomic rename. Beside it, under `rollwise.journal_seal`, a seal binds the record to its shard: the
step, the sha256 of the shard's rows and the sha256 of the record's bytes. `read_step_journal` checks all three, so
a shard copied over another step's name, or a record or rows edited after they were written, is refused
(`JournalMismatch`) instead of being re-trained as that step. A resume re-trains the steps after its checkpoint
from their shards (run/resume.py) instead of deleting them; shards it cannot use are moved aside by
`quarantine_after`, never deleted.

NOTE on what the seal proves: it catches copies, damage and edits made without rollwise; whoever rewrites the seal
as well forges it (a keyed seal would need a secret kept outside RUN_DIR, which a run does not have).

Reading is shard by shard: a truncated or corrupt shard is reported as one line naming its file
(`ShardError`) while the other shards still load (`scan`, or `strict=False`).

NOTE on corruption: shards are written with Parquet page checksums (a CRC32 per data and dictionary
page) and every read verifies them, so flipped bits in a page are an error naming the file, never a
silently different log-prob. A damaged footer fails to parse. `verify()` reads every page of every
shard once (checksums, footer, schema) without keeping the rows: the check to run before resuming.
Shards written before checksums existed carry none and are checked for structure only. Shards written before
the tree columns (`schema.ADDED_COLUMNS`) read them as nulls.

Deliberately left out: appending within a step (a step's rollouts are written once, together),
compaction, and any index beyond file names; DuckDB over the glob does ad-hoc queries well.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollwise.store.schema import (
    ADDED_COLUMNS,
    COLUMNS,
    ROLLOUT_SCHEMA,
    SCHEMA_VERSION,
    rollout_to_row,
    rows_to_table,
    shard_schema_version,
    table_to_rollouts,
)
from rollwise.types import ROLLOUT_STATUSES, Rollout

SHARD_RE = re.compile(r"^step-(\d{6,})\.parquet$")
TMP_SUFFIX = ".tmp"
JOURNAL_KEY = b"rollwise.journal"
"""Parquet key-value metadata key of a shard's write-ahead log record (JSON)."""
SEAL_KEY = b"rollwise.journal_seal"
"""Parquet key-value metadata key of the seal binding a shard's record to the shard: its step, the sha256 of its
rows (`rows_sha256`) and the sha256 of the record's bytes (JSON)."""

Decoder = Callable[[Sequence[int]], str]
"""Token ids -> text, e.g. `lambda ids: tokenizer.decode(ids)`; used for prompt text and per-token text."""


class ShardError(ValueError):
    """A shard that cannot be read; `str()` is one line that names the file."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class JournalMismatch(ShardError):
    """A shard's write-ahead log record that does not belong to it: its seal names another step, other rows or
    other record bytes (a shard copied over another's name, a record or rows edited after they were written)."""


@dataclass
class StepJournal:
    """A shard's write-ahead log record checked against its seal (`RolloutStore.read_step_journal`)."""

    record: dict[str, Any]
    sealed: bool
    """Written with a seal, and the seal matched; False: a record from before seals (an older rollwise)."""
    table: pa.Table
    """The shard's rows (read to check the seal; `schema.table_to_rollouts` makes them rollouts)."""


def rows_sha256(table: pa.Table) -> str:
    """sha256 of a shard's rows, column by column in schema order: the same for the table a shard is written from
    and the one `read_shard` reads back. Lists of numbers (token ids, log-probs: most of a shard) are hashed as
    their raw values and list lengths, the other columns as canonical JSON (about 25 ms for 128 rollouts of 512
    tokens with per-token texts, on one CPU thread)."""
    import numpy as np

    h = hashlib.sha256()
    for name in COLUMNS:
        h.update(name.encode() + b"\0")
        if name not in table.column_names:
            h.update(b"absent\0")
            continue
        col = table.column(name).combine_chunks()
        kind = col.type
        if pa.types.is_list(kind) and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type)):
            offsets = col.offsets.to_numpy().astype(np.int64)
            values = col.flatten().to_numpy(zero_copy_only=False)
            h.update(str(kind).encode() + b"\0")
            h.update(np.packbits(col.is_null().to_numpy(zero_copy_only=False)).tobytes())
            h.update((offsets - offsets[0]).tobytes())
            h.update(np.ascontiguousarray(values, dtype=np.float64 if values.dtype.kind == "f" else np.int64).tobytes())
        else:
            h.update(json.dumps(col.to_pylist(), separators=(",", ":"), default=str).encode())
    return h.hexdigest()


@dataclass
class StoreScan:
    """What `RolloutStore.scan` found: the rows of every readable shard, and one error per bad shard."""

    table: pa.Table
    shards: list[Path] = field(default_factory=list)
    """Shards that loaded, in step order."""
    errors: list[ShardError] = field(default_factory=list)


def shard_name(step: int) -> str:
    return f"step-{int(step):06d}.parquet"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RolloutStore:
    """The rollouts of one run directory. Cheap to construct; touches the disk only when used."""

    def __init__(self, run_dir: str | os.PathLike[str], *, run: str | None = None, decode: Decoder | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / "rollouts"
        self.run = run if run is not None else self.run_dir.resolve().name
        """Value of the `run` column of rows this store writes (defaults to the run directory's name)."""
        self.decode = decode
        self._token_cache: dict[int, str] = {}
        self._cleaned = False

    # ---------------------------------------------------------------- writing

    def shard_path(self, step: int) -> Path:
        return self.dir / shard_name(step)

    def write_step(self, step: int, rollouts: Iterable[Rollout], *, journal: Mapping[str, Any] | None = None) -> Path:
        """Write (or replace) the shard of `step` atomically and return its path.

        Every rollout is stored under `step` (the shard's step is the row's step). An empty list writes an
        empty shard, which still records that the step completed. journal: a JSON-able record stored in the
        shard's metadata (`read_journal` reads it back), written in the same rename as the rows.
        """
        try:
            step = operator.index(step)  # int or numpy integer; never a float
        except TypeError:
            raise ValueError(f"step must be a non-negative integer, got {step!r}") from None
        if step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        rows = [self._row(r, step) for r in rollouts]
        table = rows_to_table(rows)
        if journal is not None:
            meta = dict(table.schema.metadata or {})
            raw = json.dumps(journal, separators=(",", ":"), default=str).encode()
            meta[JOURNAL_KEY] = raw
            meta[SEAL_KEY] = json.dumps({"step": step, "rows_sha256": rows_sha256(table),
                                         "journal_sha256": hashlib.sha256(raw).hexdigest()}).encode()
            table = table.replace_schema_metadata(meta)
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._cleaned:
            self.clean_temp_files()
            self._cleaned = True
        final = self.shard_path(step)
        tmp = self.dir / f".{final.name}.{os.getpid()}{TMP_SUFFIX}"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(table, f, compression="zstd", write_page_checksum=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.dir)
        return final

    def _row(self, r: Rollout, step: int) -> dict:
        prompt_text = getattr(r, "prompt_text", None)
        token_texts = getattr(r, "token_texts", None)
        if self.decode is not None:
            if prompt_text is None:
                prompt_text = self.decode(r.prompt_token_ids)
            if token_texts is None:
                cache = self._token_cache
                token_texts = [cache[t] if t in cache else self._token_text(t) for t in r.completion_token_ids]
        return rollout_to_row(r, run=self.run, step=step, prompt_text=prompt_text, token_texts=token_texts)

    def _token_text(self, token_id: int) -> str:
        # Per-token strings are for display only; one decode per distinct id keeps this cheap.
        s = self._token_cache.get(token_id)
        if s is None:
            assert self.decode is not None
            s = self._token_cache[token_id] = self.decode([token_id])
        return s

    def clean_temp_files(self) -> list[Path]:
        """Remove temp files a crashed writer left behind; returns what was removed."""
        if not self.dir.is_dir():
            return []
        removed = []
        for p in self.dir.iterdir():
            if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX) and p.is_file():
                p.unlink(missing_ok=True)
                removed.append(p)
        return removed

    def truncate_after(self, step: int) -> list[int]:
        """Delete the shards of steps after `step`; returns them. The resume path does not call this: it keeps
        what it cannot recreate (`quarantine_after`)."""
        gone = [s for s in self.steps() if s > step]
        for s in gone:
            self.shard_path(s).unlink(missing_ok=True)
        if gone:
            _fsync_dir(self.dir)
        return gone

    def quarantine_after(self, step: int, dest: str | os.PathLike[str]) -> list[int]:
        """Move the shards of steps after `step` into `dest` (created; same file system: a rename), so a resume
        that will write those steps again keeps the old ones for inspection; returns the steps moved."""
        moved = [s for s in self.steps() if s > step]
        if not moved:
            return []
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for s in moved:
            os.replace(self.shard_path(s), dest / shard_name(s))
        _fsync_dir(dest)
        _fsync_dir(self.dir)
        return moved

    def read_journal(self, step: int) -> dict[str, Any] | None:
        """The write-ahead log record stored with the shard of `step` (None: the shard has none, e.g. it was
        written by an older rollwise). Reads the footer only. A `ShardError` naming the file when unreadable."""
        path = self.shard_path(step)
        try:
            meta = pq.read_metadata(path).metadata or {}
        except (pa.ArrowException, OSError) as e:
            raise ShardError(path, f"not a readable Parquet file (truncated or corrupt?): {_one_line(e)}") from None
        raw = meta.get(JOURNAL_KEY)
        if raw is None:
            return None
        try:
            rec = json.loads(raw)
        except RecursionError:
            raise ShardError(path, "its write-ahead log record is nested too deeply to read") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ShardError(path, f"its write-ahead log record is not valid JSON: {_one_line(e)}") from None
        if not isinstance(rec, dict):
            raise ShardError(path, "its write-ahead log record is not a JSON object")
        return rec

    def read_step_journal(self, step: int) -> StepJournal | None:
        """The write-ahead log record of `step` checked against its seal: the seal's step is `step`, its rows
        digest is the shard's rows', its record digest the record's bytes; any mismatch, or a seal that does not
        read, is a `JournalMismatch` naming the file. None when the shard has no record. A record without a seal
        (written before seals) comes back with `sealed=False`: the caller decides whether to trust it."""
        path = self.shard_path(step)
        try:
            meta = pq.read_metadata(path).metadata or {}
        except (pa.ArrowException, OSError) as e:
            raise ShardError(path, f"not a readable Parquet file (truncated or corrupt?): {_one_line(e)}") from None
        raw, seal_raw = meta.get(JOURNAL_KEY), meta.get(SEAL_KEY)
        if raw is None:
            if seal_raw is not None:
                raise JournalMismatch(path, "its write-ahead log record was removed (the shard's seal remains)")
            return None
        record = self.read_journal(step)
        assert record is not None
        table = self.read_shard(path)
        if seal_raw is None:
            return StepJournal(record, False, table)
        try:
            seal = json.loads(seal_raw)
            want = (int(seal["step"]), str(seal["rows_sha256"]), str(seal["journal_sha256"]))
        except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError):
            raise JournalMismatch(path, "the seal of its write-ahead log record does not read") from None
        if want[0] != step:
            raise JournalMismatch(path, f"it holds step {want[0]}'s rows and record, not step {step}'s (a shard "
                                        "copied over another's name?)")
        if hashlib.sha256(raw).hexdigest() != want[2]:
            raise JournalMismatch(path, "its write-ahead log record does not match the sha256 sealed with it "
                                        "(edited after it was written)")
        if rows_sha256(table) != want[1]:
            raise JournalMismatch(path, "its rows do not match the sha256 sealed with its write-ahead log record "
                                        "(edited after they were written)")
        return StepJournal(record, True, table)

    # ---------------------------------------------------------------- reading

    def steps(self) -> list[int]:
        """Steps that have a shard, ascending."""
        if not self.dir.is_dir():
            return []
        out = []
        for p in self.dir.iterdir():
            m = SHARD_RE.match(p.name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def shards(self, steps: Iterable[int] | None = None) -> list[Path]:
        have = self.steps()
        if steps is not None:
            wanted = set(steps)
            have = [s for s in have if s in wanted]
        return [self.shard_path(s) for s in have]

    def read_shard(self, path: str | os.PathLike[str], columns: Sequence[str] | None = None) -> pa.Table:
        """One shard, checked against the schema; any failure is a `ShardError` naming the file."""
        path = Path(path)
        cols = list(columns) if columns is not None else list(COLUMNS)
        unknown = [c for c in cols if c not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown rollout column(s) {unknown}; known: {', '.join(COLUMNS)}")
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
            schema = pf.schema_arrow
        except (pa.ArrowException, OSError) as e:
            raise ShardError(path, f"not a readable Parquet file (truncated or corrupt?): {_one_line(e)}") from None
        version = shard_schema_version(schema)
        if version is None:
            raise ShardError(path, "no rollwise schema version in its Parquet metadata; not a rollwise rollout shard")
        if version > SCHEMA_VERSION:
            raise ShardError(path, f"schema version {version} is newer than this rollwise reads ({SCHEMA_VERSION}); upgrade rollwise")
        missing = [c for c in cols if c not in schema.names and c not in ADDED_COLUMNS]
        if missing:
            raise ShardError(path, f"missing column(s) {missing}")
        present = [c for c in cols if c in schema.names]
        try:
            table = pf.read(columns=present)
        except (pa.ArrowException, OSError) as e:
            raise ShardError(path, _read_failure(e)) from None
        if len(present) < len(cols):  # a shard from before the tree columns: they read as null
            table = pa.table([table.column(c) if c in present else pa.nulls(table.num_rows, ROLLOUT_SCHEMA.field(c).type)
                              for c in cols], names=cols)
        try:
            return table.cast(pa.schema([ROLLOUT_SCHEMA.field(c) for c in cols], metadata=ROLLOUT_SCHEMA.metadata))
        except (pa.ArrowException, ValueError) as e:
            raise ShardError(path, f"columns do not match the rollout schema: {_one_line(e)}") from None

    def verify(self, steps: Iterable[int] | None = None, *, strict: bool = True) -> list[ShardError]:
        """Read every page of every shard (or those of `steps`) once, checking page checksums and the schema.

        Returns the bad shards' errors, in step order. strict: raise instead when there is any, a
        `ShardError` naming the first bad file and how many others there are (one line).
        """
        errors = []
        for p in self.shards(steps):
            try:
                self.read_shard(p)  # every column: each page's checksum is verified as it is decoded
            except ShardError as e:
                errors.append(e)
        if errors and strict:
            first = errors[0]
            more = f" (and {len(errors) - 1} more bad shard(s): {', '.join(e.path.name for e in errors[1:4])}" \
                   f"{', ...' if len(errors) > 4 else ''})" if len(errors) > 1 else ""
            raise ShardError(first.path, first.reason + more)
        return errors

    def scan(self, steps: Iterable[int] | None = None, columns: Sequence[str] | None = None) -> StoreScan:
        """Every readable shard's rows; bad shards become `errors` instead of stopping the read."""
        cols = list(columns) if columns is not None else list(COLUMNS)
        tables, ok, errors = [], [], []
        for p in self.shards(steps):
            try:
                tables.append(self.read_shard(p, cols))
                ok.append(p)
            except ShardError as e:
                errors.append(e)
        schema = pa.schema([ROLLOUT_SCHEMA.field(c) for c in cols], metadata=ROLLOUT_SCHEMA.metadata)
        table = pa.concat_tables(tables) if tables else schema.empty_table()
        return StoreScan(table=table, shards=ok, errors=errors)

    def read_table(
        self, steps: Iterable[int] | None = None, columns: Sequence[str] | None = None, *, strict: bool = True
    ) -> pa.Table:
        """All shards (or those of `steps`) as one table.

        strict: raise the first bad shard's `ShardError`; otherwise warn once per bad shard and skip it.
        """
        result = self.scan(steps, columns)
        _handle_errors(result.errors, strict)
        return result.table

    def read(self, steps: Iterable[int] | None = None, *, strict: bool = True) -> list[Rollout]:
        """All stored rollouts as `Rollout` objects, in step order (see `read_table` for `strict`)."""
        return table_to_rollouts(self.read_table(steps, strict=strict))

    def counts_by_status(self, *, strict: bool = True) -> dict[str, int]:
        """{"total": n, "kept": …, "filtered": …, "errored": …, "truncated": …, "aborted": …} over all shards."""
        statuses = self.read_table(columns=["status"], strict=strict).column("status").to_pylist()
        counts = {"total": len(statuses)}
        for s in ROLLOUT_STATUSES:
            counts[s] = 0
        for s in statuses:
            counts[s] = counts.get(s, 0) + 1
        return counts


def _handle_errors(errors: list[ShardError], strict: bool) -> None:
    if errors and strict:
        raise errors[0]
    for e in errors:
        warnings.warn(f"skipping unreadable rollout shard: {e}", stacklevel=3)


def _read_failure(e: BaseException) -> str:
    text = _one_line(e)
    if "CRC" in text or "checksum" in text.lower():
        return f"a page checksum does not match: the file is corrupt ({text})"
    return f"cannot read its data (truncated or corrupt?): {text}"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
