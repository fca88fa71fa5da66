"""The data codec between a jailed candidate and the trusted test process (stdlib only; also copied into jails).

Only plain data crosses: None, bool, int, float, complex, str, bytes, and lists, tuples, dicts, sets and
frozensets of those, matched by *exact* type (an int subclass with its own `__eq__` is not an int here).
The one conversion: `collections.Counter`, `OrderedDict` and `defaultdict` are sent as the plain dict of
their items (read with `dict.items`, so no method of theirs runs) and arrive as a dict.

Answers (untrusted -> trusted) are one JSON document per line, written by `dump_text`: JSON's own
null/true/false/numbers/strings/arrays stand for None, bool, int, float, str and list; every other type
is a one-key object naming it (`{"t": [...]}` a tuple, `{"d": [[k, v], ...]}` a dict, `{"b": "<hex>"}`
bytes, `{"s": [...]}` a set, `{"f": [...]}` a frozenset, `{"c": [re, im]}` a complex). The trusted side
parses them with `json` and `decode`, which builds only builtin values, bounds depth and size, and runs
none of the sender's code (never pickle, never marshal): whatever the untrusted side writes, the trusted
side gets plain data or a `WireError`.

Requests (trusted -> untrusted) are `marshal` data behind a 4-byte length: only the jail reads them, and
marshal needs no import there (the jail starts a few milliseconds faster than with `json`).
"""

from __future__ import annotations

import sys

MAX_DEPTH = 100
"""Deepest nesting of containers either side accepts (recursion bombs in returned data fail here)."""
MAX_MESSAGE_BYTES = 16 << 20
"""Largest encoded message either side accepts."""


class WireError(ValueError):
    """A value that is not plain data, or a message that does not decode to plain data."""


class WireLimit(WireError):
    """Plain data past the wire's bounds (nesting, message size, an int's digits): data the candidate can make, so
    the trusted side scores it as the candidate's failure, never as the task's."""


def _dict_like(t: type) -> bool:
    """Is `t` one of `collections`' dict subclasses? (Not imported here: it costs the jail a few ms a start.)

    NOTE: whatever `collections` the candidate may have swapped in, a type passing this test is only ever
    read with `dict.items`, so no method of its runs and the result is a plain dict either way.
    """
    mod = sys.modules.get("collections")
    return mod is not None and t in (getattr(mod, "Counter", None), getattr(mod, "OrderedDict", None), getattr(mod, "defaultdict", None))


def _type_name(t: type) -> str:
    try:
        name = type.__dict__["__name__"].__get__(t)  # not t.__name__: a metaclass could fake it
    except Exception:  # noqa: BLE001
        name = "?"
    return str(name)[:100]


# -- untrusted side: value -> JSON text ---------------------------------------------------------------------
def _float_text(x: float) -> str:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return float.__repr__(x)


def dump_text(value: object) -> str:
    """The JSON text of plain data (see the module docstring); `WireError` naming the first non-plain type."""
    from _json import encode_basestring_ascii as quote  # C, no import cost

    def enc(v: object, depth: int) -> str:
        if depth > MAX_DEPTH:
            raise WireLimit(f"data nested deeper than {MAX_DEPTH} levels")
        t = type(v)
        if v is None:
            return "null"
        if t is bool:
            return "true" if v else "false"
        if t is int:
            try:
                return int.__repr__(v)  # type: ignore[arg-type]
            except ValueError as e:  # over sys.get_int_max_str_digits()
                raise WireLimit(f"cannot encode: {e}") from None
        if t is float:
            return _float_text(v)  # type: ignore[arg-type]
        if t is str:
            return quote(v)
        if t is list:
            return "[" + ",".join([enc(x, depth + 1) for x in v]) + "]"  # type: ignore[attr-defined]
        if t is tuple:
            return '{"t":[' + ",".join([enc(x, depth + 1) for x in v]) + "]}"  # type: ignore[attr-defined]
        if t is dict or (issubclass(t, dict) and _dict_like(t)):  # dict.items: a subclass's methods never run
            return '{"d":[' + ",".join(["[" + enc(k, depth + 1) + "," + enc(x, depth + 1) + "]" for k, x in dict.items(v)]) + "]}"  # type: ignore[arg-type]
        if t is bytes:
            return '{"b":"' + bytes.hex(v) + '"}'  # type: ignore[arg-type]
        if t is set or t is frozenset:
            return '{"' + ("s" if t is set else "f") + '":[' + ",".join([enc(x, depth + 1) for x in v]) + "]}"  # type: ignore[attr-defined]
        if t is complex:
            return '{"c":[' + _float_text(v.real) + "," + _float_text(v.imag) + "]}"  # type: ignore[attr-defined]
        raise WireError(f"a value of type {_type_name(t)} is not plain data")

    return enc(value, 0)


# -- trusted side: JSON text -> value ------------------------------------------------------------------------
def loads(line: bytes | str) -> object:
    """The JSON tree of one message (size-checked); `WireError` when it is not valid JSON."""
    import json

    if len(line) > MAX_MESSAGE_BYTES:
        raise WireError(f"message over {MAX_MESSAGE_BYTES} bytes")
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as e:
        raise WireError(f"malformed message: {str(e)[:200]}") from None


def decode(tree: object) -> object:
    """The plain value a tree of `dump_text`'s JSON stands for. Raises `WireError` on anything else."""
    return _dec(tree, 0)


_TAGS = {"t", "d", "b", "s", "f", "c"}


def _dec(v: object, depth: int) -> object:
    if depth > MAX_DEPTH:
        raise WireError(f"data nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if v is None or t is bool or t is int or t is float or t is str:
        return v
    if t is list:
        return [_dec(x, depth + 1) for x in v]  # type: ignore[union-attr]
    if t is dict and len(v) == 1:  # type: ignore[arg-type]
        (tag, body), = v.items()  # type: ignore[union-attr]
        if tag in _TAGS:
            try:
                return _dec_tagged(tag, body, depth)
            except WireError:
                raise
            except (TypeError, ValueError) as e:  # unhashable key, bad hex, wrong shape
                raise WireError(f"bad {tag!r} value: {str(e)[:200]}") from None
    raise WireError(f"not an encoded value: {str(v)[:80]}")


def _dec_tagged(tag: str, body: object, depth: int) -> object:
    if tag == "b":
        if type(body) is not str:
            raise WireError("bytes must be hex text")
        return bytes.fromhex(body)
    if type(body) is not list:
        raise WireError(f"{tag!r} must hold a list")
    if tag == "t":
        return tuple(_dec(x, depth + 1) for x in body)
    if tag == "s":
        return {_dec(x, depth + 1) for x in body}
    if tag == "f":
        return frozenset(_dec(x, depth + 1) for x in body)
    if tag == "c":
        if len(body) != 2 or not all(type(x) in (int, float) for x in body):
            raise WireError("complex must be [re, im]")
        return complex(body[0], body[1])
    out = {}
    for pair in body:  # tag == "d"
        if type(pair) is not list or len(pair) != 2:
            raise WireError("dict items must be [key, value] pairs")
        out[_dec(pair[0], depth + 1)] = _dec(pair[1], depth + 1)
    return out


# -- requests: trusted -> untrusted ---------------------------------------------------------------------------
def pack_request(call_id: int, fn: str, args: tuple, kwargs: dict) -> bytes:
    """One call as length-prefixed marshal data; `WireError` when an argument is not plain data."""
    import marshal

    dump_text((args, kwargs))  # the same exact-type check as answers (marshal alone would take more types)
    try:
        body = marshal.dumps((call_id, fn, args, kwargs))
    except ValueError as e:
        raise WireLimit(f"cannot encode: {e}") from None
    if len(body) > MAX_MESSAGE_BYTES:
        raise WireLimit(f"arguments over {MAX_MESSAGE_BYTES} bytes")
    return len(body).to_bytes(4, "big") + body
