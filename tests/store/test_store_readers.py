"""The shards are readable as they are by the tools people will point at them."""

from __future__ import annotations

import json

import pytest

from rollwise.store.writer import RolloutStore


@pytest.fixture
def store(tmp_path, rollouts_for, rollout_factory):
    s = RolloutStore(tmp_path / "run")
    s.write_step(0, rollouts_for(0))
    s.write_step(1, rollouts_for(1)[:-1] + [rollout_factory(step=1, group=1, sample=2, status="errored", reward=None)])
    # What a writer killed mid-write leaves behind: every tool below must ignore it.
    (s.dir / ".step-000002.parquet.4242.tmp").write_bytes(b"PAR1 half written")
    return s


def test_pandas(store):
    pd = pytest.importorskip("pandas")
    df = pd.read_parquet(store.dir)  # the whole directory, as pandas users do
    assert len(df) == 12
    assert sorted(df["step"].unique().tolist()) == [0, 1]
    assert list(df.loc[0, "completion_token_ids"]) == [10, 11, 12, 13, 14]
    assert df["status"].value_counts().to_dict() == {"kept": 11, "errored": 1}
    assert json.loads(df.loc[0, "env_info"]) == {"turns": 1}


def test_duckdb(store):
    duckdb = pytest.importorskip("duckdb")
    glob = f"{store.dir}/*.parquet"
    rows = duckdb.sql(
        f"SELECT step, count(*) AS n, sum(num_generated) AS toks FROM read_parquet('{glob}') GROUP BY step ORDER BY step"
    ).fetchall()
    assert rows == [(0, 6, 30), (1, 6, 30)]
    (n_err,) = duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}') WHERE status = 'errored' AND reward IS NULL").fetchall()[0]
    assert n_err == 1
    (turns,) = duckdb.sql(f"SELECT max(CAST(env_info->>'turns' AS INTEGER)) FROM read_parquet('{glob}')").fetchall()[0]
    assert turns == 1
    (lp,) = duckdb.sql(f"SELECT logprobs[1] FROM read_parquet('{glob}') LIMIT 1").fetchall()[0]
    assert lp == pytest.approx(-0.1)
    (version,) = duckdb.sql(
        f"SELECT DISTINCT decode(value) FROM parquet_kv_metadata('{glob}') WHERE decode(key) = 'rollwise.schema_version'"
    ).fetchall()[0]
    assert version == "1"


def test_hf_datasets(store, tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "parquet", data_files=f"{store.dir}/*.parquet", split="train", cache_dir=str(tmp_path / "hf-cache")
    )
    assert ds.num_rows == 12
    assert ds[0]["completion_token_ids"] == [10, 11, 12, 13, 14]
    assert ds[0]["logprobs"][0] == pytest.approx(-0.1)
    assert sum(1 for s in ds["status"] if s == "errored") == 1
