"""JSON envelopes (DSSST1.md §9): inline base64 payloads and result chunk events."""

from __future__ import annotations

import base64
import hashlib

import numpy as np

from tests import v1ref

from .chunk_groups import INNER, INNER_OBJ
from .common import Vector, add


def envelopes() -> None:
    value = {"loss": np.array(0.25, dtype=np.float32), "metrics": {"num_tokens": 12}}
    frame_bytes = v1ref.dumps(value)
    inline = {
        "content_type": "application/octet-stream",
        "encoding": "base64",
        "wire_format": "DSSST1",
        "payload_b64": base64.b64encode(frame_bytes).decode(),
    }
    add(
        Vector(
            "env-inline",
            "envelope",
            "v1-writer",
            "§9 inline result",
            "an inline base64 result envelope",
            inline,
            expected=value,
        )
    )
    chunks = v1ref.encode_byte_chunks(INNER, kind="result", max_bytes=8192 + 1500, force_chunk=True)

    def event(c: bytes, sha: str | None = "") -> dict[str, str]:
        e = {"type": "result_chunk", "payload_b64": base64.b64encode(c).decode()}
        if sha is not None:
            e["payload_sha256"] = sha or hashlib.sha256(c).hexdigest()
        return e

    add(
        Vector(
            "env-result-chunk-events",
            "envelope",
            "v1-writer",
            "§9 result chunk event",
            "result_chunk events with payload_sha256",
            [event(c) for c in chunks],
            expected=INNER_OBJ,
        )
    )
    add(
        Vector(
            "env-result-chunk-events-no-sha",
            "envelope",
            "v1-writer",
            "§9 result chunk event",
            "result_chunk events without the optional payload_sha256",
            [event(c, None) for c in chunks],
            expected=INNER_OBJ,
        )
    )
    add(
        Vector(
            "envbad-base64",
            "envelope",
            "hand-built",
            "§9 base64_invalid",
            'payload_b64 "Y===" decodes under no base64 decoder, strict or lenient',
            {**inline, "payload_b64": "Y==="},
            error_code="base64_invalid",
        )
    )
    b64 = inline["payload_b64"]
    assert "=" in b64 and len(b64) > 152
    wrapped = "\n".join(b64[i : i + 76] for i in range(0, len(b64), 76))
    add(
        Vector(
            "envbad-base64-line-breaks",
            "envelope",
            "hand-built",
            "§9 base64_invalid",
            "the env-inline payload_b64 wrapped at 76 characters (MIME style): a newline is "
            "not in the alphabet, so strict decoding refuses it (a lenient decoder skips it)",
            {**inline, "payload_b64": wrapped},
            error_code="base64_invalid",
        )
    )
    add(
        Vector(
            "envbad-base64-no-padding",
            "envelope",
            "hand-built",
            "§9 base64_invalid",
            "the env-inline payload_b64 with its trailing = padding removed",
            {**inline, "payload_b64": b64.rstrip("=")},
            error_code="base64_invalid",
        )
    )
    add(
        Vector(
            "envbad-event-sha",
            "envelope",
            "hand-built",
            "§9 result chunk event",
            "the second event's payload_sha256 is not the SHA-256 of its chunk frame",
            [event(chunks[0]), event(chunks[1], "0" * 64), *map(event, chunks[2:])],
            error_code="chunk_checksum_mismatch",
        )
    )
