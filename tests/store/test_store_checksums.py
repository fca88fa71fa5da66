"""Corruption is caught, not read: page checksums on write, verified on every read, and `verify()` before a resume.

Each test damages a real shard written by the store: 4 flipped bytes in a log-prob page (which a reader
without checksums decodes into a different number without complaint), or a shard cut short.
"""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

from rollwise.cli.main import main
from rollwise.store.schema import rows_to_table
from rollwise.store.writer import RolloutStore, ShardError
from shard_damage import flip_silently, truncate


def _store(tmp_path, rollout_factory, steps=3) -> RolloutStore:
    store = RolloutStore(tmp_path / "run")
    for s in range(steps):
        store.write_step(s, [rollout_factory(s, g, i, n_tokens=48, logprobs=[-2.6 + 0.01 * t for t in range(48)])
                             for g in range(3) for i in range(4)])
    return store


def test_written_shards_carry_page_checksums(tmp_path, rollout_factory):
    store = _store(tmp_path, rollout_factory, steps=1)
    before, after = flip_silently(store.shard_path(0))
    flat_b = [x for row in before for x in row]
    flat_a = [x for row in after for x in row]
    assert flat_b != flat_a and all(math.isfinite(x) for x in flat_b)  # what a checksum-less reader returns
    with pytest.raises(ShardError) as e:
        store.read()
    msg = str(e.value)
    assert e.value.path == store.shard_path(0) and str(store.shard_path(0)) in msg
    assert "page checksum does not match" in msg and "\n" not in msg


def test_verify_names_every_bad_shard(tmp_path, rollout_factory):
    store = _store(tmp_path, rollout_factory, steps=5)
    assert store.verify() == [] and store.verify(strict=False) == []
    flip_silently(store.shard_path(1))
    truncate(store.shard_path(3))
    errors = store.verify(strict=False)
    assert [e.path for e in errors] == [store.shard_path(1), store.shard_path(3)]
    assert "checksum" in errors[0].reason and "truncated or corrupt" in errors[1].reason
    with pytest.raises(ShardError) as e:
        store.verify()
    msg = str(e.value)
    assert msg.startswith(str(store.shard_path(1))) and "and 1 more bad shard(s): step-000003.parquet" in msg
    assert "\n" not in msg
    # Only the steps asked for are read: a resume from step 0's checkpoint checks step 0 alone.
    assert store.verify(steps=[0, 2, 4]) == []


def test_truncated_old_shard_is_found_before_a_resume(tmp_path, rollout_factory):
    """The resume path's check: a shard older than the checkpoint, cut short, fails verify() at once,
    where reading only the `status` column (as the end-of-run counts do) also fails, but after training."""
    store = _store(tmp_path, rollout_factory, steps=4)
    truncate(store.shard_path(1), keep=0.9)
    resume_from = 2
    store.truncate_after(resume_from)
    with pytest.raises(ShardError, match=r"step-000001\.parquet: .*truncated or corrupt"):
        store.verify(steps=range(resume_from + 1))


def test_checksum_less_shards_still_read(tmp_path, rollout_factory):
    """Shards written before checksums existed load as before (they can only be checked for structure)."""
    store = RolloutStore(tmp_path / "run")
    store.dir.mkdir(parents=True)
    table = rows_to_table([store._row(rollout_factory(0, 0, i), 0) for i in range(3)])
    pq.write_table(table, store.shard_path(0), compression="zstd")
    assert len(store.read()) == 3 and store.verify() == []


def test_export_refuses_a_corrupt_page_in_one_line(tmp_path, rollout_factory, capsys):
    store = _store(tmp_path, rollout_factory)
    good = tmp_path / "good.jsonl"
    assert main(["rollouts", "export", str(store.run_dir), "-o", str(good)]) == 0
    lp = [json.loads(line)["logprobs"] for line in good.read_text().splitlines()]
    assert lp[0][0] == pytest.approx(-2.6)
    flip_silently(store.shard_path(2))
    capsys.readouterr()
    out = tmp_path / "out.jsonl"
    assert main(["rollouts", "export", str(store.run_dir), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(store.shard_path(2)) in err and "checksum" in err
    assert not out.exists()


def test_verify_command(tmp_path, rollout_factory, capsys):
    store = _store(tmp_path, rollout_factory)
    assert main(["rollouts", "verify", str(store.run_dir)]) == 0
    assert "3 shards, 36 rollouts: all pages verified" in capsys.readouterr().out
    flip_silently(store.shard_path(0))
    truncate(store.shard_path(2))
    assert main(["rollouts", "verify", str(store.run_dir)]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 2 and str(store.shard_path(0)) in lines[0] and str(store.shard_path(2)) in lines[1]
    assert "2 of 3 shards unreadable" in captured.out
