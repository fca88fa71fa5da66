"""`rollwise score --env NAME --input F.jsonl [--output F.jsonl] [--data PATH]`: score existing completions.

Record formats follow the datasets' own conventions:
- gsm8k: `question`, `answer` (worked solution ending `#### N`), `completion` -> adds `score`, `correct`, `extracted`.
- humaneval, mbpp: `task_id`, `completion` (HumanEval samples format) -> adds `passed`, `result` as HumanEval
  writes them; the problems come from `--data` (the problems file or the data root).
- any other environment: `answer`, `completion`, optional `id`, `prompt`, `metadata` -> adds `score`, `parts`.
A malformed record is reported on stderr as `FILE:LINE: problem`, written to the output with an `error`,
and the rest of the file is still scored. Exit code 0 when every record was well formed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

MAX_COMPLETION_CHARS = 1_000_000


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("score", help="score existing completions (JSONL) with an environment's verifier",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", required=True, help="environment name (gsm8k, humaneval, arithmetic, ...) or module:attr")
    p.add_argument("--input", required=True, help="JSONL file of records with a `completion` field")
    p.add_argument("--output", help="write the scored records here (JSONL, same order as the input)")
    p.add_argument("--data", help="the environment's dataset file or data root (HumanEval's problems file)")
    # Sandboxed scoring spends much of each call waiting on process start-up and teardown, so twice the
    # core count keeps the cores busy (HumanEval on 2 cores: ~10s with 2 workers, ~6s with 4).
    p.add_argument("--workers", type=int, default=max(4, 2 * (os.cpu_count() or 2)), help="concurrent scorers (default: twice the CPU count, at least 4)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per record before it is scored as errored")


@dataclass
class Item:
    """One input line: its record and task, or the reason it could not be turned into one."""

    line: int
    record: Any
    task: Any = None
    completion: str = ""
    problem: str | None = None


def _require_str(rec: dict, key: str) -> str:
    if key not in rec:
        raise ValueError(f"missing field {key!r}")
    if not isinstance(rec[key], str):
        raise ValueError(f"field {key!r} must be a string, got {type(rec[key]).__name__}")
    return rec[key]


CODE_ENVS = ("humaneval", "mbpp")
"""Environments whose records are samples (`task_id`, `completion`) of a known problem set."""


def known_tasks(env: Any, env_name: str) -> dict[str, Any] | None:
    """task_id -> Task for the sample-format environments (MBPP ids also without the "mbpp/" prefix)."""
    if env_name not in CODE_ENVS:
        return None
    tasks = {t.id: t for t in env.load("test")}
    if env_name == "mbpp":
        tasks.update({t.id.split("/", 1)[1]: t for t in list(tasks.values())})
    return tasks


def _make_task(env: Any, env_name: str, rec: dict, line: int, problems: dict | None) -> Any:
    from rollwise.envs.base import Task

    if problems is not None:
        if "task_id" not in rec:
            raise ValueError("missing field 'task_id'")
        tid = rec["task_id"]
        if not isinstance(tid, (str, int)) or isinstance(tid, bool):
            raise ValueError(f"field 'task_id' must be a string, got {type(tid).__name__}")
        if str(tid) not in problems:
            raise ValueError(f"unknown task_id {str(tid)[:80]!r}")
        return problems[str(tid)]
    if hasattr(env, "task_from_record"):
        return env.task_from_record(rec, line)
    if "answer" not in rec:
        raise ValueError("missing field 'answer'")
    md = rec.get("metadata", {})
    if not isinstance(md, dict):
        raise ValueError(f"field 'metadata' must be an object, got {type(md).__name__}")
    if "numbers" in rec:  # countdown records may carry the numbers at top level
        md = {**md, "numbers": rec["numbers"]}
    prompt = rec.get("prompt", "")
    if not isinstance(prompt, str):
        raise ValueError(f"field 'prompt' must be a string, got {type(prompt).__name__}")
    return Task(id=str(rec.get("id", line)), prompt=prompt, answer=rec["answer"], metadata=md)


def read_items(path: str, env: Any, env_name: str, problems: dict | None) -> list[Item]:
    """Parse every line; a bad one becomes an Item with `problem` set instead of stopping the run."""
    items: list[Item] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            item = Item(line=line_no, record=None)
            items.append(item)
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                item.problem = f"not valid JSON ({e.msg} at column {e.colno})"
                continue
            item.record = rec
            try:
                if not isinstance(rec, dict):
                    raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
                item.completion = _require_str(rec, "completion")
                if len(item.completion) > MAX_COMPLETION_CHARS:
                    raise ValueError(f"completion is {len(item.completion)} characters (limit {MAX_COMPLETION_CHARS})")
                item.task = _make_task(env, env_name, rec, line_no, problems)
            except (ValueError, TypeError, KeyError) as e:
                item.problem = str(e).splitlines()[0] if str(e) else type(e).__name__
    return items


def _scored_record(env_name: str, rec: dict, score: Any) -> dict:
    out = dict(rec)
    if env_name in CODE_ENVS:
        result = score.info.get("result") or f"failed: {score.error}"
        out.update(passed=result == "passed", result=result)
    else:
        out.update(score=score.value, parts=score.parts)
        if env_name == "gsm8k":
            out.update(correct=score.value == 1.0, extracted=score.info.get("extracted"))
    if score.error:
        out["error"] = score.error
    return out


def run(args: argparse.Namespace) -> int:
    from rollwise.cli.main import UserError
    from rollwise.envs import get_env
    from rollwise.rewards import score_many

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    if not os.path.isfile(args.input):
        raise UserError(f"--input {args.input!r}: " + ("a directory, not a file" if os.path.isdir(args.input) else "no such file"))
    from rollwise.cli.paths import output_file
    from rollwise.cli.terminal import say

    output_file(args.output)  # before scoring, not after
    kwargs = {"path": args.data} if args.data and args.env in ("gsm8k", "humaneval", "mbpp") else {}
    env = get_env(args.env, **kwargs)
    problems = known_tasks(env, args.env)
    t0 = time.monotonic()
    items = read_items(args.input, env, args.env, problems)
    for it in items:
        if it.problem:
            say(f"{args.input}:{it.line}: {it.problem}", file=sys.stderr)
    good = [it for it in items if it.problem is None]
    scores = score_many(env, [(it.task, it.completion) for it in good], max_workers=args.workers, timeout_s=args.timeout)
    by_line = {it.line: s for it, s in zip(good, scores)}
    errored = [(it.line, s.error) for it, s in zip(good, scores) if s.error]
    for line, err in errored:
        say(f"{args.input}:{line}: scoring error: {err}", file=sys.stderr)
    if args.output:
        with open(args.output, "w") as fh:
            for it in items:
                if it.problem is not None:
                    rec = dict(it.record) if isinstance(it.record, dict) else {"line": it.line}
                    rec["error"] = it.problem
                else:
                    rec = _scored_record(args.env, it.record, by_line[it.line])
                fh.write(json.dumps(rec) + "\n")
    n_bad = len(items) - len(good)
    correct = sum(1 for s in scores if not s.error and s.value >= 1.0)
    mean = sum(s.value for s in scores) / len(scores) if scores else 0.0
    acc = correct / len(good) if good else 0.0
    label = "pass@1" if args.env in CODE_ENVS else "accuracy"
    print(f"scored {len(good)} of {len(items)} records ({n_bad} malformed, {len(errored)} errored) in "
          f"{time.monotonic() - t0:.1f}s: {label} {correct}/{len(good)} = {acc:.4f}, mean score {mean:.4f}")
    return 1 if n_bad else 0
