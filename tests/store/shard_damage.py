"""Damage a real shard the way a disk or a copy does, for the corruption tests of the store, CLI and report."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def _chunk_span(path: Path, column: str) -> tuple[int, int]:
    """Byte range of `column`'s chunk in row group 0 (its dictionary page, if any, then its data pages)."""
    rg = pq.ParquetFile(path).metadata.row_group(0)
    for i in range(rg.num_columns):
        c = rg.column(i)
        if c.path_in_schema.split(".")[0] == column:
            start = c.dictionary_page_offset or c.data_page_offset
            return start, start + c.total_compressed_size
    raise KeyError(column)


def flip_silently(path: Path, column: str = "logprobs") -> tuple[list, list]:
    """Flip 4 bytes inside `column`'s pages where a reader that skips page checksums notices nothing.

    Tries positions through the chunk until one decodes without error to different values (with zstd most
    do: a flipped literal decompresses to a flipped value). Returns (values before, values after) as that
    unchecked reader sees them; the file is left damaged.
    """
    path = Path(path)
    raw = path.read_bytes()
    before = pq.read_table(path, columns=[column]).column(column).to_pylist()
    start, end = _chunk_span(path, column)
    probe = path.with_name(path.name + ".probe")
    try:
        for pos in range(start + 16, end - 4):
            data = bytearray(raw)
            data[pos:pos + 4] = bytes(b ^ 0x5A for b in data[pos:pos + 4])
            probe.write_bytes(data)
            try:
                after = pq.read_table(probe, columns=[column], page_checksum_verification=False).column(column).to_pylist()
            except Exception:  # noqa: BLE001 - this position breaks the decoder loudly; look for a silent one
                continue
            if after != before:
                path.write_bytes(data)
                return before, after
    finally:
        probe.unlink(missing_ok=True)
    raise AssertionError(f"no silent 4-byte flip found in column {column} of {path}")


def truncate(path: Path, keep: float = 0.6) -> None:
    path = Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def scramble(path: Path, column: str = "logprobs") -> None:
    """Overwrite `column`'s whole chunk with garbage: that column no longer decodes, the others still do."""
    path = Path(path)
    start, end = _chunk_span(path, column)
    data = bytearray(path.read_bytes())
    data[start:end] = bytes(b ^ 0xA5 for b in data[start:end])
    path.write_bytes(data)
