# The call server that runs INSIDE the jail, next to the untrusted candidate (stdlib only).
#
# It is not imported: `calls.py` writes `_wire.py`'s text followed by this file's text into the jail as
# server.py, so `dump_text`, `MAX_MESSAGE_BYTES` and `WireError` below come from `_wire.py`.
#
# Protocol: the server keeps private copies of its stdin/stdout, points fd 0 at /dev/null and fd 1 at
# stderr (the candidate's prints cannot corrupt the channel by accident), runs candidate.py, then says
# {"id": 0, "ready": [callable names]} (or "raised" when loading failed). Each request, marshal data
# (id, name, args, kwargs) behind a 4-byte length, gets one answer, a JSON line: {"id": n, "ok": value},
# {"id": n, "raised": [exception type names (its MRO), message]} or {"id": n, "fault": why}.
#
# NOTE: nothing here is trusted. The candidate can rewrite this loop, write to the channel itself or
# answer anything: the trusted side only ever gets plain data, decodes it itself, and decides.
import marshal as _marshal
import os as _os

_rfd = _os.dup(0)
_wfd = _os.dup(1)
_null = _os.open("/dev/null", _os.O_RDONLY)
_os.dup2(_null, 0)
_os.close(_null)
_os.dup2(2, 1)
_reader = _os.fdopen(_rfd, "rb")


def _send(text):
    data = (text + "\n").encode("ascii")
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
    _send('{"id":0,"raised":' + dump_text([_mro_names(_e), _safe_str(_e)]) + "}")  # noqa: F821
    _os._exit(0)
_send('{"id":0,"ready":' + dump_text(sorted(str(k) for k, v in list(_g.items()) if type(k) is str and callable(v))) + "}")  # noqa: F821


def _read(n):
    buf = b""
    while len(buf) < n:
        chunk = _reader.read(n - len(buf))
        if not chunk:
            _os._exit(0)
        buf += chunk
    return buf


while True:
    _n = int.from_bytes(_read(4), "big")
    if _n > MAX_MESSAGE_BYTES:  # noqa: F821
        _os._exit(0)
    _id, _name, _args, _kwargs = _marshal.loads(_read(_n))
    _fn = _g.get(_name)
    if not callable(_fn):
        _send(f'{{"id":{int(_id)},"raised":' + dump_text([["NameError", "Exception"], f"name {_name!r} is not defined"]) + "}")  # noqa: F821
        continue
    try:
        _out = _fn(*_args, **_kwargs)
    except BaseException as _e:  # noqa: BLE001
        _send(f'{{"id":{int(_id)},"raised":' + dump_text([_mro_names(_e), _safe_str(_e)]) + "}")  # noqa: F821
        continue
    try:
        _text = f'{{"id":{int(_id)},"ok":' + dump_text(_out) + "}"  # noqa: F821
    except WireError as _e:  # noqa: F821
        _text = f'{{"id":{int(_id)},"fault":' + dump_text(f"returned {_e}") + "}"  # noqa: F821
    except RecursionError:
        _text = f'{{"id":{int(_id)},"fault":"returned data too deeply nested to encode"}}'
    del _out
    _send(_text)
