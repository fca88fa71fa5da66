# The call server that runs INSIDE the jail, next to the untrusted candidate (stdlib only).
#
# It is not imported: `calls.py` writes `_wire.py`'s text followed by this file's text into the jail as
# server.py, so `encode`, `dumps`, `loads`, `decode` and `WireError` below come from `_wire.py`.
#
# Protocol, one JSON document per line: the server keeps private copies of its stdin/stdout, points fd 0
# at /dev/null and fd 1 at stderr (the candidate's prints cannot corrupt the channel by accident), runs
# candidate.py, then says {"id": 0, "ready": [callable names]} (or "raised" when loading failed). Each
# request {"id": n, "fn": name, "args": [...], "kwargs": [[k, v], ...]} gets one answer: {"id": n, "ok":
# value}, {"id": n, "raised": [exception type names (its MRO), message]} or {"id": n, "fault": why}.
#
# NOTE: nothing here is trusted. The candidate can rewrite this loop, write to the channel itself or
# answer anything: the trusted side only ever gets plain data, decodes it itself, and decides.
import os as _os

_rfd = _os.dup(0)
_wfd = _os.dup(1)
_null = _os.open("/dev/null", _os.O_RDONLY)
_os.dup2(_null, 0)
_os.close(_null)
_os.dup2(2, 1)
_reader = _os.fdopen(_rfd, "rb")


def _send(msg):
    data = (dumps(msg) + "\n").encode("utf-8", "surrogatepass")  # noqa: F821
    view = memoryview(data)
    while view:
        n = _os.write(_wfd, view)
        view = view[n:]


def _safe_str(e):
    try:
        return str(e)[:2000]
    except BaseException:  # noqa: BLE001 - a candidate's __str__ may raise anything
        return "<unprintable exception>"


def _mro_names(e):
    try:
        return [str(c.__name__)[:100] for c in type(e).__mro__][:20]
    except BaseException:  # noqa: BLE001
        return ["BaseException"]


_g = {"__name__": "__main__", "__builtins__": __builtins__}
try:
    with open("candidate.py", encoding="utf-8") as _f:
        _src = _f.read()
    exec(compile(_src, "candidate.py", "exec"), _g)
except BaseException as _e:  # noqa: BLE001 - HumanEval reports every exception, SystemExit included
    _send({"id": 0, "raised": [_mro_names(_e), _safe_str(_e)]})
    _os._exit(0)
_send({"id": 0, "ready": sorted(k for k, v in list(_g.items()) if type(k) is str and callable(v))})

while True:
    _line = _reader.readline(MAX_MESSAGE_BYTES + 1)  # noqa: F821
    if not _line:
        _os._exit(0)
    _req = loads(_line)  # noqa: F821
    _id = _req["id"]
    _fn = _g.get(_req["fn"])
    if not callable(_fn):
        _send({"id": _id, "raised": [["NameError", "Exception"], f"name {_req['fn']!r} is not defined"]})
        continue
    _args = decode(_req["args"])  # noqa: F821
    _kwargs = dict(decode(_req["kwargs"]))  # noqa: F821
    try:
        _out = _fn(*_args, **_kwargs)
    except BaseException as _e:  # noqa: BLE001
        _send({"id": _id, "raised": [_mro_names(_e), _safe_str(_e)]})
        continue
    try:
        _msg = {"id": _id, "ok": encode(_out)}  # noqa: F821
        _send(_msg)
    except WireError as _e:  # noqa: F821
        _send({"id": _id, "fault": f"returned {_e}"})
    except RecursionError:
        _send({"id": _id, "fault": "returned data too deeply nested to encode"})
    del _out
