"""The generated request-rule table against the proto options, and the bound check itself."""

from __future__ import annotations

import math

import pytest
from google.protobuf.descriptor import Descriptor

from arctic_sdk.spec.model import Bound
from arctic_sdk.spec.pb.arctic.v1 import options_pb2, training_pb2
from arctic_sdk.spec.tables import methods as M
from arctic_sdk.spec.tables.request_rules import BOUNDS, BY_OP
from arctic_sdk.spec.value_rules import bound_error


def _declared(desc: Descriptor, prefix: str = "") -> set[str]:
    """Paths of every bounded field under `desc`, read from the descriptors, not the table."""
    out = set()
    for fd in desc.fields:
        opts = fd.GetOptions().Extensions[options_pb2.field]
        if any(opts.HasField(n) for n in ("ge", "gt", "le", "lt")):
            out.add(prefix + fd.name)
        mt = fd.message_type
        if mt is not None and not fd.is_repeated and mt.file.package == "arctic.v1":
            out |= _declared(mt, prefix + fd.name + ".")
    return out


def test_table_matches_the_options() -> None:
    for desc in (
        training_pb2.GenerateRequest.DESCRIPTOR,
        training_pb2.SamplingParams.DESCRIPTOR,
        training_pb2.StepRequest.DESCRIPTOR,
    ):
        assert {b.path for b in BOUNDS[desc.full_name]} == _declared(desc)
    assert BY_OP[M.STEP.name] == BOUNDS[M.STEP.request_type]
    assert {m.name for m in M.METHODS if m.request_type in BOUNDS} == set(BY_OP)


def test_bound_text_and_holds() -> None:
    top_p = Bound("top_p", gt=0.0, le=1.0)
    assert top_p.bounds == "in (0, 1]"
    assert Bound("n", ge=1.0).bounds == ">= 1"
    assert Bound("x", lt=0.5).bounds == "< 0.5"
    assert top_p.holds(1.0) and not top_p.holds(0.0) and not top_p.holds(math.nan)


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ({"sampling_params": {"top_p": 1.5}}, ("sampling_params.top_p", "1.5 is not in (0, 1]")),
        ({"sampling_params": {"n": 0, "top_p": 2}}, ("sampling_params.n", "0 is not >= 1")),
        ({"sampling_params": {"top_k": -2}}, ("sampling_params.top_k", "-2 is not >= -1")),
        (
            {"sampling_params": {"max_tokens": "8"}},
            ("sampling_params.max_tokens", "'8' is not >= 1"),
        ),
        ({"sampling_params": {"n": True}}, ("sampling_params.n", "True is not >= 1")),
    ],
)
def test_bound_error_names_field_value_and_bound(
    body: dict[str, object], want: tuple[str, str]
) -> None:
    got = bound_error(BOUNDS[M.GENERATE.request_type], body)
    assert got is not None and got[:2] == want


def test_absent_null_and_in_range_pass() -> None:
    rules = BOUNDS[M.GENERATE.request_type]
    assert bound_error(rules, {}) is None
    assert bound_error(rules, {"sampling_params": None}) is None
    assert bound_error(rules, {"sampling_params": {"top_p": None, "n": 2, "min_p": 0}}) is None
    lr = bound_error(BOUNDS[M.STEP.request_type], {"learning_rate": -1e-9})
    assert lr == ("learning_rate", "-1e-09 is not >= 0", "a finite number >= 0")
