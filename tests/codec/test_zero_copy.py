"""Zero-copy reading and writing: views on the frame, views of the arrays' own memory."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

import dssst1
from dssst1 import ErrorCode

from .helpers import code_of, same


def test_decode_is_zero_copy_and_read_only_for_bytes() -> None:
    value = {"a": np.arange(100, dtype=np.float32), "b": np.arange(6, dtype=np.int64).reshape(2, 3)}
    frame = dssst1.dumps(value)
    base = np.frombuffer(frame, np.uint8)
    out = dssst1.loads(frame)
    for arr in out.values():
        assert np.shares_memory(arr, base)
        assert not arr.flags.writeable
    writable = bytearray(frame)
    out = dssst1.loads(writable)
    assert np.shares_memory(out["a"], np.frombuffer(writable, np.uint8))
    out["a"][0] = 42
    assert dssst1.loads(writable)["a"][0] == 42
    out = dssst1.loads(memoryview(writable)[:])
    assert np.shares_memory(out["b"], np.frombuffer(writable, np.uint8))


def test_decode_from_mmap(tmp_path: Any) -> None:
    frame = dssst1.dumps({"w": np.arange(1000, dtype=np.float64)})
    path = tmp_path / "f.dss"
    path.write_bytes(frame)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        out = dssst1.loads(mm)
        assert out["w"][999] == 999.0 and not out["w"].flags.writeable
        del out


def test_iter_frame_hands_out_the_arrays_own_memory() -> None:
    a = np.arange(1000, dtype=np.int64)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # non-contiguous: copied once
    parts = dssst1.iter_frame({"a": a, "b": b, "e": np.zeros(0)}, metadata={"k": "v"})
    bufs = list(parts)
    assert bufs[0] == parts.header
    assert parts.nbytes == sum(memoryview(x).nbytes for x in bufs)
    assert any(np.shares_memory(np.frombuffer(x, np.uint8), a) for x in parts.buffers)
    assert not any(np.shares_memory(np.frombuffer(x, np.uint8), b) for x in parts.buffers)
    assert all(memoryview(x).nbytes for x in parts.buffers)  # empty tensors contribute no buffer
    joined = b"".join(bufs)
    assert (
        joined
        == parts.tobytes()
        == dssst1.dumps({"a": a, "b": b, "e": np.zeros(0)}, metadata={"k": "v"})
    )


def test_reader_inputs() -> None:
    frame = dssst1.dumps({"x": np.arange(3, dtype=np.int16)})
    arr_input = np.frombuffer(frame, np.uint8)
    assert same(dssst1.loads(arr_input)["x"], np.arange(3, dtype=np.int16))
    for bad in ["text", 5, None, [1, 2], memoryview(bytearray(frame))[::2]]:
        assert code_of(dssst1.loads, bad) == ErrorCode.UNSUPPORTED_TYPE
    assert code_of(dssst1.loads, frame, tensors="jax") == ErrorCode.UNSUPPORTED_TYPE
