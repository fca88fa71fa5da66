"""One episode's environment instance (a tool class's, a gym-style class's) in a child process of its own, so that
a call past its time can be killed.

A thread cannot be stopped, and a tool whose C call keeps the GIL (`pow(3, 15_000_000)`, a huge regex, a tight
loop in an extension) holds every thread of the process until it returns, past any timeout a thread join sets.
So the episode's instance lives in a forked child: the parent resets it (the child is forked after `reset`, so
it starts with the reset state in its memory, nothing pickled), sends each call's name and arguments down a
pipe and waits at most the call's time for the answer; past it, the child is killed (SIGKILL) and the call is
over at once, whatever the tool was doing.

The reward reads the instance (`environments=`, TRL's convention), so its state comes back: when the episode ends
the child runs `get_reward()` (killable the same way) and sends the instance's attributes back pickled; the parent
puts them on its own instance (the same object the episode started with, so `environments=` sees it). A killed
child's state is lost, so a timed-out call ends its episode.

NOTE: the child is forked from a process that may run other threads (the engine, scorers); it only runs the
user's tool code and `pickle`, exits with `os._exit` (no atexit handlers, no flushing of the parent's buffers), and
dies with its parent (PR_SET_PDEATHSIG) even while a tool spins.

Deliberately left out: platforms without `fork` (tools run in threads there: `ToolEnv.isolation`), and forking from
a small process of its own instead of the trainer (a fork of the trainer costs about 15 ms of CPU per episode, plus
a copy of each page the trainer writes while episodes' processes live; docs/benchmarks.md), which would need the
instance pickled on its way in too.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import pickle
import select
import signal
import struct
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

Outcome = tuple[Literal["ok", "failed", "timeout"], Any]
"""("ok", value), ("failed", one-line reason) or ("timeout", None)."""

_HEAD = struct.Struct(">Q")


def can_fork() -> bool:
    return hasattr(os, "fork") and hasattr(os, "pipe")


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when its parent dies (a spinning tool never reads its pipe's EOF)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the pipe's EOF still ends an idle child
        pass


def _close_other_fds(*keep: int) -> None:
    """Close every inherited descriptor but stdio and `keep`. NOTE: a fork copies all of the parent's descriptors,
    close-on-exec or not; a pipe's write end held here (another child's, or a sandboxed program's stdout that a scorer
    thread is reading) would keep its reader from ever seeing EOF for as long as this child lives."""
    start = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(start, fd)
        start = fd + 1
    try:
        top = os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        top = 1 << 16
    os.closerange(start, max(top, start))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(_HEAD.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """n bytes from fd, or None at EOF or past the deadline."""
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _read_message(fd: int, deadline: float | None) -> Any:
    head = _read_exact(fd, _HEAD.size, deadline)
    if head is None:
        return None
    body = _read_exact(fd, _HEAD.unpack(head)[0], deadline)
    return None if body is None else pickle.loads(body)


def _awaited(value: Any) -> Any:
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _describe(e: BaseException) -> str:
    try:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return (f"{type(e).__name__}: {msg}" if msg else type(e).__name__)[:300]
    except BaseException:  # noqa: BLE001 - an exception whose message cannot be made
        return type(e).__name__


def instance_state(obj: Any) -> dict[str, Any]:
    """What comes back of an instance: its attributes (`__dict__`; the class itself stays where it is, so classes
    defined in a function or a notebook work too). TypeError for an instance without a `__dict__`."""
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict):
        raise TypeError(f"a {type(obj).__name__} instance has no __dict__ to send back")
    return state


def _serve(obj: Any, rfd: int, wfd: int, shown: Any) -> None:
    """The child's loop: ("call", name, args, kwargs) -> ("ok", shown(result)) | ("failed", reason);
    ("finish", want_reward) -> ("done", reward outcome, pickled attributes or None, why not), then exit."""
    while True:
        msg = _read_message(rfd, None)
        if msg is None:
            return
        if msg[0] == "call":
            _, name, args, kwargs = msg
            try:
                reply: tuple[Any, ...] = ("ok", shown(_awaited(getattr(obj, name)(*args, **kwargs))))
            except BaseException as e:  # noqa: BLE001 - the tool's failure, reported to the parent
                reply = ("failed", e.args[0] if type(e).__name__ == "ToolFailed" else f"raised {_describe(e)}")
            _write_all(wfd, pickle.dumps(reply))
            continue
        reward: tuple[str, Any] = ("ok", None)
        if msg[1]:
            try:
                reward = ("ok", _awaited(obj.get_reward()))
                pickle.dumps(reward)
            except BaseException as e:  # noqa: BLE001
                reward = ("failed", f"raised {_describe(e)}")
        try:
            state, why = pickle.dumps(instance_state(obj)), None
        except BaseException as e:  # noqa: BLE001
            state, why = None, _describe(e)
        _write_all(wfd, pickle.dumps(("done", reward, state, why)))
        return


_forker: ThreadPoolExecutor | None = None
_forker_lock = threading.Lock()


def _fork_thread() -> ThreadPoolExecutor:
    """The one thread every child is forked from. NOTE: PR_SET_PDEATHSIG fires when the *thread* that forked a
    child ends, and episodes step in short-lived threads; this thread lives as long as the process."""
    global _forker
    with _forker_lock:
        if _forker is None:
            _forker = ThreadPoolExecutor(1, thread_name_prefix="rollwise-tool-fork")
        return _forker


def _spawn(obj: Any, shown: Any) -> tuple[int, int, int]:
    """(pid, fd to write to the child, fd to read from it) of a fresh child serving `obj`."""
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(down_w)
            os.close(up_r)
            _close_other_fds(down_r, up_w)
            _die_with_parent()
            # NOTE: a collection would walk (and so copy, page by page) the whole inherited heap: tens of ms with a
            # model loaded. The child lives for one episode; its own garbage is freed by reference counts or at exit.
            gc.disable()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
            _serve(obj, down_r, up_w, shown)
        except BaseException:  # noqa: BLE001 - nothing of the child may run the parent's code paths
            code = 1
        finally:
            os._exit(code)
    os.close(down_r)
    os.close(up_w)
    return pid, down_w, up_r


_reaper: ThreadPoolExecutor | None = None


def _reap(pid: int) -> None:
    """Wait for a finished or killed child off the caller's path (a large process takes milliseconds to exit)."""
    global _reaper
    with _forker_lock:
        if _reaper is None:
            _reaper = ThreadPoolExecutor(1, thread_name_prefix="rollwise-tool-reap")
    try:
        _reaper.submit(_waitpid, pid)
    except RuntimeError:  # interpreter shutdown: wait here
        _waitpid(pid)


def _waitpid(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class ToolProcess:
    """A forked child holding one episode's instance (see the module docstring). The fork runs on `_fork_thread` as
    soon as the process is made (right after `reset`), so it is ready by the episode's first call: the policy's first
    turn is generated meanwhile."""

    def __init__(self, obj: Any, shown: Any):
        self._started: Future[tuple[int, int, int]] | None = _fork_thread().submit(_spawn, obj, shown)
        self.pid = self._w = self._r = -1
        self.alive = True
        self.failed: str | None = None

    def start_error(self) -> str | None:
        """Why the child could not be forked (out of processes or descriptors), or None once it runs."""
        return self._ready()

    def _ready(self) -> str | None:
        """Wait for the fork; why the child could not start (e.g. out of processes), or None."""
        if self._started is not None:
            started, self._started = self._started, None
            try:
                self.pid, self._w, self._r = started.result()
            except OSError as e:
                self.alive, self.failed = False, f"its process could not start ({_describe(e)})"
        return self.failed

    def call(self, name: str, kwargs: dict[str, Any], timeout_s: float, args: tuple[Any, ...] = ()) -> Outcome:
        """One call of the instance's method `name`, at most `timeout_s` (past it the child is killed)."""
        if self._ready() or not self.alive:
            return "failed", self.failed or "its process ended"
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            _write_all(self._w, pickle.dumps(("call", name, tuple(args), kwargs)))
        except OSError:
            self.kill()
            return "failed", "its process ended"
        msg = _read_message(self._r, deadline)
        if msg is None:
            timed_out = time.monotonic() >= deadline
            self.kill()
            return ("timeout", None) if timed_out else ("failed", "its process ended")
        return msg[0], msg[1]

    def finish(self, want_reward: bool, timeout_s: float) -> tuple[Outcome, dict[str, Any] | None, str | None]:
        """(get_reward's outcome, the instance's attributes as they are now or None, why they could not come back);
        the child exits."""
        if self._ready() or not self.alive:
            why = self.failed or "its process ended"
            return ("failed", why), None, why
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            _write_all(self._w, pickle.dumps(("finish", want_reward)))
            msg = _read_message(self._r, deadline)
        except OSError:
            msg = None
        if msg is None:
            timed_out = time.monotonic() >= deadline
            self.kill()
            return (("timeout", None) if timed_out else ("failed", "its process ended")), None, \
                ("it ran past its time" if timed_out else "its process ended")
        self.close()
        _, reward, state, why = msg
        if state is None:
            return reward, None, why
        try:
            return reward, pickle.loads(state), None
        except Exception as e:  # noqa: BLE001 - e.g. a class whose __setstate__ raises
            return reward, None, _describe(e)

    def kill(self) -> None:
        if self.alive and self._ready() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.close()

    def close(self) -> None:
        if not self.alive or self._ready() is not None:
            return
        self.alive = False
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        _reap(self.pid)

    def __del__(self) -> None:
        try:
            self.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["Outcome", "ToolProcess", "can_fork", "instance_state"]
