"""Code verifier: a completion's functions, jailed, called by the task's own tests from a trusted process.

HumanEval: the candidate is `prompt + completion`, loaded alone in the sandbox; the test (`check(candidate)`)
runs in a separate trusted process with the prompt's helpers, and `candidate` is a proxy that calls the
jailed function and gets plain data back (`rollwise.sandbox.calls`). MBPP: the candidate is the completion
(plus the task's test imports, as MBPP's own harness makes them visible), the asserts run trusted. The
verdict is the trusted process's, in HumanEval's vocabulary (`passed`, `failed: <str(exception)>`, `timed
out`); comparisons are type-strict (True != 1; see `rollwise/sandbox/_check.py`).

Isolation is `required` by default: a machine without the full jail makes scoring raise
`SandboxUnavailable` with one line (the score is errored). Running unisolated takes `isolation="auto"` or
`"off"` (the environments' `isolation` argument, or $ROLLWISE_SANDBOX) and prints a loud warning; what was
used is `CodeTests.isolation()` / `rollwise.sandbox.isolation_in_use()`.

Left out: returned values must be plain data (numbers, strings, bytes, None, lists, tuples, dicts, sets),
so a test that inspects objects of the candidate's own classes cannot pass; a test that mutates its
argument and checks it afterwards sees its own copy unchanged.
"""

from __future__ import annotations

import ast
import builtins
import threading
import warnings
from dataclasses import dataclass, field

from rollwise.sandbox import Sandbox, SandboxLimits
from rollwise.sandbox._check import free_names
from rollwise.sandbox.calls import CallTest, run_call_test
from rollwise.types import Score, Task

DEFAULT_CODE_LIMITS = SandboxLimits(wall_s=6.0, cpu_s=6, memory_mb=1024, nproc=16, output_bytes=256 << 10)
DEFAULT_CALL_TIMEOUT_S: float | None = None
"""Longest single call to the candidate; None: the whole test's wall_s (a reference MBPP solution spends
2.5 s of one free core in one call, and scorers share cores)."""

_sandboxes: dict[str | None, Sandbox] = {}
_sandboxes_lock = threading.Lock()


def code_sandbox(isolation: str | None = None) -> Sandbox:
    """A process-wide sandbox for code rewards; `isolation` None means $ROLLWISE_SANDBOX or 'required'."""
    with _sandboxes_lock:
        if isolation not in _sandboxes:
            _sandboxes[isolation] = Sandbox(isolation=isolation)  # type: ignore[arg-type]
        return _sandboxes[isolation]


def check_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The single program HumanEval's own evaluator runs for one sample (for reference; not what we run)."""
    return prompt + completion + "\n" + test + "\n" + f"check({entry_point})"


def humaneval_test(prompt: str, test: str, entry_point: str) -> CallTest:
    """HumanEval's `check(candidate)`, with the prompt's helpers trusted and `entry_point` the candidate."""
    return CallTest(test=test + f"\ncheck({entry_point})\n", setup=(prompt,), proxies=(entry_point,))


def mbpp_test(test_imports: list[str], test_list: list[str], reference: str = "") -> CallTest:
    """MBPP's asserts; the functions they call are the candidate's.

    `reference` (the task's reference solution, trusted) tells two things the asserts leave implicit: the
    modules they use without importing (its top-level imports join the trusted setup, e.g. `sys`), and which
    builtin-named functions are the candidate's (a task whose function is `sum`). Other builtins a
    candidate redefines stay the real builtins in the test: a candidate's `set` or `sorted` never wraps its
    own answer.
    """
    names: set[str] = set()
    imports: list[str] = []
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences in the dataset's code: not ours to report
            warnings.simplefilter("ignore")
            tree = ast.parse(reference) if reference else None
    except SyntaxError:
        tree = None
    for node in tree.body if tree is not None else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(ast.unparse(node))
    test = "\n".join(test_list) + "\n"
    setup = "\n".join([*test_imports, *imports]) + "\n"
    setup_names = set()
    for node in ast.parse(setup).body:
        setup_names.update((a.asname or a.name).split(".")[0] for a in node.names)  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        free = free_names(test)
    proxies = [n for n in free if n in names or (n not in setup_names and not hasattr(builtins, n))]
    return CallTest(test=test, setup=(setup,), proxies=tuple(proxies))


def run_tests(
    candidate: str,
    spec: CallTest,
    sandbox: Sandbox | None = None,
    limits: SandboxLimits | None = None,
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S,
) -> str:
    """"passed", "failed: <reason>" or "timed out" for `candidate` (Python source) against `spec`.

    A candidate that is not valid text (a lone surrogate cannot be written as UTF-8) fails here, before the
    sandbox: it is the completion's fault, so a wrong answer, never an errored score."""
    try:
        candidate.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"failed: the code is not valid UTF-8 text ({e.reason} at character {e.start})"
    sb = sandbox or code_sandbox()
    return run_call_test(candidate, spec, sb, limits or DEFAULT_CODE_LIMITS, call_timeout_s).result


def code_score(result: str, name: str = "code_tests") -> Score:
    """The Score of a test verdict: 1.0 when it passed; otherwise a wrong answer whose reason is the verdict."""
    ok = float(result == "passed")
    info = {"result": result, "passed": result == "passed"}
    if not ok:
        info["reason"] = result
    return Score(ok, parts={name: ok}, info=info)


@dataclass
class CodeTests:
    """Reward function: 1.0 when the task's tests pass. Needs `test`, `entry_point` (and `prompt`) in metadata.

    `isolation`: None ($ROLLWISE_SANDBOX, else 'required'), 'required', 'auto' or 'off' (the last two warn).
    """

    limits: SandboxLimits = field(default_factory=lambda: DEFAULT_CODE_LIMITS)
    sandbox: Sandbox | None = None
    name: str = "code_tests"
    isolation: str | None = None
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S

    def __post_init__(self) -> None:
        # Check isolation now, so a machine without it is reported at start-up, not mid-run.
        if self.sandbox is None:
            self.sandbox = code_sandbox(self.isolation)

    def isolation_info(self) -> dict:
        """The isolation this reward's sandbox applies (mode, isolated, seccomp, how, warning)."""
        assert self.sandbox is not None
        return self.sandbox.describe()

    def __call__(self, task: Task, completion: str) -> Score:
        md = task.metadata
        missing = [k for k in ("test", "entry_point") if k not in md]
        if missing:
            raise ValueError(f"task {task.id}: metadata lacks {', '.join(missing)} needed to run its tests")
        prompt = md.get("prompt", task.prompt)
        spec = humaneval_test(prompt, md["test"], md["entry_point"])
        result = run_tests(prompt + completion, spec, self.sandbox, self.limits, self.call_timeout_s)
        return code_score(result, self.name)
