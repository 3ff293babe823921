"""Base64 envelopes for JSON transports (DSSST1.md §9)."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import numpy as np
import pytest

import dssst1
from dssst1 import ErrorCode

from .helpers import code_of, same

VALUE = {"loss": np.array(0.25, np.float32), "logprobs": np.arange(2000, dtype=np.float32)}
FRAME = dssst1.dumps(VALUE)


def test_inline_roundtrip_is_plain_json() -> None:
    env = dssst1.inline_envelope(FRAME)
    assert json.loads(json.dumps(env)) == env
    assert env["content_type"] == "application/octet-stream"
    assert env["encoding"] == "base64" and env["wire_format"] == "DSSST1"
    assert dssst1.decode_inline_envelope(env) == FRAME
    assert same(dssst1.loads(dssst1.decode_inline_envelope(env)), VALUE)


@pytest.mark.parametrize(
    "env,code",
    [
        ("not a dict", ErrorCode.BASE64_INVALID),
        (
            {"wire_format": "DSSST2", "encoding": "base64", "payload_b64": ""},
            ErrorCode.UNSUPPORTED_VERSION,
        ),
        ({"encoding": "base64", "payload_b64": "AAAA"}, ErrorCode.UNSUPPORTED_VERSION),
        (
            {"wire_format": "DSSST1", "encoding": "hex", "payload_b64": "AAAA"},
            ErrorCode.BASE64_INVALID,
        ),
        ({"wire_format": "DSSST1", "encoding": "base64"}, ErrorCode.BASE64_INVALID),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": 5},
            ErrorCode.BASE64_INVALID,
        ),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": "Y==="},
            ErrorCode.BASE64_INVALID,
        ),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": "AAA"},
            ErrorCode.BASE64_INVALID,
        ),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": "AA AA"},
            ErrorCode.BASE64_INVALID,
        ),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": "AA\nAA"},
            ErrorCode.BASE64_INVALID,
        ),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": "AA-_"},
            ErrorCode.BASE64_INVALID,
        ),
        (
            {"wire_format": "DSSST1", "encoding": "base64", "payload_b64": "ÄÄÄÄ"},
            ErrorCode.BASE64_INVALID,
        ),
    ],
)
def test_inline_errors(env: Any, code: ErrorCode) -> None:
    assert code_of(dssst1.decode_inline_envelope, env) == code


def test_result_chunk_events_roundtrip() -> None:
    chunks = dssst1.encode_chunks(FRAME, kind="result", max_bytes=2048)
    events = [dssst1.result_chunk_event(c) for c in chunks]
    assert all(e["type"] == "result_chunk" for e in events)
    assert events[0]["payload_sha256"] == hashlib.sha256(chunks[0]).hexdigest()
    assert [dssst1.decode_result_chunk_event(e) for e in events] == chunks
    progress = {"type": "progress", "message": "half", "fraction": 0.5}
    frame = dssst1.assemble_result_events([progress, *events[::-1]])
    assert bytes(frame) == FRAME
    no_sha = [{k: v for k, v in e.items() if k != "payload_sha256"} for e in events]
    assert bytes(dssst1.assemble_result_events(no_sha)) == FRAME
    upper = [dict(e, payload_sha256=e["payload_sha256"].upper()) for e in events]
    assert bytes(dssst1.assemble_result_events(upper)) == FRAME


def test_result_chunk_event_errors() -> None:
    (chunk,) = dssst1.encode_chunks(FRAME, kind="result", max_bytes=1 << 20)
    event = dssst1.result_chunk_event(chunk)
    other = hashlib.sha256(b"other").hexdigest()
    cases: list[tuple[Any, ErrorCode]] = [
        (dict(event, payload_sha256=other), ErrorCode.CHUNK_CHECKSUM_MISMATCH),
        (dict(event, payload_sha256="abc"), ErrorCode.CHUNK_DESCRIPTOR_INVALID),
        (dict(event, payload_sha256=7), ErrorCode.CHUNK_DESCRIPTOR_INVALID),
        (dict(event, type="result"), ErrorCode.CHUNK_DESCRIPTOR_INVALID),
        (dict(event, payload_b64="@@@@"), ErrorCode.BASE64_INVALID),
        ([event], ErrorCode.BASE64_INVALID),
    ]
    for bad, code in cases:
        assert code_of(dssst1.decode_result_chunk_event, bad) == code, bad
    request = dssst1.encode_chunks(FRAME, kind="request", max_bytes=1 << 20)[0]
    request_event = {"type": "result_chunk", "payload_b64": base64.b64encode(request).decode()}
    assert code_of(dssst1.assemble_result_events, [request_event]) == ErrorCode.CHUNK_KIND_MISMATCH
    assert code_of(dssst1.assemble_result_events, []) == ErrorCode.CHUNK_MISSING
    chunks = dssst1.encode_chunks(FRAME, kind="result", max_bytes=2048)
    partial = [dssst1.result_chunk_event(c) for c in chunks[1:]]
    assert code_of(dssst1.assemble_result_events, partial) == ErrorCode.CHUNK_MISSING
