"""Connection guard for `rollwise serve`: deadlines, a connection cap, a byte budget, accept back-off.

The stdlib server gives every connection a thread and reads with no deadline, so a client that connects
and sends nothing, or trickles its headers a byte at a time, or announces a 30 MiB body and stalls,
holds a thread (and the bytes read so far) forever, and enough of them exhaust threads, memory or file
descriptors. This module bounds each of those:

- **Deadlines by phase.** Every read goes through `DeadlineReader`, whose `recv` is bounded by the
  current phase's deadline: the request head (line + headers) must arrive within `header_timeout_s` of
  the connection opening or of the previous response (the keep-alive idle limit too); a body must arrive
  within `body_timeout_s + length / min_body_rate`. Writes time out after `write_timeout_s` (a client
  that stops reading its stream is dropped and its request aborted).
- **Head size.** A request line over `max_request_line` bytes answers 414, a head over `max_header_bytes`
  431, checked while reading, before the bytes pile up.
- **A connection cap.** At most `max_connections` are held, and never more than the file-descriptor
  limit leaves room for. At the cap a new connection evicts the longest-waiting connection that has not
  delivered a complete request head (idle keep-alives and slow-loris clients go first, so `/health` still
  gets in); when every held connection is working on a request, the new one gets a 503 and is closed.
- **A byte budget.** Request bodies being read or held by running requests count against
  `max_buffered_mb` as their bytes arrive; a body that would go over it is refused with 503.
  Authenticated weight uploads are exempt (they are bounded by `max_upload_gb` and their deadline).
- **Accept back-off.** When `accept()` fails for lack of descriptors (EMFILE/ENFILE) or memory, the
  accept loop evicts one idle connection and sleeps, doubling up to 0.5 s, instead of spinning on a
  listening socket that stays readable.

Left out on purpose: per-client-address limits and rate limiting (a proxy's job), HTTP/2, TLS.
"""

from __future__ import annotations

import errno
import io
import logging
import socket
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("rollwise.serve")

FD_RESERVE = 64
"""File descriptors kept free for everything but client connections (model files, logs, the listener)."""
_ACCEPT_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass
class ConnLimits:
    """Per-connection limits (see the module docstring); `ServeConfig` carries them to the server."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    min_body_rate_mb_s: float = 1.0
    write_timeout_s: float = 60.0
    max_connections: int = 512
    max_buffered_mb: float = 256.0
    max_request_line: int = 8192
    max_header_bytes: int = 65536

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "min_body_rate_mb_s", "write_timeout_s", "max_buffered_mb"):
            v = getattr(self, name)
            if not v > 0 or v == float("inf"):
                raise ValueError(f"{name} must be a positive finite number, got {v}")
        for name in ("max_connections", "max_request_line", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def body_deadline_s(self, length: int) -> float:
        return self.body_timeout_s + length / (self.min_body_rate_mb_s * 2**20)


def fd_connection_cap(requested: int) -> int:
    """`requested`, lowered so that held connections leave `FD_RESERVE` descriptors of the soft limit free."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return requested
    if soft == resource.RLIM_INFINITY:
        return requested
    return max(1, min(requested, int(soft) - FD_RESERVE))


class ReadDeadline(Exception):
    """The current phase's deadline passed; `got` bytes of it had arrived."""

    def __init__(self, phase: str, timeout_s: float, got: int) -> None:
        super().__init__(f"{phase} not received within {timeout_s:g}s")
        self.phase, self.timeout_s, self.got = phase, timeout_s, got


class HeadTooLarge(Exception):
    """More than the allowed bytes arrived before the request head ended."""


class Evicted(Exception):
    """The server closed this connection to make room for another."""


class DeadlineReader(io.RawIOBase):
    """A socket's read side where each `recv` waits no longer than the current phase allows.

    The socket's timeout is set to the time left before each `recv` and put back to the write timeout
    after it, so the handler's writes are bounded too.
    """

    def __init__(self, sock: socket.socket, write_timeout_s: float) -> None:
        super().__init__()
        self.sock = sock
        self.write_timeout_s = write_timeout_s
        self.phase = "head"
        self.timeout_s = 0.0
        self.deadline: float | None = None
        self.limit: int | None = None
        self.got = 0
        self.evicted = False

    def begin(self, phase: str, timeout_s: float | None, limit: int | None = None) -> None:
        self.phase, self.got, self.limit = phase, 0, limit
        self.timeout_s = timeout_s or 0.0
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        if self.evicted:
            raise Evicted()
        wait = self.write_timeout_s  # a read outside any phase (none is expected) is bounded too
        if self.deadline is not None:
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                raise ReadDeadline(self.phase, self.timeout_s, self.got)
        if self.limit is not None and self.got > self.limit:
            raise HeadTooLarge()
        self.sock.settimeout(wait)
        try:
            n = self.sock.recv_into(b)
        except TimeoutError:
            raise ReadDeadline(self.phase, self.timeout_s, self.got) from None
        finally:
            if not self.evicted:
                try:
                    self.sock.settimeout(self.write_timeout_s)
                except OSError:
                    pass
        if n == 0 and self.evicted:
            raise Evicted()
        self.got += n
        return n


class Connection:
    """One accepted socket: its reader, and whether it is waiting for a request head (evictable)."""

    def __init__(self, sock: socket.socket, write_timeout_s: float) -> None:
        self.sock = sock
        self.reader = DeadlineReader(sock, write_timeout_s)
        self.waiting_since = time.monotonic()
        self.waiting = True
        """True until a complete request head arrived, and again after each response (keep-alive)."""

    def evict(self) -> None:
        # NOTE: called with the table's lock held, and a connection leaves the table (under that lock)
        # before its socket is closed, so this never shuts down a descriptor reused by a newer socket.
        self.reader.evicted = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the handler's blocked recv with EOF
        except OSError:
            pass


class ConnectionTable:
    """The connections the server holds, at most `cap`; evicts waiting ones to admit new ones."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._lock = threading.Lock()
        self._conns: dict[int, Connection] = {}
        self.evictions = 0
        self.rejections = 0

    def __len__(self) -> int:
        return len(self._conns)

    def admit(self, conn: Connection) -> bool:
        with self._lock:
            if len(self._conns) >= self.cap and not self._evict_one_locked():
                self.rejections += 1
                return False
            self._conns[id(conn.sock)] = conn
            return True

    def get(self, sock: socket.socket) -> Connection | None:
        with self._lock:
            return self._conns.get(id(sock))

    def remove(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.pop(id(sock), None)

    def evict_one(self) -> bool:
        with self._lock:
            return self._evict_one_locked()

    def _evict_one_locked(self) -> bool:
        waiting = [c for c in self._conns.values() if c.waiting]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: c.waiting_since)
        del self._conns[id(victim.sock)]
        victim.evict()
        self.evictions += 1
        return True


class ByteBudget:
    """Request-body bytes held across all connections, at most `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class AcceptBackoff:
    """What the accept loop does when `accept()` fails for lack of descriptors or memory."""

    def __init__(self, table: ConnectionTable) -> None:
        self.table = table
        self.delay = 0.0
        self.failures = 0

    def failed(self, err: OSError) -> None:
        if err.errno not in _ACCEPT_ERRNOS:
            return
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:
            log.warning("accept() failed (%s, %d times so far): closing an idle connection and backing off; "
                        "raise the descriptor limit (ulimit -n) or lower --max-connections",
                        errno.errorcode.get(err.errno, err.errno), self.failures)
        self.table.evict_one()
        self.delay = min(0.5, max(0.01, self.delay * 2))
        time.sleep(self.delay)

    def succeeded(self) -> None:
        self.delay = 0.0


def reject_busy(sock: socket.socket, body: bytes) -> None:
    """Answer a connection over the cap with a 503 (`body` is the whole response) and close it, without blocking."""
    try:
        sock.setblocking(False)
        try:
            sock.recv(65536)  # what the client already sent, so closing does not reset the connection
        except (BlockingIOError, InterruptedError):
            pass
        sock.send(body)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()
