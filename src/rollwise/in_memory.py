"""Python objects where the run config takes a string: what `rollwise.train()` passes through the config.

Through the Python API a config key that names code or data by a string (`env.reward: "file.py:fn"`,
`env.rewards[i].fn`, `env.environment: "file.py:Class"`, `env.kwargs.path` / `env.kwargs.test_path` of the
`dataset` environment, any other `env.kwargs` value) may hold the object itself: a function, a class, a list of
row dicts or a `datasets.Dataset`. The config keeps it wrapped:

- `InMemory(obj, placeholder)`: a callable or any other object; `placeholder` is `<in-memory: module.qualname>`.
- `InMemoryDataset`: rows (a list of dicts, read once from what was passed); `placeholder` is
  `<in-memory dataset: N rows, sha256 HEX16>` (the hash of the rows as canonical JSON).

Everywhere the config is written or compared (`model_dump(mode="json")`: RUN_DIR/config.yaml, checkpoints, the
resume check, `config_hash`) the wrapper is its placeholder: the YAML stays valid, a resume with a same-named
function passes, a resume with different rows (another hash) is refused. A placeholder read back from YAML is
refused at load (`config.load_config`): the object it stood for is not in the file.

Deliberately light: no torch, no pydantic model; `config.py` (layer 1) and `envs` use it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

PLACEHOLDER_PREFIX = "<in-memory"


class InMemory:
    """A Python object in the run config, shown (and compared on resume) as its `placeholder`."""

    __slots__ = ("obj", "placeholder", "label")

    def __init__(self, obj: Any, placeholder: str, label: str = "") -> None:
        self.obj = obj
        self.placeholder = placeholder
        self.label = label or placeholder
        """How messages name it (e.g. 'train_dataset')."""

    def __repr__(self) -> str:
        return self.placeholder

    def __str__(self) -> str:
        return self.label

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InMemory) and other.placeholder == self.placeholder

    def __hash__(self) -> int:
        return hash(self.placeholder)

    def __copy__(self) -> InMemory:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> InMemory:
        return self  # the object is the user's: never copied (a config copy shares it)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.is_instance_schema(cls, serialization=core_schema.plain_serializer_function_ser_schema(
            lambda v: v.placeholder, when_used="json"))


class InMemoryDataset(InMemory):
    """Rows passed as a Python object (`as_dataset`); `obj` is the list of row dicts."""

    __slots__ = ()

    @property
    def rows(self) -> list[Any]:
        rows: list[Any] = self.obj
        return rows


def qualified_name(obj: Any) -> str:
    """`module.qualname` of a function or class; of an instance, its class's (with ' instance')."""
    target = obj if (isinstance(obj, type) or hasattr(obj, "__qualname__")) else type(obj)
    name = f"{getattr(target, '__module__', None) or '?'}.{getattr(target, '__qualname__', type(target).__name__)}"
    return name if target is obj else f"{name} instance"


def wrap_object(obj: Any, label: str = "") -> InMemory:
    """`obj` (already wrapped: as it is) as an `InMemory` named by its qualified name."""
    if isinstance(obj, InMemory):
        return obj
    return InMemory(obj, f"{PLACEHOLDER_PREFIX}: {qualified_name(obj)}>", label)


def _rows_of(data: Any, label: str) -> list[Any]:
    if isinstance(data, Mapping) or isinstance(data, (str, bytes)):
        kind = "a DatasetDict" if type(data).__name__ == "DatasetDict" else f"a {type(data).__name__}"
        hint = (" (pass its splits: train_dataset=ds['train'], eval_dataset=ds['test'])"
                if kind == "a DatasetDict" else "")
        raise ValueError(f"{label}: expected a list of row dicts or a datasets.Dataset, got {kind}{hint}")
    if callable(getattr(data, "to_list", None)):  # datasets.Dataset
        return list(data.to_list())
    if callable(getattr(data, "to_dict", None)) and hasattr(data, "columns"):  # pandas.DataFrame
        return list(data.to_dict(orient="records"))
    if isinstance(data, Sequence):
        return list(data)
    raise ValueError(f"{label}: expected a list of row dicts or a datasets.Dataset, got {type(data).__name__}")


def as_dataset(data: Any, label: str = "dataset") -> InMemoryDataset:
    """Rows from a list of dicts, a `datasets.Dataset` or a pandas DataFrame, read once; the rows themselves are
    checked when the `dataset` environment loads them (the same checks and messages as a file's)."""
    if isinstance(data, InMemoryDataset):
        return data
    rows = _rows_of(data, label)
    if not rows:
        raise ValueError(f"{label}: the dataset has no rows")
    blob = json.dumps(rows, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return InMemoryDataset(rows, f"{PLACEHOLDER_PREFIX} dataset: {len(rows)} rows, sha256 {digest}>", label)


def is_placeholder(value: Any) -> bool:
    """Whether `value` is a placeholder string as config.yaml holds it."""
    return isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX) and value.endswith(">")


def plain(value: Any) -> bool:
    """Whether `value` is data YAML can hold (None, bool, numbers, text, lists and string-keyed dicts of them)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v) for k, v in value.items())
    return False


def to_placeholders(value: Any) -> Any:
    """`value` with every `InMemory` inside (dicts, lists) replaced by its placeholder."""
    if isinstance(value, InMemory):
        return value.placeholder
    if isinstance(value, dict):
        return {k: to_placeholders(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_placeholders(v) for v in value]
    return value


def unwrap(value: Any) -> Any:
    """The user's object of an `InMemory` (an `InMemoryDataset` stays wrapped: the dataset env reads it)."""
    return value.obj if isinstance(value, InMemory) and not isinstance(value, InMemoryDataset) else value


def placeholders_in(data: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, placeholder) for every placeholder string in config data (YAML as loaded)."""
    if is_placeholder(data):
        return [(prefix[:-1] or "<top>", data)]
    out: list[tuple[str, str]] = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(placeholders_in(v, f"{prefix}{k}."))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(placeholders_in(v, f"{prefix[:-1]}[{i}]."))
    return out


__all__ = ["InMemory", "InMemoryDataset", "PLACEHOLDER_PREFIX", "as_dataset", "is_placeholder", "placeholders_in",
           "plain", "qualified_name", "to_placeholders", "unwrap", "wrap_object"]
