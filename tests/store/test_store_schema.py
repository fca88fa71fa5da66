from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollwise.store.schema import (
    COLUMNS,
    ROLLOUT_SCHEMA,
    SCHEMA_VERSION,
    rollout_to_row,
    row_to_rollout,
    rows_to_table,
    shard_schema_version,
    table_to_rollouts,
)
from rollwise.types import ROLLOUT_STATUSES, Rollout

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
finite = st.floats(allow_nan=False)
json_scalar = st.one_of(st.none(), st.booleans(), int64, finite, st.text(max_size=8))
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def rollouts(draw) -> Rollout:
    n = draw(st.integers(0, 12))
    return Rollout(
        prompt_id=draw(st.text(max_size=10)),
        group_id=draw(st.text(max_size=10)),
        sample_index=draw(int32),
        prompt_token_ids=draw(st.lists(int32, max_size=10)),
        completion_token_ids=draw(st.lists(int32, min_size=n, max_size=n)),
        logprobs=draw(st.lists(finite, min_size=n, max_size=n)),
        weight_versions=draw(st.lists(int64, min_size=n, max_size=n)),
        loss_mask=draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)),
        text=draw(st.text(max_size=20)),
        finish_reason=draw(st.sampled_from([None, "stop", "length", "abort"])),
        reward=draw(st.one_of(st.none(), st.floats(allow_nan=False))),
        reward_parts=draw(st.dictionaries(st.text(max_size=6), finite, max_size=3)),
        advantage=draw(st.one_of(st.none(), finite)),
        status=draw(st.sampled_from(ROLLOUT_STATUSES)),
        status_reason=draw(st.text(max_size=10)),
        timings=draw(st.dictionaries(st.text(max_size=6), finite, max_size=3)),
        env_info=draw(st.dictionaries(st.text(max_size=6), json_value, max_size=3)),
        seed=draw(st.one_of(st.none(), int64)),
        step=draw(st.integers(0, 2**40)),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(rollouts(), max_size=4))
def test_round_trip_through_arrow_is_exact(rs):
    table = rows_to_table([rollout_to_row(r, run="run") for r in rs])
    assert table.schema.equals(ROLLOUT_SCHEMA, check_metadata=True)
    assert table_to_rollouts(table) == rs


def test_round_trip_keeps_every_field(rollout_factory):
    r = rollout_factory(step=3, group=1, sample=2, env_info={"turns": 2, "tool_calls": [{"name": "py", "ok": True}]})
    row = rollout_to_row(r, run="myrun", prompt_text="1+2=", token_texts=list("abcde"))
    assert set(row) == set(COLUMNS)
    assert row["run"] == "myrun" and row["num_generated"] == 5 and row["token_texts"] == list("abcde")
    assert row_to_rollout(row) == r


def test_step_argument_overrides_rollout_step(rollout_factory):
    row = rollout_to_row(rollout_factory(step=0), run="r", step=7)
    assert row["step"] == 7 and row_to_rollout(row).step == 7


def test_schema_version_is_in_metadata():
    assert shard_schema_version(ROLLOUT_SCHEMA) == SCHEMA_VERSION
    assert shard_schema_version(pa.schema([("a", pa.int32())])) is None


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(logprobs=[0.0]), "logprobs has 1 entries for 5 completion tokens"),
        (dict(loss_mask=[1, 1]), "loss_mask has 2 entries"),
        (dict(weight_versions=[]), "weight_versions has 0 entries"),
        (dict(status="ok"), "status 'ok' is not one of"),
        (dict(env_info={"obj": object()}), "env_info is not JSON-serialisable"),
    ],
)
def test_bad_rollouts_fail_with_one_line(rollout_factory, change, message):
    with pytest.raises(ValueError, match=message) as e:
        rollout_to_row(rollout_factory(**change), run="r")
    assert "\n" not in str(e.value) and "s0-g0/0" in str(e.value)


def test_token_texts_must_match_tokens(rollout_factory):
    with pytest.raises(ValueError, match="2 token texts for 5 completion tokens"):
        rollout_to_row(rollout_factory(), run="r", token_texts=["a", "b"])


def test_wrong_element_types_fail_with_one_line(rollout_factory):
    r = rollout_factory(logprobs=["-0.1", -0.2, -0.3, -0.4, -0.5])
    with pytest.raises(ValueError, match="do not fit the rollout schema") as e:
        rows_to_table([rollout_to_row(r, run="r")])
    assert "\n" not in str(e.value)


def test_numpy_values_are_accepted(rollout_factory):
    np = pytest.importorskip("numpy")
    r = rollout_factory(
        completion_token_ids=np.arange(5, dtype=np.int64).tolist(),
        logprobs=list(np.linspace(-1, 0, 5, dtype=np.float32)),
        prompt_token_ids=np.array([1, 2], dtype=np.int32),
    )
    (back,) = table_to_rollouts(rows_to_table([rollout_to_row(r, run="r")]))
    assert back.prompt_token_ids == [1, 2] and back.logprobs == [float(x) for x in r.logprobs]
