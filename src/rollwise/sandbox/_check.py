"""The trusted test process: runs a task's own test code against a proxy of the jailed candidate (stdlib only).

Started by `calls.py` as a worker (`python -I -S -B _check.py SOCKFD LIMITS`), reused across tests: each
job comes over a unix socket with two fds wired to one jail's call server. It runs the trusted setup code
(HumanEval's prompt, MBPP's imports) in a fresh namespace, binds each name the test calls to a
`Candidate` proxy, runs the test code, and answers one JSON verdict (`passed` / `failed: ...` / `timed
out`) on the socket; its stdout goes to stderr, so the test's prints never reach a verdict.

A proxy call sends the arguments as plain data, waits (per-call and total deadlines) for one answer, and
decodes it itself (`_wire.py`): the test only ever sees builtin values, never an object of the
candidate's. A candidate that dies, hangs, answers out of turn or returns non-data makes a *sticky* fault:
the verdict is failed (or timed out) whatever the test code does next, even if it catches the exception.

Comparisons in the test code are type-strict: every `==`, `!=`, `in` and `not in` of the test (not of the
setup code) is rewritten to call `strict_eq`, under which bool is never equal to a number (True != 1),
list != tuple, and int == float only when numerically equal (HumanEval writes `== 6.00` for an int-valued
area, and five MBPP references return a float where the assert writes an int: we keep what the test's
author wrote). Comparisons involving
any non-plain value (only the test's own objects can be such) keep Python's meaning.

Left out: the test code is trusted and runs unjailed (with rlimits): it is the dataset's, not the model's.
"""

from __future__ import annotations

import ast
import builtins
import json
import operator
import os
import resource
import select
import sys
import time

try:  # imported by the scorer (free_names), or run as a script with only the stdlib
    from rollwise.sandbox._wire import MAX_DEPTH, MAX_MESSAGE_BYTES, WireError, WireLimit, decode, loads, pack_request
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _wire import MAX_DEPTH, MAX_MESSAGE_BYTES, WireError, WireLimit, decode, loads, pack_request  # type: ignore[no-redef]


# -- type-strict comparison --------------------------------------------------------------------------------
class _NotPlain(Exception):
    pass


def _key(x: object, depth: int = 0) -> object:
    """A hashable, type-tagged image of plain data: equal images <=> strictly equal values."""
    if depth > MAX_DEPTH:
        raise _NotPlain
    t = type(x)
    if x is None:
        return ("N",)
    if t is bool:
        return ("B", x)
    if t is int:
        return ("n", x)
    if t is float:
        return ("n", int(x)) if x.is_integer() else ("f", x)  # type: ignore[union-attr]
    if t is complex:
        return _key(x.real, depth) if x.imag == 0 else ("c", x)  # type: ignore[union-attr]
    if t is str:
        return ("s", x)
    if t is bytes:
        return ("y", x)
    if t is list:
        return ("l", tuple(_key(e, depth + 1) for e in x))  # type: ignore[union-attr]
    if t is tuple:
        return ("t", tuple(_key(e, depth + 1) for e in x))  # type: ignore[union-attr]
    if t is dict:
        return ("d", frozenset((_key(k, depth + 1), _key(v, depth + 1)) for k, v in x.items()))  # type: ignore[union-attr]
    if t is set or t is frozenset:
        return ("S", frozenset(_key(e, depth + 1) for e in x))  # type: ignore[union-attr]
    raise _NotPlain


def strict_eq(a: object, b: object) -> bool:
    try:
        return _key(a) == _key(b)
    except _NotPlain:
        return a == b  # type: ignore[no-any-return]


def strict_in(a: object, container: object) -> bool:
    t = type(container)
    if t in (list, tuple, set, frozenset):
        return any(strict_eq(a, y) for y in container)  # type: ignore[union-attr]
    if t is dict:
        return any(strict_eq(a, y) for y in container)  # type: ignore[union-attr]
    return a in container  # type: ignore[operator]


_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "is": operator.is_,
        "is not": operator.is_not, "==": strict_eq, "!=": lambda a, b: not strict_eq(a, b),
        "in": strict_in, "not in": lambda a, b: not strict_in(a, b)}
_AST_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Lt: "<", ast.LtE: "<=",
            ast.Gt: ">", ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not"}
COMPARE = "__rollwise_compare__"


def compare(ops: str, left: object, *rights: object) -> object:
    """A rewritten chained comparison (operands already evaluated, left to right)."""
    a, result = left, True
    for op, b in zip(ops.split(","), rights):
        result = _OPS[op](a, b)
        if not result:
            return result
        a = b
    return result


class _Strict(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        ops = [_AST_OPS[type(o)] for o in node.ops]
        if not any(o in ("==", "!=", "in", "not in") for o in ops):
            return node
        call = ast.Call(func=ast.Name(COMPARE, ast.Load()), args=[ast.Constant(",".join(ops)), node.left, *node.comparators], keywords=[])
        return ast.copy_location(call, node)


def strict_source(source: str, filename: str) -> object:
    tree = _Strict().visit(ast.parse(source, filename))
    return compile(ast.fix_missing_locations(tree), filename, "exec")


def free_names(source: str) -> list[str]:
    """Names the code reads but never binds (candidates for proxies)."""
    tree = ast.parse(source)
    loaded, bound = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (loaded if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
    return sorted(loaded - bound)


# -- the channel to the jailed candidate -------------------------------------------------------------------
class Fault(BaseException):
    """The candidate broke the protocol, died, hung or returned non-data: the verdict is no longer `passed`."""

    def __init__(self, message: str, timeout: bool = False):
        super().__init__(message)
        self.timeout = timeout


class CandidateError(Exception):
    """An exception the candidate raised whose type has no builtin counterpart."""


class Channel:
    def __init__(self, rfd: int, wfd: int, per_call_s: float, deadline: float):
        self.rfd, self.wfd = rfd, wfd
        self.per_call_s, self.deadline = per_call_s, deadline
        self.buf = bytearray()
        self.next_id = 0
        self.fault: Fault | None = None
        self.calls = 0

    def _fail(self, message: str, timeout: bool = False) -> Fault:
        if self.fault is None:
            self.fault = Fault(message, timeout)
        return self.fault

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([], [self.wfd], [], left)[1]:
                raise self._fail("timed out", timeout=True)
            try:
                n = os.write(self.wfd, view[: 1 << 16])
            except OSError:
                raise self._fail("the candidate process ended without answering") from None
            view = view[n:]

    def receive(self, want_id: int, what: str) -> dict:
        end = min(self.deadline, time.monotonic() + self.per_call_s)
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise self._fail("timed out", timeout=True)
            try:
                chunk = os.read(self.rfd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                raise self._fail(f"the candidate process ended without answering ({what})")
            self.buf += chunk
            if len(self.buf) > MAX_MESSAGE_BYTES:
                raise self._fail(f"the candidate's answer is over {MAX_MESSAGE_BYTES} bytes")
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            msg = loads(line)
        except WireError as e:
            raise self._fail(f"malformed answer from the candidate: {e}") from None
        if type(msg) is not dict or msg.get("id") != want_id:
            raise self._fail("the candidate answered out of turn")
        return msg

    def call(self, name: str, args: tuple, kwargs: dict) -> object:
        if self.fault is not None:
            raise self.fault
        try:
            request = pack_request(self.next_id + 1, name, tuple(args), dict(kwargs))
        except (WireLimit, RecursionError) as e:
            # NOTE: plain data past the wire's bounds is what a round trip of the candidate's own answers makes
            # (`f(f(x))` with f nesting or growing its input): the candidate's failure, not the task's.
            raise self._fail(f"the arguments to {name} are past the wire's limits: {e}") from None
        except WireError as e:
            raise HarnessError(f"the test passed an argument that is not plain data to {name}: {e}") from None
        self.next_id += 1
        self.calls += 1
        self._send(request)
        msg = self.receive(self.next_id, f"call {self.calls} to {name}")
        if "ok" in msg:
            try:
                return decode(msg["ok"])
            except (WireError, RecursionError) as e:
                raise self._fail(f"{name} returned something that is not plain data: {e}") from None
        if "raised" in msg:
            raise _exception_from(msg["raised"], self)
        if "fault" in msg:
            raise self._fail(f"{name} {str(msg['fault'])[:500]}")
        raise self._fail("malformed answer from the candidate")


def _exception_from(raised: object, chan: Channel) -> BaseException:
    """The trusted counterpart of the candidate's exception: the first builtin class of its MRO."""
    try:
        names, message = raised  # type: ignore[misc]
        names, message = [str(n) for n in names], str(message)
    except (TypeError, ValueError):
        return chan._fail("malformed exception report from the candidate")
    for n in names:
        cls = getattr(builtins, n, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            if cls in (StopIteration, StopAsyncIteration):  # would end `map(candidate, xs)` early, silently
                return CandidateError(f"{n}: {message}")
            if issubclass(cls, Exception):
                try:
                    return cls(message)
                except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
                    return CandidateError(message)
            # SystemExit, KeyboardInterrupt, GeneratorExit...: never a value a test could expect
            return chan._fail(message)
    return CandidateError(message)


class HarnessError(Exception):
    """The trusted side could not run the test (not the candidate's fault)."""


class Candidate:
    """Stands for the candidate's function `name` in the test code: calls go over the channel."""

    def __init__(self, chan: Channel, name: str):
        self._chan, self.__name__ = chan, name

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._chan.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<candidate {self.__name__}>"


# -- main --------------------------------------------------------------------------------------------------
def _verdict(cfg: dict, chan: Channel) -> dict:
    hello = chan.receive(0, "loading")
    if "raised" in hello:
        try:
            return {"result": "failed: " + str(hello["raised"][1])[:2000]}
        except (TypeError, IndexError, KeyError):
            raise chan._fail("malformed answer from the candidate") from None
    ready = hello.get("ready")
    if type(ready) is not list:
        raise chan._fail("malformed answer from the candidate")
    offered = {n for n in ready if type(n) is str}
    ns: dict = {"__name__": "__check__", "__builtins__": builtins}
    for i, src in enumerate(cfg["setup"]):
        try:
            exec(compile(src, f"setup{i}.py", "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - the dataset's own code failed: not the candidate's fault
            raise HarnessError(f"the task's setup code failed: {type(e).__name__}: {e}") from None
    proxies = cfg.get("proxies")
    if proxies is None:  # every name the test reads that nothing trusted defines, if the candidate has it
        proxies = [n for n in free_names(cfg["test"]) if n not in ns and not hasattr(builtins, n) and n in offered]
    for name in proxies:
        ns[name] = Candidate(chan, name)
    ns[COMPARE] = compare
    code = strict_source(cfg["test"], "test.py")
    try:
        exec(code, ns)
        result = "passed"
    except Fault:
        result = ""
    except HarnessError:
        raise
    except BaseException as e:  # noqa: BLE001 - HumanEval's vocabulary: failed: str(e)
        result = "failed: " + str(e)[:2000]
    if chan.fault is not None:
        raise chan.fault
    return {"result": result}


def run_job(cfg: dict, rfd: int, wfd: int) -> dict:
    """One test against one jailed candidate (fds wired to its call server): the verdict as a dict."""
    chan = Channel(rfd, wfd, float(cfg["per_call_s"]), time.monotonic() + float(cfg["total_s"]))
    try:
        verdict = _verdict(cfg, chan)
    except Fault as f:
        verdict = {"result": "timed out" if f.timeout else "failed: " + str(f), "fault": True}
    except HarnessError as e:
        verdict = {"error": str(e)}
    verdict["calls"] = chan.calls
    return verdict


def _recv_exact(sock, n: int, first: bytes = b"") -> bytes:
    buf = bytearray(first)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def serve(sock_fd: int) -> None:
    """Worker loop: jobs arrive on a unix socket as (8-byte length + JSON, with the two fds attached).

    A fresh namespace per job; the process is reused while it answers in time (the scorer kills it
    otherwise), which saves an interpreter start per test.
    """
    import socket

    os.dup2(2, 1)  # the test's own prints go to stderr, never into a verdict
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    sock = socket.socket(fileno=sock_fd)
    while True:
        try:
            head, fds, _, _ = socket.recv_fds(sock, 8, 2)
            if not head:
                break
            body = _recv_exact(sock, int.from_bytes(_recv_exact(sock, 8, head), "big"))
        except (EOFError, OSError):
            break
        if len(fds) != 2:
            break
        try:
            verdict = run_job(json.loads(body), fds[0], fds[1])
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall((json.dumps(verdict) + "\n").encode())
    os._exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[2])
    for name, value in cfg.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, name), (value, value))
    serve(int(sys.argv[1]))


if __name__ == "__main__":
    main()
