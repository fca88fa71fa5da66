"""The plain-data codec: exact round trips, and nothing but builtin values out of whatever the sender writes."""

from __future__ import annotations

import collections
import math

import pytest

from rollwise.sandbox._wire import WireError, decode, dump_text, loads, pack_request


def roundtrip(v):
    return decode(loads(dump_text(v)))


@pytest.mark.parametrize("v", [
    None, True, False, 0, -7, 10**200, 1.5, -0.0, 1e308, "", "héllo → 世界\n\"\\", "\ud800", b"\x00\xff", [],
    [1, [2, [3]]], (1, "a"), (), {"a": 1, 2: [3], (1, 2): None, None: b"x"}, {1, 2}, frozenset({"a"}), 3 + 4j,
    [True, 1, 1.0], {True: 1, 2: 2},
])
def test_plain_values_round_trip_exactly(v):
    out = roundtrip(v)
    assert out == v and type(out) is type(v)
    if isinstance(v, (list, tuple)):
        assert [type(x) for x in out] == [type(x) for x in v]  # True stays a bool, 1.0 a float


def test_non_finite_floats_round_trip():
    assert math.isnan(roundtrip(float("nan"))) and roundtrip(float("inf")) == float("inf")
    assert roundtrip(float("-inf")) == float("-inf") and roundtrip(complex(1, float("inf"))) == complex(1, float("inf"))


def test_collections_dicts_arrive_as_plain_dicts():
    for v in (collections.Counter("aab"), collections.OrderedDict(a=1), collections.defaultdict(int, a=1)):
        out = roundtrip(v)
        assert type(out) is dict and out == dict(v)


class EqInt(int):
    def __eq__(self, other):
        return True

    __hash__ = int.__hash__


class EqDict(dict):
    def __eq__(self, other):
        return True


class EqAll:
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("v", [EqInt(3), EqDict(a=1), EqAll(), [EqAll()], (x for x in []), iter([]), print, int,
                               {"k": EqAll()}, bytearray(b"x"), range(3), memoryview(b"x")])
def test_anything_else_is_refused(v):
    with pytest.raises(WireError, match="not plain data"):
        dump_text(v)


def test_depth_and_size_and_long_ints_are_bounded():
    deep = []
    for _ in range(500):
        deep = [deep]
    with pytest.raises(WireError, match="deeper than"):
        dump_text(deep)
    with pytest.raises(WireError, match="deeper than"):
        decode(loads("[" * 150 + "]" * 150))
    with pytest.raises(WireError, match="cannot encode"):
        dump_text(10 ** 5000)
    with pytest.raises(WireError, match="over"):
        loads(b"1" * ((16 << 20) + 1))


@pytest.mark.parametrize("text", ['{"t": 1}', '{"x": [1]}', '{"d": [[1]]}', '{"s": [[1]]}', '{"b": "zz"}',
                                  '{"c": [1, "a"]}', '{"t": [1], "d": []}', '{"b": 5}', '[1, {"q": 2}]'])
def test_forged_messages_decode_to_plain_data_or_fail(text):
    with pytest.raises(WireError):
        decode(loads(text))


def test_requests_refuse_non_data_arguments():
    assert pack_request(1, "f", (1, [2]), {"k": "v"})[:4] != b""
    with pytest.raises(WireError):
        pack_request(1, "f", (EqAll(),), {})
