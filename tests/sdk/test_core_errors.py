"""Error bodies -> typed exceptions: the spec's shape and every deployed one."""

from __future__ import annotations

import json
import pickle
import types

import pytest

import arctic_sdk
from arctic_sdk import errors as E
from arctic_sdk._core.errors_parse import parse_error, retry_after, to_exception
from arctic_sdk.spec.tables.error_codes import ERRORS

DEPLOYED_NESTED = {
    "code": "517604",
    "message": (
        "Cortex training forwardBackward failed: ZMD returned 409: "
        '{"detail":{"code":"chunk_group_restart_required","message":"request chunk group state '
        'is missing; restart from chunk 0","chunk_group_id":"group-a","received_chunk":1,'
        '"expected_start_chunk":0}}'
    ),
}


def test_spec_error_body() -> None:
    body = {
        "error": {
            "code": "shape_mismatch",
            "message": "field context.advantages: bad",
            "details": {"field": "context.advantages"},
        }
    }
    p = parse_error(json.dumps(body).encode(), 400)
    assert (p.code, p.details["field"]) == ("shape_mismatch", "context.advantages")
    exc = to_exception(p, status=400, op="forward-backward", request_id="r9")
    assert isinstance(exc, E.BadRequestError) and isinstance(exc, E.UserError)
    assert exc.user_fault and not exc.retryable
    text = str(exc)
    assert "shape_mismatch" in text and "context.advantages" in text and "r9" in text


def test_json_nested_in_a_string_message() -> None:
    p = parse_error(json.dumps(DEPLOYED_NESTED).encode(), 409)
    assert p.code == "chunk_group_restart_required"
    assert p.details["chunk_group_id"] == "group-a"
    assert isinstance(to_exception(p, status=409), E.ChunkGroupRestartRequiredError)
    # The body on the exception has the nested JSON decoded where it was a whole document.
    assert p.body["code"] == "517604"


def test_doubly_nested_and_legacy_missing_chunks() -> None:
    inner = json.dumps(
        {
            "detail": {
                "message": "request chunk group is missing chunks",
                "chunk_group_id": "g",
                "missing_chunks": [0, 1],
            }
        }
    )
    outer = {"message": "gateway: " + json.dumps({"message": "backend: " + inner})}
    p = parse_error(json.dumps(outer), 409)
    assert p.code == "chunk_group_missing_chunks"
    assert p.details["missing_chunks"] == [0, 1]
    assert isinstance(to_exception(p, status=409), E.ChunkGroupMissingChunksError)


@pytest.mark.parametrize(
    ("body", "status", "code", "cls", "needle"),
    [
        (
            {"detail": [{"loc": ["body", "x"], "msg": "field required", "type": "missing"}]},
            422,
            "invalid_argument",
            E.UserError,
            "x: field required",
        ),
        (
            {"detail": {"code": "job_not_found", "message": "no job 7"}},
            404,
            "job_not_found",
            E.NotFoundError,
            "no job 7",
        ),
        (
            {"detail": "Not authenticated"},
            401,
            "unauthenticated",
            E.AuthenticationError,
            "Not authenticated",
        ),
        ({"message": "conflict", "code": 409}, 409, "", E.ConflictError, "conflict"),
        ({"message": "slow down", "code": 429}, 429, "rate_limited", E.RateLimitError, "slow"),
        ("<html>502 Bad Gateway</html>", 502, "", E.TransientError, "Bad Gateway"),
        ({"error": "boom"}, 500, "internal", E.InternalServerError, "boom"),
        (
            {"error": {"code": "unavailable", "message": "draining"}},
            503,
            "unavailable",
            E.ServiceUnavailableError,
            "draining",
        ),
    ],
)
def test_deployed_shapes(body: object, status: int, code: str, cls: type, needle: str) -> None:
    raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    p = parse_error(raw, status)
    assert p.code == code
    exc = to_exception(p, status=status)
    assert isinstance(exc, cls)
    assert needle in str(exc)


def test_every_code_has_a_class_consistent_with_the_table() -> None:
    for code, info in ERRORS.items():
        exc = E.error_from_code(code, "m")
        assert exc.status == info.http_status
        assert exc.user_fault == info.user_fault
        assert exc.retryable == info.retryable
        assert isinstance(exc, E.UserError) == info.user_fault or code == "rate_limited"


def test_failed_request_variant_is_both_and_pickles() -> None:
    exc = E.error_from_code("dtype_mismatch", "bad dtype", request_id="r1", failed=True)
    assert isinstance(exc, E.BadRequestError) and isinstance(exc, E.RequestFailedError)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and back.request_id == "r1" and back.code == "dtype_mismatch"
    plain = pickle.loads(pickle.dumps(E.ChunkGroupConflictError("x", details={"a": 1})))
    assert isinstance(plain, E.ChunkGroupConflictError) and plain.details == {"a": 1}


def test_retry_after_header_date_and_details() -> None:
    assert retry_after({"retry-after": "3"}) == 3.0
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert retry_after({}, {"retry_after_s": 1.5}) == 1.5
    assert retry_after({"retry-after": "soon"}) is None


def test_redaction_of_secrets_in_messages_and_bodies() -> None:
    body = {
        "error": {
            "code": "unauthenticated",
            "message": "token tok-SECRET is not accepted",
            "details": {"echo": "Bearer tok-SECRET"},
        }
    }
    exc = to_exception(
        parse_error(json.dumps(body), 401),
        status=401,
        redact=lambda s: s.replace("tok-SECRET", "***"),
    )
    assert "tok-SECRET" not in str(exc) + repr(exc) + json.dumps(exc.body) + repr(exc.details)


def test_public_names_and_modules() -> None:
    for name in arctic_sdk.__all__:
        obj = getattr(arctic_sdk, name)
        if isinstance(obj, type):
            assert obj.__module__ == "arctic_sdk", name
    exported = set(arctic_sdk.__all__)
    for name in E.__all__:
        if name[0].isupper():
            assert name in exported, f"{name} is public in arctic_sdk.errors but not exported"
    public = {
        n
        for n, v in vars(arctic_sdk).items()
        if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert public <= exported, public - exported
