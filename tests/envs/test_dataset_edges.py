"""Attacks on the `dataset` environment's loaders: files as spreadsheets and exporters really write them."""

from __future__ import annotations

import csv
import json
import warnings

import pytest

from rollwise.envs.dataset import DatasetEnv, DatasetError, DatasetOverlapWarning


def _jsonl(path, rows, bom=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def test_csv_with_a_utf8_bom_keeps_its_first_column(tmp_path):
    # Excel's "CSV UTF-8" starts the file with a BOM; read as plain UTF-8 the first column is '\ufeffprompt'
    # and, with the answer first, every answer silently became None.
    p = tmp_path / "excel.csv"
    p.write_bytes("answer,prompt\r\n7,3+4?\r\n9,4+5?\r\n".encode("utf-8-sig"))
    tasks = DatasetEnv(path=str(p)).load("train")
    assert [(t.prompt, t.answer) for t in tasks] == [("3+4?", "7"), ("4+5?", "9")]
    assert set(tasks[0].metadata) == {"answer"}


def test_jsonl_and_json_with_a_bom_load(tmp_path):
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    assert [t.answer for t in DatasetEnv(path=str(_jsonl(tmp_path / "b.jsonl", rows, bom=True))).load()] == ["1", "2"]
    j = tmp_path / "b.json"
    j.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows).encode())
    assert [t.prompt for t in DatasetEnv(path=str(j)).load()] == ["a", "b"]


def test_csv_field_over_128_kib_loads_and_the_limit_is_restored(tmp_path):
    long_prompt = "word " * 60_000  # 300 KB: over csv's default 131072-character field limit
    p = tmp_path / "long.csv"
    with open(p, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "answer"])
        w.writerow([long_prompt, "1"])
        w.writerow(["short", "2"])
    before = csv.field_size_limit()
    tasks = DatasetEnv(path=str(p)).load("train")
    assert tasks[0].prompt == long_prompt and tasks[1].answer == "2"
    assert csv.field_size_limit() == before  # process-wide state is not left changed


@pytest.mark.parametrize("answer", [float("nan"), float("inf"), float("-inf"), "nan", " NaN ", "inf", [1, float("nan")]])
def test_nan_and_inf_answers_are_refused_naming_the_row(tmp_path, answer):
    rows = [{"prompt": "ok", "answer": "1"}, {"prompt": "bad", "answer": answer}]
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")  # json.dumps writes NaN / Infinity, json.loads reads them
    with pytest.raises(DatasetError) as e:
        DatasetEnv(path=str(p)).load("train")
    msg = str(e.value)
    assert "\n" not in msg and f"{p}: row 2" in msg and "not a finite value" in msg


def test_parquet_nan_answer_is_refused(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "answer": [1.0, 2.0, float("nan")]}), p)
    with pytest.raises(DatasetError, match=r"row 3: the answer \('answer'\) is nan"):
        DatasetEnv(path=str(p)).load("train")


def test_finite_numbers_and_words_containing_inf_are_answers(tmp_path):
    rows = [{"prompt": "a", "answer": 1.5}, {"prompt": "b", "answer": "infinite"}, {"prompt": "c", "answer": "-0"}]
    assert [t.answer for t in DatasetEnv(path=str(_jsonl(tmp_path / "d.jsonl", rows))).load()] == [1.5, "infinite", "-0"]


def test_identical_test_set_warns(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(6)]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    test = _jsonl(tmp_path / "test.jsonl", rows)
    env = DatasetEnv(path=str(train), test_path=str(test))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        env.load("train")
        assert not got  # only once both splits are loaded
        env.load("test")
    assert len(got) == 1 and issubclass(got[0].category, DatasetOverlapWarning)
    assert "every held-out prompt is also a training prompt" in str(got[0].message)
    with warnings.catch_warnings(record=True) as again:  # once per environment, not per load
        warnings.simplefilter("always")
        env.load("test", n=2)
    assert not again


def test_partial_overlap_warning_names_the_count(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}"} for i in range(10)])
    test = _jsonl(tmp_path / "test.jsonl", [{"prompt": p} for p in ("q1", " q2 ", "new1", "new2", "new3")])
    env = DatasetEnv(path=str(train), test_path=str(test))
    with pytest.warns(DatasetOverlapWarning, match=r"2 of 5 held-out prompts also appear in the training data"):
        env.load("test")
        env.load("train")


def test_disjoint_test_set_and_test_size_split_do_not_warn(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"prompt": f"q{i}"} for i in range(10)])
    test = _jsonl(tmp_path / "test.jsonl", [{"prompt": f"t{i}"} for i in range(3)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for env in (DatasetEnv(path=str(train), test_path=str(test)), DatasetEnv(path=str(train), test_size=0.3)):
            env.load("train")
            env.load("test")


def test_not_utf8_and_ragged_csv_are_one_line_errors(tmp_path):
    latin = tmp_path / "latin.csv"
    latin.write_bytes("prompt,answer\ncaf\xe9,1\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin.csv: not UTF-8 text .* save the file as UTF-8"):
        DatasetEnv(path=str(latin)).load()
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("prompt,answer\na,1\nb,2,extra\n")
    with pytest.raises(DatasetError, match=r"ragged.csv: row 2: 3 fields, but the header names 2"):
        DatasetEnv(path=str(ragged)).load()
    gz = tmp_path / "trunc.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(DatasetError, match=r"trunc.jsonl.gz: line 1: cannot read"):
        DatasetEnv(path=str(gz)).load()


def _vault_rows(vaults):
    return [{"prompt": "open the vault", "vault": v, "answer": str(i)} for i, v in enumerate(vaults)]


def test_environment_rows_with_the_same_prompt_and_other_state_do_not_warn(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", _vault_rows(["a", "b", "c"]))
    test = _jsonl(tmp_path / "test.jsonl", _vault_rows(["x", "y"]))
    env = DatasetEnv(path=str(train), test_path=str(test))
    env.compare_whole_rows()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.load("train")
        env.load("test")
    # the prompt alone is shared: without a class that reads the rows, that is the overlap
    plain = DatasetEnv(path=str(train), test_path=str(test))
    with pytest.warns(DatasetOverlapWarning, match="every held-out prompt is also a training prompt"):
        plain.load("train")
        plain.load("test")


def test_environment_rows_that_are_identical_warn(tmp_path):
    rows = _vault_rows(["a", "b", "c"])
    train = _jsonl(tmp_path / "train.jsonl", rows)
    test = _jsonl(tmp_path / "test.jsonl", [rows[1], {"prompt": "open the vault", "vault": "z", "answer": "9"}])
    env = DatasetEnv(path=str(train), test_path=str(test))
    env.compare_whole_rows()
    with pytest.warns(DatasetOverlapWarning, match=r"1 of 2 held-out rows also appear in the training data"):
        env.load("train")
        env.load("test")


def test_an_environment_class_makes_the_check_compare_whole_rows(tmp_path):
    from rollwise.envs.build import make_env

    (tmp_path / "vault_env.py").write_text(
        "class Vault:\n"
        "    def reset(self, **row):\n        self.vault = row['vault']\n        return None\n"
        "    def peek(self) -> str:\n        \"\"\"The vault's name.\"\"\"\n        return self.vault\n"
        "def reward(completions, **kw):\n    return [0.0] * len(completions)\n")
    train = _jsonl(tmp_path / "train.jsonl", _vault_rows(["a", "b"]))
    test = _jsonl(tmp_path / "test.jsonl", _vault_rows(["x"]))
    env = make_env("dataset", {"path": str(train), "test_path": str(test)}, reward=f"{tmp_path}/vault_env.py:reward",
                   environment=f"{tmp_path}/vault_env.py:Vault")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.load("train")
        env.load("test")
