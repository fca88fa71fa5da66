"""Every config key's documentation, from the config's own field docstrings: a commented YAML dump and `explain`.

The descriptions are the attribute docstrings under each field in `rollwise.config` (pydantic reads them into
`FieldInfo.description` through `use_attribute_docstrings`, from the module's source, which the package ships),
so the text `rollwise train --print-config --doc` and `rollwise config explain KEY` print is the text a reader
of config.py sees, and cannot drift from it.

Deliberately plain: the dump is the resolved config's YAML with each key's description as comments above it
(it loads back as the same config); `explain` prints a key's type, default and description. No rendering of
markdown, no per-key examples beyond what the docstrings say.
"""

from __future__ import annotations

import math
import textwrap
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rollwise.config import RunConfig, _unwrap_model, field_of

__all__ = ["dump_config_doc", "explain", "type_text"]

WIDTH = 116
"""Longest comment line of the commented dump."""


def _scalar_yaml(value: Any) -> str:
    """`value` as one line of YAML (flow style for lists and mappings)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _comment(text: str, indent: str) -> list[str]:
    out: list[str] = []
    for para in text.strip().split("\n\n"):
        body = " ".join(line.strip() for line in para.splitlines())
        out.extend(textwrap.wrap(body, WIDTH - len(indent) - 2, break_on_hyphens=False) or [""])
    return [f"{indent}# {line}".rstrip() for line in out]


def _default_json(field: FieldInfo) -> Any:
    value = field.get_default(call_default_factory=True)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _section_lines(model: type[BaseModel], data: dict[str, Any], depth: int) -> list[str]:
    indent = "  " * depth
    lines: list[str] = []
    for name, field in model.model_fields.items():
        if name not in data:
            continue
        value = data[name]
        sub = _unwrap_model(field.annotation)
        desc = field.description or ""
        if sub is not None and isinstance(value, dict):
            if depth == 0 and sub.__doc__:  # a top-level section: its own docstring's first paragraph
                desc = sub.__doc__.strip().split("\n\n")[0]
            if lines and depth == 0:
                lines.append("")
            lines.extend(_comment(desc, indent) if desc else [])
            if value:
                lines.append(f"{indent}{name}:")
                lines.extend(_section_lines(sub, value, depth + 1))
            else:
                lines.append(f"{indent}{name}: {{}}")
            continue
        default = _default_json(field)
        if value != default:
            desc = f"{desc} (default: {_scalar_yaml(default)})" if desc else f"default: {_scalar_yaml(default)}"
        lines.extend(_comment(desc, indent) if desc else [])
        lines.append(f"{indent}{name}: {_scalar_yaml(value)}")
    return lines


def dump_config_doc(cfg: RunConfig) -> str:
    """The config as YAML with every key's description (and its default, where the value differs) as comments
    above it; `load_config` reads it back as the same config."""
    head = ["# rollwise run config: every key, its description above it (rollwise config explain KEY for one).", ""]
    return "\n".join(head + _section_lines(RunConfig, cfg.model_dump(mode="json"), 0)) + "\n"


# ------------------------------------------------------------------------------------------------- explain

_BOUNDS = ((annotated_types.Ge, ">="), (annotated_types.Gt, ">"), (annotated_types.Le, "<="), (annotated_types.Lt, "<"))


def _ann_text(ann: Any) -> str:
    origin = get_origin(ann)
    if origin is Literal:
        return " | ".join(repr(a) if isinstance(a, str) else str(a).lower() if isinstance(a, bool) else str(a)
                          for a in get_args(ann))
    if origin in (Union, types.UnionType):
        return " | ".join(_ann_text(a) for a in get_args(ann))
    if ann is type(None):
        return "null"
    if ann is typing.Any:
        return "any"
    if origin is not None:
        args = ", ".join(_ann_text(a) for a in get_args(ann))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return getattr(ann, "__name__", str(ann).replace("typing.", ""))


def type_text(field: FieldInfo) -> str:
    """A field's type as a reader writes it: 'float, > 0', "'local' | 'remote' | 'ray'", 'int | null, >= 1'."""
    bounds = [f"{sign} {getattr(m, attr)}" for m in field.metadata for cls, sign in _BOUNDS
              if isinstance(m, cls) for attr in ("ge", "gt", "le", "lt") if hasattr(m, attr)]
    return ", ".join([_ann_text(field.annotation), *bounds])


def explain(key: str) -> str:
    """Key, type, default and description of one config key (several lines); a section lists its keys. Raises
    ConfigError for an unknown key, naming the closest valid one (TRL's names included)."""
    model, shown = field_of(key)
    field = model.model_fields[shown.rsplit(".", 1)[-1]]
    lines = [shown]
    if shown != key:
        lines[0] += f"  ({key} is a key inside this free-form mapping)"
    sub = _unwrap_model(field.annotation)
    lines.append(f"  type:    {type_text(field)}")
    if sub is None:
        lines.append(f"  default: {_scalar_yaml(_default_json(field))}")
    desc = field.description or (sub.__doc__ if sub is not None else "") or ""
    lines.append("")
    lines.extend(textwrap.wrap(" ".join(desc.split()), WIDTH, initial_indent="  ", subsequent_indent="  "))
    if sub is not None:
        lines.append("")
        lines.append("  keys:")
        for child, f in sub.model_fields.items():
            head = f"    {shown}.{child}: "
            lines.append((head + textwrap.shorten(f.description or "", WIDTH - len(head), placeholder=" ...")).rstrip())
    return "\n".join(lines) + "\n"
