"""Environment `dataset`: every file kind, prompt columns, held-out splits, bad rows; GSM8K's held-out split."""

from __future__ import annotations

import csv
import json

import pytest

from rollwise.envs import get_env
from rollwise.envs.dataset import DatasetEnv, DatasetError

ROWS = [{"question": f"What is {a} + {b}?", "answer": str(a + b), "level": a % 3} for a in range(10) for b in range(4)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_rows_become_tasks_with_every_other_column(tmp_path):
    f = write_jsonl(tmp_path / "train.jsonl", ROWS)
    env = get_env("dataset", path=str(f), prompt_key="question", test_size=0.25)
    train = env.load("train")
    t = next(t for t in train if t.prompt == "What is 3 + 2?")
    assert t.answer == "5" and t.metadata == {"answer": "5", "level": 0}
    assert t.id.startswith("dataset/train/train.jsonl:")


@pytest.mark.parametrize("kind", ["parquet", "csv", "json", "hf", "hf_dict"])
def test_other_formats_read_the_same_tasks(tmp_path, kind):
    rows = ROWS[:12]
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        f = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(rows), f)
    elif kind == "csv":
        f = tmp_path / "d.csv"
        with open(f, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    elif kind == "json":
        f = tmp_path / "d.json"
        f.write_text(json.dumps(rows))
    else:
        import datasets

        f = tmp_path / "ds"
        ds = datasets.Dataset.from_list(rows)
        if kind == "hf_dict":
            ds = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(ROWS[20:23])})
        ds.save_to_disk(str(f))
    kw = {} if kind == "hf_dict" else {"test_size": 3}
    env = DatasetEnv(path=str(f), prompt_key="question", **kw)
    train, test = env.load("train"), env.load("test")
    assert len(train) + len(test) == (15 if kind == "hf_dict" else 12) and len(test) == 3
    assert {t.prompt for t in train}.isdisjoint({t.prompt for t in test})
    want_level = "0" if kind == "csv" else 0  # CSV has no types: every value is text
    assert next(t for t in train + test if t.prompt == "What is 0 + 1?").metadata["level"] == want_level


def test_messages_prompt_column(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": f"{i}+1?"}],
             "answer": i + 1} for i in range(5)]
    f = write_jsonl(tmp_path / "chat.jsonl", rows)
    env = DatasetEnv(path=str(f), prompt_key="messages", test_path=str(f))
    t = env.load("train")[2]
    assert t.prompt == rows[2]["messages"] and t.answer == 3 and "messages" not in t.metadata


def test_test_size_split_is_deterministic_disjoint_and_order_free(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", ROWS)
    b = write_jsonl(tmp_path / "b.jsonl", list(reversed(ROWS)) + [ROWS[0]])  # reordered, one duplicate prompt
    ea = DatasetEnv(path=str(a), prompt_key="question", test_size=0.2)
    eb = DatasetEnv(path=str(b), prompt_key="question", test_size=0.2)
    test_a = {t.prompt for t in ea.load("test")}
    assert len(test_a) == 8 and test_a.isdisjoint(t.prompt for t in ea.load("train"))
    test_b = [t.prompt for t in eb.load("test")]
    assert test_a <= set(test_b)  # the same rows are held out whatever the order
    assert set(test_b).isdisjoint(t.prompt for t in eb.load("train"))  # duplicates stay on one side
    sample = ea.load("train", n=5, seed=3)
    assert sample == ea.load("train", n=5, seed=3) and len(sample) == 5


def test_no_held_out_split_says_how_to_get_one(tmp_path):
    env = DatasetEnv(path=str(write_jsonl(tmp_path / "t.jsonl", ROWS)), prompt_key="question")
    assert len(env.load("train")) == len(ROWS)
    with pytest.raises(DatasetError, match="set env.kwargs.test_path or env.kwargs.test_size"):
        env.load("test")


@pytest.mark.parametrize("content,kw,match", [
    ('{"question": "a", "answer": "1"}\n{"question": "b"\n', {}, r"bad\.jsonl: line 2: not valid JSON"),
    ('{"question": "a"}\n\n{"q": "b"}\n', {}, r"bad\.jsonl: row 3: no 'question' column"),
    ('{"question": ""}\n', {}, r"row 1: the prompt is empty"),
    ('{"question": 7}\n', {}, r"row 1: the prompt must be text or a list of chat messages, got int"),
    ('{"question": [{"role": "user"}]}\n', {}, r"row 1: prompt message 0 must be an object"),
    ('{"question": [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]}\n', {},
     r"row 1: the prompt's last message is the assistant's"),
    ('{"question": "a", "gold": 1}\n{"question": "b"}\n', {"answer_key": "gold"}, r"row 2: no 'gold' column"),
    ('[1, 2]\n', {}, r"row 1: expected an object"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, content, kw, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(DatasetError, match=match) as e:
        DatasetEnv(path=str(f), prompt_key="question", **kw).load("train")
    assert "\n" not in str(e.value)


def test_bad_arguments(tmp_path):
    f = write_jsonl(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(DatasetError, match="needs `path`"):
        get_env("dataset")
    with pytest.raises(DatasetError, match="does not exist"):
        DatasetEnv(path=str(tmp_path / "none.jsonl"))
    with pytest.raises(DatasetError, match="unknown dataset format"):
        DatasetEnv(path=str(tmp_path / "t.txt")) if (tmp_path / "t.txt").write_text("x") else None
    with pytest.raises(DatasetError, match="not both"):
        DatasetEnv(path=str(f), test_path=str(f), test_size=0.1)
    for bad in (0, 1.0, -3, True, "0.1"):
        with pytest.raises(DatasetError, match="test_size must be"):
            DatasetEnv(path=str(f), test_size=bad)
    with pytest.raises(DatasetError, match="leaves 0 training"):
        DatasetEnv(path=str(f), prompt_key="question", test_size=len(ROWS)).load("test")
    with pytest.raises(ValueError, match="no reward of its own: set env.reward"):
        DatasetEnv(path=str(f), prompt_key="question").score(None, "x")


# ------------------------------------------------------------------ built-in envs never evaluate on train rows
def test_gsm8k_single_file_holds_out_rows_it_does_not_train_on(tmp_path):
    rows = [{"question": f"Tom has {i} apples and buys {i + 1} more. How many?", "answer": f"so #### {2 * i + 1}"}
            for i in range(200)]
    f = write_jsonl(tmp_path / "mine.jsonl", rows)
    env = get_env("gsm8k", path=str(f))
    train, test = env.load("train"), env.load("test")
    assert train and test and len(train) + len(test) == 200
    q = lambda ts: {t.metadata["question"] for t in ts}  # noqa: E731
    assert q(train).isdisjoint(q(test))
    # An explicit held-out file is used as given.
    held = write_jsonl(tmp_path / "held.jsonl", rows[:7])
    env2 = get_env("gsm8k", path=str(f), test_path=str(held))
    assert len(env2.load("test")) == 7 and len(env2.load("train")) == 200


def test_gsm8k_data_root_keeps_its_own_splits(shared_data):
    env = get_env("gsm8k", path=str(shared_data))
    train, test = env.load("train", n=300), env.load("test")
    assert len(test) == 1319
    assert {t.metadata["question"] for t in train}.isdisjoint(t.metadata["question"] for t in test)


@pytest.mark.parametrize("name,kw", [("arithmetic", {}), ("countdown", {}), ("tool_calc", {})])
def test_generated_builtin_envs_have_disjoint_splits(name, kw):
    env = get_env(name, **kw)
    train, test = env.load("train", n=300), env.load("test", n=100)
    assert {t.prompt for t in train}.isdisjoint(t.prompt for t in test)
