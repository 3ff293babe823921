"""Both compatibility rules of DSSST1.md against `tests.v1ref`, the model of the deployed codec.

* old → new: every frame the deployed writer produces decodes here to what the deployed reader
  yields (where the deployed reader fails — a user tensor named ``__dss_empty__`` — ours returns
  the value the writer was given);
* new → old: every frame written here decodes in the deployed reader to the same value, except the
  documented equivalents of §5.4: a non-finite ``float`` arrives as a 0-dim float64 array and
  ``bytes`` as a 1-D uint8 array holding the same bits.
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dssst1
from tests import v1ref
from tests.v1ref.typed import canonical, to_typed

from .test_roundtrip import DTYPES, rand_array

_arrays = st.builds(
    rand_array,
    st.sampled_from(list(DTYPES.values())),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.integers(0, 2**16),
)
_keys = st.sampled_from(["a", "b", "a.b", "0", "", "x.y.z", "__root__", "__metadata__", "k"])


def _values(leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda kids: (
            st.lists(kids, max_size=3)
            | st.lists(kids, max_size=3).map(tuple)
            | st.dictionaries(keys, kids, max_size=3)
        ),
        max_leaves=10,
    )


#: Values our writer accepts (bytes and non-finite floats included, string keys only).
new_values = _values(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | _arrays,
    _keys,
)

#: Values the deployed writer accepts (JSON-able leaves; int keys only where no tensor is below).
old_values = _values(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5)
    | _arrays,
    _keys | st.integers(0, 3),
)


def v1_equivalent(value: Any) -> Any:
    """What the deployed reader yields for a value our writer encoded (§5.4 equivalents)."""
    if type(value) is float and not math.isfinite(value):
        return np.array(value, dtype=np.float64)
    if isinstance(value, bytes | bytearray):
        return np.frombuffer(bytes(value), dtype=np.uint8)
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, np.ndarray):
        return value.astype(value.dtype.newbyteorder("<"), order="C")
    if isinstance(value, dict):
        return {k: v1_equivalent(v) for k, v in value.items()}
    if isinstance(value, list):
        return [v1_equivalent(v) for v in value]
    if isinstance(value, tuple):
        return tuple(v1_equivalent(v) for v in value)
    return value


def typed(value: Any) -> str:
    return canonical(to_typed(value))


def _has_int_key_over_tensor(value: Any) -> bool:
    if isinstance(value, dict):
        has = any(isinstance(v, np.ndarray) or _contains_array(v) for v in value.values())
        if has and any(not isinstance(k, str) for k in value):
            return True
        return any(_has_int_key_over_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_int_key_over_tensor(v) for v in value)
    return False


def _contains_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, dict):
        return any(_contains_array(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_contains_array(v) for v in value)
    return False


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    new_values, st.none() | st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), max_size=2)
)
def test_new_to_old(value: Any, metadata: Any) -> None:
    frame = dssst1.dumps(value, metadata=metadata)
    assert typed(v1ref.loads(frame)) == typed(v1_equivalent(value))
    assert v1ref.read_metadata(frame) == (metadata or {})


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old_values)
def test_old_to_new(value: Any) -> None:
    if _has_int_key_over_tensor(value):
        with pytest.raises(v1ref.V1WireError):
            v1ref.dumps(value)
        return
    frame = v1ref.dumps(value)
    try:
        ours = dssst1.loads(frame)
    except dssst1.DSSError as exc:
        # a tensor at the path __metadata__ repeats the header key: refused by R8 (DSSST1.md §6)
        assert exc.code is dssst1.ErrorCode.HEADER_DUPLICATE_KEY
        assert frame.count(b'"__metadata__":') == 2
        return
    try:
        theirs = v1ref.loads(frame)
    except KeyError:  # the deployed reader drops a user tensor named __dss_empty__
        assert b"__dss_empty__" in frame
        return
    assert typed(ours) == typed(theirs)
    assert typed(dssst1.loads(frame, tensors="numpy")) == typed(theirs)


@pytest.mark.parametrize(
    "value",
    [
        {"a.b": np.array([1]), "a": {"b": np.array([2])}},  # deployed path collision
        {"__dss_empty__": np.array([5], np.int16), "x": 1},  # deployed vanishing tensor
        {"t": (1, (2,)), "d": {1: "int key"}, "n": float("nan")},  # deployed lossy JSON leaves
        np.array(3, np.float32),
        [],
    ],
    ids=["collision", "dss-empty", "lossy-json", "zero-dim", "empty"],
)
def test_deployed_hazard_frames_decode(value: Any) -> None:
    frame = v1ref.dumps(value)
    ours = dssst1.loads(frame)
    try:
        assert typed(ours) == typed(v1ref.loads(frame))
    except KeyError:
        assert typed(ours) == typed(value)


@settings(max_examples=60, deadline=None)
@given(
    st.binary(min_size=1, max_size=3000),
    st.integers(1, 4000),
    st.sampled_from(["request", "result"]),
    st.none() | st.sampled_from(["forward-backward", "fwd-bwd", "generate"]),
)
def test_old_chunks_to_new(payload: bytes, max_bytes: int, kind: str, operation: Any) -> None:
    frame = v1ref.dumps({"blob": np.frombuffer(payload, np.uint8)})
    try:
        chunks = v1ref.encode_byte_chunks(
            frame, kind=kind, operation=operation, max_bytes=max_bytes, force_chunk=True
        )
    except v1ref.V1WireError:
        return  # max_bytes too small for the deployed writer
    out = dssst1.decode_chunks(chunks[::-1], kind=kind)  # type: ignore[arg-type]
    assert out == frame
    assembler = dssst1.ChunkAssembler(kind)  # type: ignore[arg-type]
    results = [assembler.feed(c) for c in chunks]
    assert results[-1] is not None and bytes(results[-1]) == frame
    if len(chunks) == 1 and max_bytes >= len(frame):
        unchunked = v1ref.encode_byte_chunks(frame, kind=kind, max_bytes=max_bytes)
        assert dssst1.decode_chunks(unchunked) == frame  # passthrough


@settings(max_examples=60, deadline=None)
@given(
    st.binary(min_size=1, max_size=3000),
    st.integers(700, 4000),
    st.sampled_from(["request", "result"]),
    st.booleans(),
)
def test_new_chunks_to_old(payload: bytes, max_bytes: int, kind: str, checksum: bool) -> None:
    frame = dssst1.dumps({"blob": np.frombuffer(payload, np.uint8)})
    chunks = dssst1.encode_chunks(
        frame,
        kind=kind,
        max_bytes=max_bytes,
        operation="generate",
        checksum=checksum,  # type: ignore[arg-type]
    )
    assert all(len(c) <= max_bytes for c in chunks)
    assert v1ref.decode_byte_chunks(chunks, kind=kind) == frame
    assert v1ref.decode_byte_chunks(chunks[::-1], kind=kind) == frame


def test_envelopes_both_ways() -> None:
    value = {"loss": np.array(0.25, np.float32), "metrics": {"num_tokens": 12}}
    frame = dssst1.dumps(value)
    assert typed(v1ref.decode_envelope(dssst1.inline_envelope(frame))) == typed(
        v1_equivalent(value)
    )
    chunks = dssst1.encode_chunks(frame, kind="result", max_bytes=400)
    events = [dssst1.result_chunk_event(c) for c in chunks]
    assert typed(v1ref.decode_envelope(events)) == typed(v1_equivalent(value))
    old_frame = v1ref.dumps(value)
    old_chunks = v1ref.encode_byte_chunks(
        old_frame, kind="result", max_bytes=8500, force_chunk=True
    )
    old_events = [
        {
            "type": "result_chunk",
            "payload_b64": base64.b64encode(c).decode(),
            "payload_sha256": hashlib.sha256(c).hexdigest(),
        }
        for c in old_chunks
    ]
    assert typed(dssst1.loads(dssst1.assemble_result_events(old_events))) == typed(
        v1ref.loads(old_frame)
    )
    inline = {
        "content_type": "application/octet-stream",
        "encoding": "base64",
        "wire_format": "DSSST1",
        "payload_b64": base64.b64encode(old_frame).decode(),
    }
    assert dssst1.decode_inline_envelope(inline) == old_frame
