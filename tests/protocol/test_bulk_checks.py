"""The one-pass checks of long scalar lists (a prompt's token ids): the body checker, the input
limits and the sampler's prompt check take a list of plain ints in one pass, and must still find,
and name by index, a bad item anywhere in a long list — the same error the per-item walk gives."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import descriptor_pool

import arctic_sdk.spec.pb.arctic.v1 as _pb  # noqa: F401
from arctic_sdk.spec import value_rules
from arctic_sdk.spec.body_check import BodyError, check_body
from arctic_servers.engines import checks
from arctic_servers.rules import limits
from arctic_servers.rules.errors import ProtocolError

GENERATE = descriptor_pool.Default().FindMessageTypeByName("arctic.v1.GenerateRequest")
LONG = 3000


def _prompt(bad: object, at: int = 2500) -> list[object]:
    ids: list[object] = [7] * LONG
    ids[at] = bad
    return ids


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (True, "expected an integer, got bool"),
        ("7", "expected an integer, got str"),
        (1.5, "expected an integer, got float"),
        (None, "expected an integer, got NoneType"),
        (2**63, "outside an int64"),
        (-(2**63) - 1, "outside an int64"),
    ],
)
def test_body_check_names_the_bad_token_deep_in_a_long_prompt(bad: object, says: str) -> None:
    body = {"prompts": [[1, 2, 3], _prompt(bad)]}
    with pytest.raises(BodyError) as info:
        check_body(GENERATE, body)
    assert "[2500]" in info.value.path
    assert says in info.value.text


def test_body_check_takes_numpy_ints_and_long_plain_lists() -> None:
    ids = [int(i) % 500 for i in range(LONG)]
    check_body(GENERATE, {"prompts": [ids, [np.int64(3), np.int32(4)], "text"]})


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (2**64, "prompts[1][2500]"),
        (-(2**63) - 1, "prompts[1][2500]"),
        (math.nan, "prompts[1][2500]"),
        (math.inf, "prompts[1][2500]"),
        ("\ud800", "prompts[1][2500]"),
    ],
)
def test_input_limits_name_the_bad_item_deep_in_a_long_list(bad: object, field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        limits.check_value({"prompts": [[1], _prompt(bad)]}, 32)
    assert info.value.code == "invalid_argument"
    assert info.value.details["field"] == field


def test_input_limits_check_a_float_list_item_by_item_when_one_is_not_finite() -> None:
    values = [0.5] * LONG
    limits.check_value({"x": values}, 32)
    values[2999] = -math.inf
    with pytest.raises(ProtocolError) as info:
        limits.check_value({"x": values}, 32)
    assert info.value.details["field"] == "x[2999]"


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (500, "token id 500 is outside [0, 500)"),
        (-1, "token id -1 is outside [0, 500)"),
        (True, "neither a non-empty string nor a non-empty list of token ids"),
        (3.0, "neither a non-empty string nor a non-empty list of token ids"),
    ],
)
def test_sampler_prompt_check_names_the_bad_token(bad: object, says: str) -> None:
    with pytest.raises(ProtocolError) as info:
        checks.prompts({"prompts": [[1], _prompt(bad)]}, vocab=500)
    assert info.value.details["field"] == "prompts[1]"
    assert says in str(info.value)


def test_sampler_prompt_check_returns_plain_lists() -> None:
    got = checks.prompts({"prompts": [(1, 2), np.array([3, 4]), [np.int64(5)], "hi"]}, vocab=10)
    assert got == [[1, 2], [3, 4], [5], "hi"]
    assert all(type(t) is int for p in got[:3] for t in p)
    assert checks.prompts({"prompts": [[10**12]]}, vocab=0) == [[10**12]]


def test_plain_ints_within_is_exact_at_the_edges() -> None:
    assert value_rules.plain_ints_within([], 0, 1)
    assert value_rules.plain_ints_within([0, 1], 0, 1)
    assert not value_rules.plain_ints_within([0, 2], 0, 1)
    assert not value_rules.plain_ints_within([False], 0, 1)  # a bool is not a token id
    assert not value_rules.plain_ints_within([np.int64(0)], 0, 1)  # numpy: item by item
    assert value_rules.plain_floats_finite([0.0, -1e308])
    assert not value_rules.plain_floats_finite([0.0, math.nan])
    assert not value_rules.plain_floats_finite([1])  # an int: item by item


def test_a_long_prompt_batch_is_not_walked_item_by_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 prompts x 1,024 token ids: the per-item walk cost about 0.6 s on each side of a call
    (2.3 us a token); the body checker now visits each prompt once, not each token."""
    from arctic_sdk.spec import body_check

    seen = 0
    single = body_check._Walker.single

    def counting(self: body_check._Walker, *args: object) -> None:
        nonlocal seen
        seen += 1
        single(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(body_check._Walker, "single", counting)
    body = {"prompts": [[(i * 7 + j) % 400 for j in range(1024)] for i in range(256)]}
    check_body(GENERATE, body)
    assert seen <= 2 * 256, seen
    body["prompts"][3][1000] = np.int64(5)  # one prompt is checked item by item
    seen = 0
    check_body(GENERATE, body)
    assert 1024 <= seen <= 2 * 256 + 1024, seen
