"""Every golden vector of tests/vectors/index.json, run as tests/vectors/README.md says."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

import dssst1
from tests.v1ref.typed import canonical, to_typed

VECTOR_DIR = Path(__file__).resolve().parents[1] / "vectors"
INDEX = json.loads((VECTOR_DIR / "index.json").read_text())
VECTORS: list[dict[str, Any]] = INDEX["vectors"]


def limits_of(vector: dict[str, Any]) -> dssst1.Limits | None:
    return dssst1.Limits(**vector["limits"]) if vector.get("limits") else None


def files_of(vector: dict[str, Any]) -> list[bytes]:
    return [(VECTOR_DIR / name).read_bytes() for name in vector["files"]]


def run_vector(vector: dict[str, Any]) -> tuple[Any, Any]:
    """Decode a vector the README's way: the value and the op metadata (``None`` if n/a)."""
    limits = limits_of(vector)
    if vector["kind"] == "frame":
        (data,) = files_of(vector)
        return dssst1.loads(data, limits=limits), dssst1.read_metadata(data, limits=limits)
    if vector["kind"] == "chunks":
        frames = files_of(vector)
        if len(frames) == 1 and dssst1.read_chunk_descriptor(frames[0]) is None:
            return dssst1.loads(frames[0], limits=limits), None  # passthrough
        assembler = dssst1.ChunkAssembler(vector["chunk_kind"], limits=limits)
        for chunk in frames:
            assembler.feed(chunk)
        frame = assembler.finish()
        assert hashlib.sha256(frame).hexdigest() == vector.get(
            "frame_sha256", hashlib.sha256(frame).hexdigest()
        )
        return dssst1.loads(frame, limits=limits), None
    envelope = json.loads((VECTOR_DIR / vector["files"][0]).read_text())
    if isinstance(envelope, dict):
        return dssst1.loads(dssst1.decode_inline_envelope(envelope), limits=limits), None
    return dssst1.loads(dssst1.assemble_result_events(envelope, limits=limits), limits=limits), None


def test_the_index_is_the_expected_format() -> None:
    assert INDEX["format"] == "dssst1-golden-vectors/1"
    assert len(VECTORS) >= 100
    codes = {v["error_code"] for v in VECTORS if not v["valid"]}
    reader_codes = {c.value for c in dssst1.ErrorCode} - {
        "dict_key_not_string",
        "unsupported_type",
        "chunk_too_large",
    }
    assert reader_codes - codes <= {"frame_size_mismatch"} | set(), reader_codes - codes


@pytest.mark.parametrize("vector", [v for v in VECTORS if v["valid"]], ids=lambda v: v["id"])
def test_valid_vector(vector: dict[str, Any]) -> None:
    value, op = run_vector(vector)
    assert canonical(to_typed(value)) == canonical(vector["expected"])
    if op is not None:
        assert canonical(to_typed(op)) == canonical(vector.get("expected_op", {"dict": []}))


@pytest.mark.parametrize("vector", [v for v in VECTORS if not v["valid"]], ids=lambda v: v["id"])
def test_invalid_vector(vector: dict[str, Any]) -> None:
    with pytest.raises(dssst1.DSSError) as info:
        run_vector(vector)
    allowed = {vector["error_code"], *vector.get("alt_error_codes", ())}
    assert info.value.code.value in allowed, str(info.value)


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if v["kind"] == "chunks"], ids=lambda v: v["id"]
)
def test_chunk_vectors_through_decode_chunks(vector: dict[str, Any]) -> None:
    """`decode_chunks` (the all-at-once form) agrees with the assembler on every group."""
    limits = limits_of(vector)
    frames = files_of(vector)
    if vector["valid"]:
        frame = dssst1.decode_chunks(frames, kind=vector["chunk_kind"], limits=limits)
        value = dssst1.loads(frame, limits=limits)
        assert canonical(to_typed(value)) == canonical(vector["expected"])
        # order independence: the reversed delivery gives the same frame
        assert dssst1.decode_chunks(frames[::-1], kind=vector["chunk_kind"], limits=limits) == frame
    else:
        with pytest.raises(dssst1.DSSError) as info:
            dssst1.loads(dssst1.decode_chunks(frames, kind=vector["chunk_kind"], limits=limits))
        assert info.value.code.value in {vector["error_code"], *vector.get("alt_error_codes", ())}
