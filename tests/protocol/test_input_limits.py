"""The shared input limits (rules/limits.py) and the body checker's string and number rules
(arctic_sdk.spec.body_check): each hostile value of issue 14 is a 4xx naming its field."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import descriptor_pool

import arctic_sdk.spec.pb.arctic.v1 as _pb  # noqa: F401
from arctic_sdk.spec.body_check import BodyError, check_body, leftover_error
from arctic_servers.rules import limits
from arctic_servers.rules.errors import ProtocolError

POOL = descriptor_pool.Default()


def _code(fn: object, *args: object) -> tuple[str, dict[str, object]]:
    with pytest.raises(ProtocolError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code, info.value.details


@pytest.mark.parametrize(
    ("text", "code", "field"),
    [
        ("[" * 100_000 + "]" * 100_000, "invalid_json", None),
        ('{"a": ' + "[" * 65 + "]" * 65 + "}", "invalid_json", "a" + "[0]" * 63),
        ('{"\\ud800": 1}', "invalid_argument", "\\ud800"),
        ('{"a": ["\\udfff"]}', "invalid_argument", "a[0]"),
        ('{"lr": NaN}', "invalid_argument", "lr"),
        ('{"lr": -Infinity}', "invalid_argument", "lr"),
        ('{"lr": 1e999}', "invalid_argument", "lr"),
        ('{"lr": 1' + "0" * 400 + "}", "invalid_argument", "lr"),
        ('{"seed": 18446744073709551616}', "invalid_argument", "seed"),
        ("not json", "invalid_json", None),
    ],
)
def test_load_json_refuses(text: str, code: str, field: str | None) -> None:
    got, details = _code(limits.load_json, text.encode(), 64)
    assert got == code
    if field is not None:
        assert details["field"] == field


def test_load_json_refuses_bad_utf8() -> None:
    assert _code(limits.load_json, b'{"a": "\xff"}', 64)[0] == "invalid_json"


def test_load_json_takes_what_fields_hold() -> None:
    ok = '{"a": [1, -9223372036854775808, 18446744073709551615, 0.5, "\\ud83d\\ude00", true]}'
    assert limits.load_json(ok.encode(), 64)["a"][4] == "\U0001f600"


def test_check_value_walks_dssst1_values() -> None:
    arr = np.full((2, 2), np.nan, np.float32)  # tensors are the ops' to check, not the walker's
    limits.check_value({"x": arr, "n": np.int64(3)}, 64)
    assert _code(limits.check_value, {"t": np.float32("nan")}, 64)[1]["field"] == "t"
    assert _code(limits.check_value, {"s": [{"k": math.inf}]}, 64)[1]["field"] == "s[0].k"


@pytest.mark.parametrize(
    ("raw", "ok"),
    [("1", 1), (str(2**63 - 1), 2**63 - 1), (str(2**63), None), ("0", None), ("+1", None),
     (" 1", None), ("1_0", None), ("\u0661", None), ("1e3", None), ("9" * 400, None)],
)  # fmt: skip
def test_seq_header(raw: str, ok: int | None) -> None:
    if ok is None:
        assert _code(limits.check_seq, raw)[1]["field"] == "X-Arctic-Seq"
    else:
        assert limits.check_seq(raw) == ok


@pytest.mark.parametrize(
    "headers",
    [
        {"idempotency-key": "é"},
        {"idempotency-key": "k" * 256},
        {"idempotency-key": "\udce9"},  # a latin-1 byte as aiohttp decodes it
        {"x-arctic-sub-job": "job\x00"},
        {"x-arctic-job-id": ""},
    ],
)
def test_id_headers(headers: dict[str, str]) -> None:
    assert _code(limits.check_headers, headers)[0] == "invalid_argument"


def test_id_headers_accept_uuids() -> None:
    limits.check_headers({"idempotency-key": "0d4f3c1e-6a7b-4c1d-9f10-1b2c3d4e5f60" * 7})


@pytest.mark.parametrize(
    "header", ["Bearer éè", "Bearer \udce9\udce8", "Bearer a b", "Bearer " + "a" * 5000]
)
def test_bearer_tokens_are_printable_ascii(header: str) -> None:
    assert _code(limits.bearer_token, header)[0] == "unauthenticated"


def test_sub_jobs_limit() -> None:
    body = {"sub_job_configs": [{}] * 17}
    assert _code(limits.check_sub_jobs, body, 16)[1]["limit"] == 16
    limits.check_sub_jobs({"sub_job_configs": [{}] * 16}, 16)


# ---------------------------------------------------------------------------- the body checker


def _check(msg: str, body: dict[str, object]) -> BodyError:
    with pytest.raises(BodyError) as info:
        check_body(POOL.FindMessageTypeByName(msg), body)
    return info.value


@pytest.mark.parametrize(
    ("msg", "body", "path"),
    [
        ("arctic.v1.StepRequest", {"learning_rate": math.nan}, "learning_rate"),
        ("arctic.v1.StepRequest", {"learning_rate": 10**400}, "learning_rate"),
        ("arctic.v1.SubJobConfig", {"seed": 2**63}, "seed"),
        ("arctic.v1.SubJobConfig", {"seed": -(2**63) - 1}, "seed"),
        ("arctic.v1.SamplingParams", {"temperature": math.nan}, "temperature"),
        ("arctic.v1.SamplingParams", {"top_p": math.inf}, "top_p"),
        ("arctic.v1.DeleteCheckpointRequest", {"checkpoint_id": "../j/victim"}, "checkpoint_id"),
        ("arctic.v1.DeleteCheckpointRequest", {"checkpoint_id": "a" * 129}, "checkpoint_id"),
        ("arctic.v1.DownloadCheckpointFileRequest",
         {"checkpoint_id": "c", "filename": "../x"}, "filename"),
    ],
)  # fmt: skip
def test_body_check_refuses(msg: str, body: dict[str, object], path: str) -> None:
    err = _check(msg, body)
    assert (err.code, err.path) == ("invalid_argument", path)


def test_required_checkpoint_id() -> None:
    desc = POOL.FindMessageTypeByName("arctic.v1.ExportCheckpointRequest")
    err = leftover_error(desc, check_body(desc, {}))
    assert err is not None and (err.code, err.path) == ("missing_field", "checkpoint_id")
    # a misspelt required field is reported as the unknown field it is
    desc = POOL.FindMessageTypeByName("arctic.v1.LoadCheckpointRequest")
    found = check_body(desc, {"checkpoint": "x"})
    assert found.unknown == ["checkpoint"]
    err = leftover_error(desc, found)
    assert err is not None and err.code == "invalid_argument" and err.path == "checkpoint"
