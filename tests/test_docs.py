"""The guide cannot drift from the code: every config key, CLI flag and import path README.md and docs/*.md write
resolves.

What is checked, in inline code spans and fenced code blocks (prose is left alone):

- **config keys**: a dotted name whose first part is a section of `RunConfig` (`train.lr`, `engine.vllm.launch`,
  `--set rollout.max_tokens=32`) must be a key of the config model; below a dict-valued field (`env.kwargs.path`)
  anything goes. A name that is not a key but is a rollwise module or attribute (`run.loop`, `train.metrics`,
  `control.POLICIES`) is a code reference and passes. File names (`train.py`, `config.yaml`) are not keys.
- **YAML blocks** (```yaml) whose top level names a config section: every top-level key must be a section and every
  nested key a config key (the user's config as the reader would copy it).
- **CLI flags**: every `--flag` written after `rollwise CMD` (on the same line of a code block or in the same code
  span; `rollwise rollouts export ...` reads the sub-command's parser) must be an option of that parser, built
  from `rollwise.cli.main.build_parser`. An unknown command followed by flags fails too.
- **imports**: `import rollwise...`, `from rollwise.x import a, b` and every written `rollwise.x.y` path must
  import (module by module, then attribute by attribute).
- **files**: a repository path written in code (`bench/serve.py`, `run/loop.py` under src/rollwise) exists, and so
  does the target of every relative markdown link.

A test feeds the checker a small bad page, so a checker that stops catching typos fails as well.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Strings that look like a rollwise path but are data, not Python: the Parquet key-value metadata keys of a shard.
NOT_PYTHON = {"rollwise.schema_version", "rollwise.journal", "rollwise.journal_seal"}

FILE_SUFFIXES = {"py", "yaml", "yml", "json", "jsonl", "md", "html", "parquet", "csv", "txt", "toml", "gguf",
                 "safetensors", "log", "pt", "sh"}


# ---------------------------------------------------------------------------------------------------- the text


@dataclass(frozen=True)
class Snippet:
    """One piece of code in a page: an inline span or a fenced block, with its language ('' for a span)."""

    page: str
    line: int
    lang: str
    text: str


_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
_SPAN = re.compile(r"(`+)(.+?)\1")


def snippets(text: str, page: str = "<text>") -> Iterator[Snippet]:
    """Fenced blocks whole, then the inline code spans of every line outside them."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m:
            fence, lang, start = m.group(2), m.group(3).lower(), i
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            yield Snippet(page, start + 2, lang, "\n".join(body))
        else:
            for s in _SPAN.finditer(lines[i]):
                yield Snippet(page, i + 1, "", s.group(2).replace("\\|", "|"))
        i += 1


# ---------------------------------------------------------------------------------------------------- resolvers


def _config_model() -> type[BaseModel]:
    from rollwise.config import RunConfig

    return RunConfig


def _unwrap(tp: Any) -> Any:
    """The BaseModel or dict inside `tp` (or `tp | None`), else None."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    if tp is dict or get_origin(tp) is dict or tp is Any:
        return dict
    for arg in get_args(tp):
        found = _unwrap(arg)
        if found is not None:
            return found
    return None


def is_config_key(dotted: str) -> bool:
    """A key of the config model; below a dict-valued field every name is the user's."""
    node: Any = _config_model()
    for part in dotted.split("."):
        if node is dict:
            return True
        if not (isinstance(node, type) and issubclass(node, BaseModel)) or part not in node.model_fields:
            return False
        node = _unwrap(node.model_fields[part].annotation) or "leaf"
    return True


def resolves(path: str) -> bool:
    """`a.b.c` imports: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    obj: Any = None
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        break
    else:
        return False
    for attr in parts[n:]:
        if not hasattr(obj, attr):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{attr}")
                continue
            except (ImportError, AttributeError):
                return False
        obj = getattr(obj, attr)
    return True


def _all_keys() -> list[str]:
    from rollwise.config import valid_keys

    return list(valid_keys())


def sections() -> set[str]:
    return set(_config_model().model_fields)


# ---------------------------------------------------------------------------------------------------- the checks


def _key_pattern() -> re.Pattern[str]:
    names = "|".join(sorted(sections(), key=len, reverse=True))
    # not part of a longer name or path (`rollwise.train.x`, `cli/train.py`, `my_run.x`), not a call or a folder
    return re.compile(rf"(?<![\w./-])(?:{names})(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?![\w(/-]|\.\w)")


_PY_STRING = re.compile(r"(\"|')(.*?)(?<!\\)\1")
_QUOTED_AS_WRONG = re.compile(r"unknown config key '$")


def check_keys(snip: Snippet) -> list[str]:
    out = []
    text = snip.text
    if snip.lang in ("python", "py"):
        # in Python a key is a string (`**{"train.steps": 10}`); `env.results` is an attribute of a variable
        text = "\n".join(m.group(2) for m in _PY_STRING.finditer(text))
    for m in _key_pattern().finditer(text):
        dotted = m.group(0)
        if dotted.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue  # a file name: train.py, run.yaml
        if text[m.end():m.end() + 1] == "*":  # a family of keys: `run.ray_*`
            if any(k.startswith(dotted) for k in _all_keys()):
                continue
        elif _QUOTED_AS_WRONG.search(text[max(0, m.start() - 40):m.start()]):
            continue  # an error message quoting a wrong key on purpose
        if is_config_key(dotted) or resolves(f"rollwise.{dotted}"):
            continue
        out.append(f"{snip.page}:{snip.line}: unknown config key `{dotted}`")
    return out


def _yaml_keys(d: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(d, dict):
        for k, v in d.items():
            key = f"{prefix}{k}"
            yield key
            if not is_config_key(key) or _is_dict_field(key):
                continue  # below a dict-valued field, or already reported: do not descend
            yield from _yaml_keys(v, key + ".")


def _is_dict_field(dotted: str) -> bool:
    node: Any = _config_model()
    for part in dotted.split("."):
        if node is dict or not (isinstance(node, type) and issubclass(node, BaseModel)) or part not in node.model_fields:
            return node is dict
        node = _unwrap(node.model_fields[part].annotation)
    return node is dict


def check_yaml(snip: Snippet) -> list[str]:
    if snip.lang not in ("yaml", "yml"):
        return []
    try:
        data = yaml.safe_load(snip.text)
    except yaml.YAMLError:
        return []  # a fragment (a few lines of a file), not a whole document
    if not isinstance(data, dict) or not set(map(str, data)) & sections():
        return []
    return [f"{snip.page}:{snip.line}: unknown config key `{k}` in a YAML block"
            for k in _yaml_keys(data) if not is_config_key(str(k))]


def check_imports(snip: Snippet) -> list[str]:
    out = []
    text = snip.text
    for m in re.finditer(r"^\s*from\s+(rollwise[\w.]*)\s+import\s+\(?([^)\n#]+)", text, re.M):
        for name in (n.strip().split(" as ")[0] for n in m.group(2).split(",")):
            if name and name != "*" and not resolves(f"{m.group(1)}.{name}"):
                out.append(f"{snip.page}:{snip.line}: cannot import `{name}` from `{m.group(1)}`")
    for m in re.finditer(r"^\s*import\s+([\w., ]+)", text, re.M):
        for name in (n.strip().split(" as ")[0] for n in m.group(1).split(",")):
            if name.startswith("rollwise") and not resolves(name):
                out.append(f"{snip.page}:{snip.line}: cannot import `{name}`")
    for m in re.finditer(r"(?<![\w./-])rollwise(?:\.[A-Za-z_]\w*)+", text):
        path = m.group(0)
        if path in NOT_PYTHON or path.rsplit(".", 1)[1] in FILE_SUFFIXES:
            continue
        if not resolves(path):
            out.append(f"{snip.page}:{snip.line}: `{path}` does not resolve")
    return out


def _parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """(command,) and (command, action) -> parser, and () -> the top-level parser."""
    from rollwise.cli.main import build_parser

    top = build_parser()
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {(): top}

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                for name, sub in act.choices.items():
                    out[(*path, name)] = sub
                    walk(sub, (*path, name))

    walk(top, ())
    return out


_PARSERS: dict[tuple[str, ...], argparse.ArgumentParser] | None = None


def _options(path: tuple[str, ...]) -> set[str]:
    global _PARSERS
    if _PARSERS is None:
        _PARSERS = _parsers()
    return {o for a in _PARSERS[path]._actions for o in a.option_strings}


_INVOCATION = re.compile(r"(?:^|(?<=[\s/(`$]))rollwise((?:\s+[^\s|;&#]+)*)")
_FLAG = re.compile(r"^--?[A-Za-z][\w-]*")


def check_flags(snip: Snippet) -> list[str]:
    global _PARSERS
    if _PARSERS is None:
        _PARSERS = _parsers()
    out = []
    text = re.sub(r"\\\n\s*", " ", snip.text)  # shell line continuations
    for line in text.splitlines():
        line = re.sub(r"\s#.*$", "", line)  # a shell comment
        for m in _INVOCATION.finditer(line):
            words = m.group(1).split()
            path: tuple[str, ...] = ()
            i = 0
            while i < len(words) and words[i].startswith("-") and words[i] in _options(()):
                i += 1  # global options: rollwise --debug CMD
            if i >= len(words):
                continue
            cmd = words[i]
            if (cmd,) not in _PARSERS:
                if not re.fullmatch(r"[a-z]+", cmd):
                    continue  # a placeholder (CMD)
                if any(_FLAG.match(w) for w in words[i + 1:]):
                    out.append(f"{snip.page}:{snip.line}: unknown command `rollwise {cmd}`")
                continue
            path = (cmd,)
            if i + 1 < len(words) and (cmd, words[i + 1]) in _PARSERS:
                path = (cmd, words[i + 1])
            for w in words[i + 1:]:
                fm = _FLAG.match(w.strip("[]()`,"))
                if not fm:
                    continue
                flag = fm.group(0)
                if flag in _options(path) or flag in ("-h", "--help"):
                    continue
                out.append(f"{snip.page}:{snip.line}: `rollwise {' '.join(path)}` has no option `{flag}`")
    return out


_PATH = re.compile(r"(?<![\w./-])((?:src|tests|bench|recipes|docs|\.ci)/[\w./-]*\w|\w+(?:/[\w.-]+)+\.(?:py|md|yaml|svg))"
                   r"(?![\w*{<-])")
GENERATED = ("recipes/data", "RUN_DIR/", "runs/")
"""Paths the docs name that a command creates (the recipes' data, a run's folder), not files of the repository."""


def check_paths(snip: Snippet) -> list[str]:
    """A repository path written in code (`run/loop.py` is relative to src/rollwise) names a file that exists."""
    out = []
    for m in _PATH.finditer(snip.text):
        path = m.group(1).rstrip(".")
        if any(c in path for c in "*{<") or path.startswith(GENERATED):
            continue
        if not any((base / path).exists() for base in (REPO, REPO / "src", REPO / "src" / "rollwise", REPO / "docs")):
            out.append(f"{snip.page}:{snip.line}: `{path}` is not a file of the repository")
    return out


def check_links(text: str, page: Path) -> list[str]:
    """Relative markdown links point at files that exist."""
    return [f"{page.name}: link to `{t}`, which does not exist" for t in re.findall(r"\]\(([^)#\s]+)", text)
            if "://" not in t and not (page.parent / t).exists()]


def check_text(text: str, page: str = "<text>") -> list[str]:
    problems: list[str] = []
    for snip in snippets(text, page):
        problems += check_keys(snip) + check_yaml(snip) + check_imports(snip) + check_flags(snip) + check_paths(snip)
    return problems


# ---------------------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_names_only_what_exists(page: Path):
    text = page.read_text()
    problems = check_text(text, str(page.relative_to(REPO))) + check_links(text, page)
    assert not problems, "\n".join(problems)


BAD_PAGE = """\
Set `train.lr_rate` to go faster, or `engine.vllm.lanch: true`:

```yaml
train: {lr: 1.0e-5, stepz: 20}
```

```bash
rollwise train my.yaml --outdir runs/x
rollwise rollouts export runs/x --fromat csv
```

```python
from rollwise.trl import GRPOConfig, GRPOTrainerz
import rollwise.engine.lmm
```

and `rollwise.config.RunConfg` in prose, as told in `docs/FINDINGS.md` and `run/lop.py`.
"""


def test_checker_catches_misspellings():
    problems = "\n".join(check_text(BAD_PAGE))
    for expected in ("`train.lr_rate`", "`engine.vllm.lanch`", "`train.stepz`", "has no option `--outdir`",
                     "has no option `--fromat`", "`GRPOTrainerz`", "`rollwise.engine.lmm`",
                     "`rollwise.config.RunConfg`", "`docs/FINDINGS.md` is not", "`run/lop.py` is not"):
        assert expected in problems, f"{expected} not reported in:\n{problems}"


GOOD_PAGE = """\
`model.path: builtin:tiny`, `env.kwargs.path`, `config.yaml`, `summary.json`, `cli/train.py`, `run/loop.py`,
`run.loop.step_metrics`, `train.metrics`, `result.metrics()[-1]`, `rollwise.train(...)`, `train.lora.r`, `run/loop.py`, `bench/serve.py`, `recipes/data/x.jsonl`,
`rollwise rollouts counts RUN_DIR`, `rollwise --debug CMD`, `rollwise.schema_version`

```bash
rollwise train recipes/smollm2-addition.yaml --set engine.backend=remote \\
    --set engine.vllm.launch=true   # --not-a-flag in a comment
rollwise rollouts export RUN_DIR --format csv | head
```

```yaml
model: {path: smollm2-135m}
env: {name: dataset, kwargs: {path: a.jsonl, anything: 1}}
```
"""


def test_checker_passes_what_exists():
    assert check_text(GOOD_PAGE) == []


# ---------------------------------------------------------------------------------------------------- docs/outputs.md


def _outputs_section(title: str) -> str:
    text = (REPO / "docs" / "outputs.md").read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_outputs_page_lists_every_parquet_column_with_its_type():
    from rollwise.store.schema import ROLLOUT_SCHEMA

    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| (yes|no) \|", _outputs_section("The rollout store"), re.M)
    documented = [(name, typ.strip(), null == "yes") for name, typ, null in rows]
    actual = [(f.name, re.sub(r"\b(element|item): ", "", str(f.type)), f.nullable) for f in ROLLOUT_SCHEMA]
    assert documented == actual, "docs/outputs.md's column table differs from rollwise.store.schema.ROLLOUT_SCHEMA"


def test_outputs_page_lists_every_metrics_key():
    from rollwise.control.ledger import Accounting
    from rollwise.run.loop import EPISODE_KEYS, step_metrics
    from rollwise.train.metrics import PROGRESS_FIELDS, TRL_COMPUTED_METRICS, TRL_METRIC_ALIASES, flatten_metrics
    from rollwise.types import Rollout

    r = Rollout(prompt_id="p", group_id="g", sample_index=0, prompt_token_ids=[1], completion_token_ids=[2, 3],
                logprobs=[-0.1, -0.2], weight_versions=[0, 0], loss_mask=[1, 1], reward=1.0,
                reward_parts={"correct": 1.0}, env_info={k: 1 for k in EPISODE_KEYS})
    train_m = {k: 0.1 for k in ("train_s", "logprob_diff_mean", "logprob_diff_max", "tis_clip_frac", "kl", "entropy",
                                "grad_norm", "loss", "clip_frac", "lr", "masked_token_frac", "masked_seq_frac",
                                "distill_reverse_kl", "distill_teacher_logprob", "teacher_s")}
    train_m.update({f"critic/{k}": 0.1 for k in ("value_loss", "value_clip_frac", "explained_var", "value_mean",
                                                 "return_mean", "grad_norm", "lr", "warmup", "train_s")})
    rec = step_metrics([r, r], 1, 0, Accounting(generated_tokens=4, gen_s=1.0, tail_s=0.2), train_m, gen_wait_s=0.1,
                       producer_wait_s=0.1, sync_s=0.1, step_s=1.0, cpu_s=1.0, weight_version=1, staleness_bound=1,
                       engine_counters={"requeued": 0, "restarts": 0}, useful=2)
    written = set(flatten_metrics(rec)) | {"step", "wall_s", "sync_logprob_gap", "eval_accuracy",
                                           "eval_accuracy_greedy", "time_eval_s", "replay_used", "replay_size",
                                           "replay_age_mean", "replay_age_max", "control_spec_acceptance",
                                           "control_spec_tokens_per_forward", "control_spec_saved_s"}
    written |= set(TRL_METRIC_ALIASES) | set(TRL_METRIC_ALIASES.values()) | set(TRL_COMPUTED_METRICS)
    written |= {k for k, _ in PROGRESS_FIELDS}
    written = {re.sub(r"^rewards/correct/", "rewards/<name>/", k) for k in written}
    documented = set(re.findall(r"`([\w/<>]+)`", _outputs_section("`metrics.jsonl`")))
    missing = sorted(written - documented)
    assert not missing, f"metrics keys not documented in docs/outputs.md: {missing}"
