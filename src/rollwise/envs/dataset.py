"""Environment `dataset`: your own prompts from a file, scored by your own reward.

`path` is a JSONL file (`.jsonl`, optionally `.gz`), a JSON array (`.json`), Parquet (`.parquet`), CSV
(`.csv`), or a directory written by HF `datasets`' `save_to_disk` (a Dataset, or a DatasetDict whose
`train` / `test` splits are used). Each row becomes a `Task`:
- `prompt`: the `prompt_key` column, a string (it becomes the user message under a chat template) or a list
  of chat messages `[{"role", "content"}, ...]`;
- `answer`: the `answer_key` column (optional);
- `metadata`: every column except the prompt, so a reward sees them all by name (TRL passes dataset columns
  to reward functions the same way).
A bad row fails at load with one line naming the file and the row (1-based; the line number for JSONL),
and so does an answer that is NaN or infinite (`NaN` in JSON, a float NaN in Parquet, "nan" / "inf" text: a
missing value that would otherwise be scored as an answer). Text files may start with a UTF-8 byte-order mark
(Excel writes one; it is not part of the first column's name), and CSV fields may be of any size.

Held-out data: `test_path` (a file of the same kinds), else `test_size` (a fraction in (0, 1) or a row count)
split off the training file deterministically: rows are ordered by a hash of their prompt and the first
ones are held out, so the split does not depend on file order or seed, and rows with the same prompt
always land on the same side (the two sides never share a prompt). Without either, a DatasetDict's own
`test` split is used; otherwise `load("test")` fails saying how to get one. When both splits have been loaded
from separate sources (`test_path`, a DatasetDict) and they share prompts, a `DatasetOverlapWarning` says how
many: held-out accuracy on prompts the policy trained on measures memory, not generalisation. When an environment
class reads the whole row (`env.environment`, `compare_whole_rows`), whole rows are compared: the same prompt over
another state is another problem.

Scoring is not this environment's job: it has no reward of its own (`score` raises, naming `env.reward`);
`envs.build.make_env` puts the configured reward on it.

Through the Python API (`rollwise.train(train_dataset=..., eval_dataset=...)`) `path` and `test_path` may be rows
in memory (`rollwise.in_memory.InMemoryDataset`: a list of dicts or a `datasets.Dataset`, read once): each row
gets the same checks and one-line messages as a file's, named by what was passed (`train_dataset: row 3: ...`);
their task ids are `dataset/train/in-memory:ROW`.

Deliberately left out: streaming very large files (rows are read into memory once), and remote URLs.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import math
import random
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollwise.in_memory import InMemoryDataset
from rollwise.types import Score, Task

FORMATS = ".jsonl, .jsonl.gz, .json, .parquet, .csv, or a `datasets` save_to_disk directory"


class DatasetError(ValueError):
    """A dataset file or row that cannot be used; the message names the file and the row."""


class DatasetOverlapWarning(UserWarning):
    """The held-out split shares prompts with the training split."""


TEXT_ENCODING = "utf-8-sig"
"""UTF-8, with a leading byte-order mark dropped (else a CSV's first column is named '\ufeffprompt' and a JSONL
file's first line is not JSON)."""

_NON_FINITE_TEXT = frozenset({"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


def non_finite(value: Any) -> bool:
    """Whether `value` is, or holds, a NaN or an infinity: a float, or text Python's float() reads as one."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, str):
        return value.strip().lower() in _NON_FINITE_TEXT
    if isinstance(value, (list, tuple)):
        return any(non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(non_finite(v) for v in value.values())
    return False


@contextmanager
def _unbounded_csv_fields():
    """csv's 128 KiB per-field limit lifted while one file is read (a long prompt or document is a valid
    field; the file is read into memory whole anyway), and restored after. sys.maxsize overflows the C long
    the limit is kept in on some platforms, hence the halving."""
    old = csv.field_size_limit()
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            break
        except OverflowError:
            limit //= 2
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _not_utf8(p: Path, e: UnicodeDecodeError) -> DatasetError:
    return DatasetError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8")


def _kind(p: Path) -> str:
    name = p.name.lower()
    if p.is_dir():
        if (p / "dataset_dict.json").is_file() or (p / "dataset_info.json").is_file() or (p / "state.json").is_file():
            return "hf"
        raise DatasetError(f"{p} is a directory but not a `datasets` save_to_disk directory (no dataset_info.json)")
    for suffix, kind in ((".jsonl.gz", "jsonl"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "json"),
                         (".parquet", "parquet"), (".csv", "csv")):
        if name.endswith(suffix):
            return kind
    raise DatasetError(f"{p}: unknown dataset format; expected {FORMATS}")


def _read_jsonl(p: Path) -> list[tuple[int, Any]]:
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    rows = []
    lineno = 0
    try:
        with opener(p, "rt", encoding=TEXT_ENCODING) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((lineno, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{p}: line {lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise _not_utf8(p, e) from None
    except (OSError, EOFError) as e:  # a truncated or non-gzip .gz
        raise DatasetError(f"{p}: line {lineno + 1}: cannot read ({type(e).__name__}: {e})") from None
    return rows


def _read_csv(p: Path) -> list[tuple[int, Any]]:
    rows = []
    try:
        with _unbounded_csv_fields(), open(p, newline="", encoding=TEXT_ENCODING) as fh:
            reader = csv.DictReader(fh)
            for rowno, rec in enumerate(reader, 1):
                if None in rec:  # DictReader's restkey: more fields than the header names
                    raise DatasetError(f"{p}: row {rowno}: {len(reader.fieldnames or []) + len(rec[None])} fields, "
                                       f"but the header names {len(reader.fieldnames or [])}")
                rows.append((rowno, rec))
    except UnicodeDecodeError as e:
        raise _not_utf8(p, e) from None
    except csv.Error as e:
        raise DatasetError(f"{p}: row {len(rows) + 1}: not valid CSV ({e})") from None
    return rows


def _read_rows(p: Path, split: str, plain_ok: bool = True) -> list[tuple[int, Any]]:
    """(row number, record) pairs; row numbers are 1-based (JSONL: the line number). For a `datasets`
    directory: split `split` of a DatasetDict, or a plain Dataset when `plain_ok`."""
    kind = _kind(p)
    if kind == "jsonl":
        return _read_jsonl(p)
    if kind == "json":
        try:
            data = json.loads(p.read_text(encoding=TEXT_ENCODING))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
        except UnicodeDecodeError as e:
            raise _not_utf8(p, e) from None
        if not isinstance(data, list):
            raise DatasetError(f"{p}: a .json dataset must be an array of records (use .jsonl for one record per line)")
        return list(enumerate(data, 1))
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(p)
        except Exception as e:  # noqa: BLE001 - one line naming the file
            raise DatasetError(f"{p}: cannot read as Parquet ({type(e).__name__}: {e})") from None
        return list(enumerate(table.to_pylist(), 1))
    if kind == "csv":
        return _read_csv(p)
    try:
        import datasets
    except ImportError:
        raise DatasetError(f"{p} is a `datasets` directory; reading it needs: pip install datasets") from None
    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DatasetError(f"{p}: the DatasetDict has splits {sorted(ds)}, not {split!r}")
        ds = ds[split]
    elif not plain_ok:
        raise DatasetError(f"{p}: a single Dataset, not a DatasetDict with a {split!r} split")
    return list(enumerate(ds.to_list(), 1))


def _prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False) if not isinstance(prompt, str) else prompt


def _strip(prompt: Any) -> Any:
    return prompt.strip() if isinstance(prompt, str) else prompt


def _rank(prompt: Any) -> bytes:
    return hashlib.sha256(("dataset-split/" + _prompt_key(prompt)).encode()).digest()


@dataclass
class DatasetEnv:
    """Tasks from a JSONL / Parquet / CSV file or a `datasets` directory (see the module docstring)."""

    path: str | InMemoryDataset = ""
    """The training data (also the source of the held-out split when `test_size` is set); rows in memory through
    the Python API."""
    test_path: str | InMemoryDataset | None = None
    """Held-out data in a separate file (or rows in memory)."""
    test_size: float | int | None = None
    """Held-out part of `path`: a fraction in (0, 1) or a number of rows (deterministic, see module docstring)."""
    prompt_key: str = "prompt"
    """Column holding the prompt: text, or a list of chat messages."""
    answer_key: str | None = "answer"
    """Column holding the reference answer (Task.answer); None = no answer column. A missing 'answer' column is
    fine when this is left at its default; a key you set must exist in every row."""
    name: str = "dataset"
    _cache: dict[str, list[Task]] = field(default_factory=dict, init=False, repr=False)
    _overlap_checked: bool = field(default=False, init=False, repr=False)
    _overlap_by_row: bool = field(default=False, init=False, repr=False)

    def compare_whole_rows(self) -> None:
        """The environment reads more of a row than its prompt (an `env.environment` class gets `reset(**row)`):
        the held-out overlap check compares whole rows, so a held-out row with a training row's prompt but other
        data (another vault, another state) is a different problem and does not warn."""
        self._overlap_by_row = True

    def __post_init__(self) -> None:
        if not isinstance(self.path, InMemoryDataset) and (not isinstance(self.path, str) or not self.path):
            raise DatasetError("dataset env needs `path` (env.kwargs.path): a .jsonl/.parquet/.csv file or a `datasets` directory")
        for label, value in (("path", self.path), ("test_path", self.test_path)):
            if isinstance(value, str):
                p = Path(value)
                if not p.exists():
                    raise DatasetError(f"dataset {label} {value!r} does not exist")
                _kind(p)
        if self.test_path is not None and self.test_size is not None:
            raise DatasetError("dataset env: set test_path or test_size, not both")
        ts = self.test_size
        if ts is not None:
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts <= 0 or (isinstance(ts, float) and ts >= 1):
                raise DatasetError(f"dataset test_size must be a fraction in (0, 1) or a positive row count, got {ts!r}")
        if not isinstance(self.prompt_key, str) or not self.prompt_key:
            raise DatasetError("dataset prompt_key must be a column name")
        self._answer_required = self.answer_key is not None and self.answer_key != "answer"

    # ------------------------------------------------------------------ reading
    def _task(self, src: Path | InMemoryDataset, rowno: int, rec: Any, role: str) -> Task:
        where = f"{src}: row {rowno}"
        source = "in-memory" if isinstance(src, InMemoryDataset) else src.name
        if not isinstance(rec, dict):
            raise DatasetError(f"{where}: expected an object with named columns, got {type(rec).__name__}")
        if self.prompt_key not in rec:
            raise DatasetError(f"{where}: no {self.prompt_key!r} column (columns: {', '.join(map(str, rec))[:120]}); "
                               "set env.kwargs.prompt_key")
        prompt = rec[self.prompt_key]
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DatasetError(f"{where}: the prompt is empty")
        elif isinstance(prompt, list):
            if not prompt:
                raise DatasetError(f"{where}: the prompt message list is empty")
            for i, m in enumerate(prompt):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise DatasetError(f"{where}: prompt message {i} must be an object with string 'role' and 'content'")
            if prompt[-1]["role"] == "assistant":
                raise DatasetError(f"{where}: the prompt's last message is the assistant's; a prompt ends before the "
                                   "reply the policy is to write (drop the answer from the prompt column)")
            prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
        else:
            raise DatasetError(f"{where}: the prompt must be text or a list of chat messages, got {type(prompt).__name__}")
        answer = None
        if self.answer_key is not None:
            if self.answer_key in rec:
                answer = rec[self.answer_key]
            elif self._answer_required:
                raise DatasetError(f"{where}: no {self.answer_key!r} column (the answer_key)")
            if non_finite(answer):
                raise DatasetError(f"{where}: the answer ({self.answer_key!r}) is {answer!r}, not a finite value (a "
                                   "missing value written as NaN?); fill it in or drop the row")
        metadata = {k: v for k, v in rec.items() if k != self.prompt_key}
        return Task(id=f"{self.name}/{role}/{source}:{rowno}", prompt=prompt, answer=answer, metadata=metadata)

    def _read(self, path: str | InMemoryDataset, role: str, dict_split: str | None = None,
              plain_ok: bool = True) -> list[Task]:
        """Tasks of one file (or rows in memory); `role` ('train' / 'test') names the file in task ids."""
        if isinstance(path, InMemoryDataset):
            return [self._task(path, rowno, rec, role) for rowno, rec in enumerate(path.rows, 1)]
        src = Path(path)
        rows = _read_rows(src, dict_split or role, plain_ok)
        return [self._task(src, rowno, rec, role) for rowno, rec in rows]

    def _held_out(self, tasks: list[Task], ts: float | int) -> set[int]:
        """Indices of the held-out rows (`ts`: the `test_size` set): the lowest prompt hashes, whole prompt groups
        at a time."""
        want = int(round(ts * len(tasks))) if isinstance(ts, float) else int(ts)
        if not 0 < want < len(tasks):
            raise DatasetError(f"dataset test_size={ts!r} leaves {len(tasks) - want} training and {want} held-out rows "
                               f"of {len(tasks)}; both must be at least one")
        ranks = [_rank(t.prompt) for t in tasks]
        order = sorted(range(len(tasks)), key=lambda i: (ranks[i], i))
        cut = ranks[order[want - 1]]
        return {i for i in order if ranks[i] <= cut}

    def tasks(self, split: str) -> list[Task]:
        """All tasks of `split`, in file order (read once, then cached)."""
        if split not in ("train", "test"):
            raise DatasetError(f"dataset env has splits 'train' and 'test', got {split!r}")
        if split in self._cache:
            return self._cache[split]
        if self.test_path is not None:
            out = self._read(self.path, "train") if split == "train" else self._read(self.test_path, "test")
        elif self.test_size is not None:
            everything = self._read(self.path, "train")
            held = self._held_out(everything, self.test_size)
            out = [t for i, t in enumerate(everything) if (i in held) == (split == "test")]
        elif isinstance(self.path, str) and _kind(Path(self.path)) == "hf" and split == "test":
            try:
                out = self._read(self.path, "test", plain_ok=False)
            except DatasetError:
                raise DatasetError(f"dataset {self.path} has no held-out split: set env.kwargs.test_path or "
                                   "env.kwargs.test_size (e.g. 0.1)") from None
        elif split == "test":
            if isinstance(self.path, InMemoryDataset):
                raise DatasetError(f"{self.path} has no held-out split: pass eval_dataset= (env.kwargs.test_path) or "
                                   "set env.kwargs.test_size (e.g. 0.1)")
            raise DatasetError(f"dataset {self.path} has no held-out split: set env.kwargs.test_path or "
                               "env.kwargs.test_size (e.g. 0.1)")
        else:
            out = self._read(self.path, "train")
        if not out:
            raise DatasetError(f"dataset split {split!r} of {self.test_path if split == 'test' and self.test_path else self.path} is empty")
        self._cache[split] = out
        self._warn_overlap()
        return out

    def _warn_overlap(self) -> None:
        """Once both splits are loaded from separate sources: a DatasetOverlapWarning naming how many held-out
        prompts also appear in training (a `test_size` split never shares a prompt, so it is not checked)."""
        if self._overlap_checked or "train" not in self._cache or "test" not in self._cache or self.test_size is not None:
            return
        self._overlap_checked = True
        key = self._row_key if self._overlap_by_row else (lambda t: _prompt_key(_strip(t.prompt)))
        train = {key(t) for t in self._cache["train"]}
        test = self._cache["test"]
        shared = sum(key(t) in train for t in test)
        if not shared:
            return
        src = self.test_path or f"the 'test' split of {self.path}"
        unit = "row" if self._overlap_by_row else "prompt"
        what = (f"every held-out {unit} is also a training {unit} (is the test set the training set?)"
                if shared == len(test) else f"{shared} of {len(test)} held-out {unit}s also appear in the training data")
        warnings.warn(f"dataset {src}: {what}; held-out accuracy on them measures memory, not generalisation",
                      DatasetOverlapWarning, stacklevel=4)

    @staticmethod
    def _row_key(task: Task) -> str:
        """The whole row an environment class reads (`reset(**row)`: the prompt and every other column)."""
        return json.dumps({**task.metadata, "prompt": _strip(task.prompt)}, sort_keys=True, ensure_ascii=False,
                          default=str)

    def load(self, split: str = "train", n: int | None = None, seed: int = 0) -> list[Task]:
        """All of `split` in file order, or `n` of them in a seed-determined order."""
        tasks = self.tasks(split)
        if n is not None:
            tasks = random.Random(seed).sample(tasks, min(n, len(tasks)))
        return list(tasks)

    def score(self, task: Task, completion: str) -> Score:
        raise ValueError("the dataset environment has no reward of its own: set env.reward (\"file.py:fn\" or "
                         "\"module:fn\") or env.rewards")
