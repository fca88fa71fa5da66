"""Request framing for `rollwise serve`: where one request's body ends and the next request begins.

Behind a proxy, the proxy and this server must agree byte for byte on where each request ends. Where they
disagree, bytes the proxy forwarded as a body are read here as a request of their own, one the proxy never saw
(request smuggling: it skips the proxy's routing, authentication and logging). So a request head that two
HTTP parsers could read two ways is refused, before any route runs, and the connection is closed after the
answer (the rest of the stream cannot be trusted):

- **Content-Length and Transfer-Encoding together** (RFC 9112 §6.1 says either may win): 400.
- **More than one Content-Length**, even with equal values, or one that is not plain ASCII digits
  (`5, 5`, `+5`, `0_5`, an Arabic-Indic digit, all of which Python's `int()` reads): 400.
- **Transfer-Encoding alone**: `chunked` is 411 (send Content-Length), any other coding 501. Chunked request
  bodies are deliberately not decoded: every OpenAI client sends Content-Length, and one framing rule (a
  length known before the body is read, checked against the body limits) leaves nothing to disagree on.
- **Header lines a lenient parser reads differently from the stdlib's**: whitespace before the colon or in
  the name (the stdlib silently drops that header and every one after it), a continuation line (obs-fold),
  a bare CR (the stdlib splits the line there), NUL or other control characters: 400.

A body that a route does not read (a GET with a body, a request refused before its body was read) is still
framed by its Content-Length: the handler reads and drops it, or closes the connection when it is larger
than the JSON body limit, so it is never parsed as the next request (see `_Handler._finish_body`).
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message

_TCHAR = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
"""Bytes allowed in a header name (RFC 9110 §5.6.2 `token`)."""
_MAX_LENGTH_DIGITS = 18
"""A Content-Length of more digits is refused as malformed (the body limits refuse far smaller ones)."""


@dataclass
class FramingError(Exception):
    """The request head cannot be framed unambiguously: answer `status` with `message`, then close."""

    status: int
    message: str

    def __str__(self) -> str:
        return self.message


def check_head_lines(lines: list[bytes]) -> None:
    """Refuse raw header lines (as read, line ending included) that another parser could read differently."""
    for raw in lines:
        line = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
        shown = line[:60].decode("latin-1").encode("unicode_escape").decode()
        if line[:1] in (b" ", b"\t"):
            raise FramingError(400, f"bad header line {shown!r}: continuation lines (obs-fold) are not accepted")
        name, colon, value = line.partition(b":")
        if not colon or not name or any(c not in _TCHAR for c in name):
            raise FramingError(400, f"bad header line {shown!r}: expected 'Name: value' with no space before the "
                                    "colon")
        if any((c < 0x20 and c != 0x09) or c == 0x7F for c in value):
            raise FramingError(400, f"bad header line {shown!r}: control characters (a bare CR, NUL, ...) are not "
                                    "accepted in header values")


def body_length(headers: Message) -> int:
    """The request body's length in bytes from parsed headers (0 without a body), or FramingError."""
    if headers.defects:
        raise FramingError(400, f"malformed request head: {type(headers.defects[0]).__name__}")
    lengths = headers.get_all("Content-Length") or []
    codings = headers.get_all("Transfer-Encoding") or []
    if lengths and codings:
        raise FramingError(400, "the request has both Content-Length and Transfer-Encoding; send only Content-Length")
    if codings:
        names = [c.strip().lower() for v in codings for c in v.split(",")]
        if all(n == "chunked" for n in names):
            raise FramingError(411, "chunked request bodies are not supported; send Content-Length")
        raise FramingError(501, f"Transfer-Encoding {', '.join(names)[:60]!r} is not supported; send Content-Length")
    if not lengths:
        return 0
    if len(lengths) > 1:
        raise FramingError(400, f"the request has more than one Content-Length ({len(lengths)}); send exactly one")
    value = lengths[0].strip(" \t")
    if not (value.isascii() and value.isdigit() and len(value) <= _MAX_LENGTH_DIGITS):
        raise FramingError(400, f"bad Content-Length {value[:40]!r}: Content-Length must be a decimal number of bytes")
    return int(value)


class HeadRecorder:
    """Wraps the request stream while the stdlib reads a request head, keeping the raw lines it reads
    (`http.client.parse_headers` reads them with `readline` only) for `check_head_lines`."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.lines: list[bytes] = []

    def readline(self, limit: int = -1) -> bytes:
        line = self.stream.readline(limit)
        if line not in (b"\r\n", b"\n", b""):
            self.lines.append(line)
        return line
