"""The torch adapter: writing tensors and decoding to torch views (skipped without torch)."""

from __future__ import annotations

import io
import pickle
import warnings
from typing import Any

import numpy as np
import pytest

import dssst1
from dssst1 import ErrorCode

from .helpers import code_of, header_of
from .test_vectors import VECTORS, files_of

torch = pytest.importorskip("torch")

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
}


def raw(t: Any) -> bytes:
    """A tensor's C-order bytes."""
    flat = t.detach().resolve_conj().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes())


def rand_tensor(dtype: Any, shape: tuple[int, ...]) -> Any:
    gen = torch.Generator().manual_seed(7)
    size = int(np.prod(shape)) if shape else 1
    if dtype is torch.bool:
        return torch.randint(0, 2, (size,), generator=gen).bool().reshape(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    data = torch.randint(0, 256, (size * itemsize,), dtype=torch.uint8, generator=gen)
    return data.view(dtype).reshape(shape)


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("name", list(DTYPES))
def test_every_dtype_both_ways(name: str, shape: tuple[int, ...]) -> None:
    t = rand_tensor(DTYPES[name], shape)
    frame = dssst1.dumps({"t": t})
    assert header_of(frame)["t"]["dtype"] == name
    out = dssst1.loads(bytearray(frame), tensors="torch")["t"]
    assert out.dtype == t.dtype and tuple(out.shape) == shape
    assert raw(out) == raw(t)
    arr = dssst1.loads(frame)["t"]  # the NumPy view of the same bytes
    assert arr.shape == shape and arr.tobytes() == raw(t)


def test_grad_noncontiguous_and_views() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    param = torch.nn.Parameter(torch.ones(3))
    value = {
        "grad": base.clone().requires_grad_(True) * 2,
        "param": param,
        "t": base.t(),
        "step": base[:, ::2],
        "conj": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
        "scalar": torch.tensor(1.5),
        "shared": (base, base[1:3]),
    }
    out = dssst1.loads(dssst1.dumps(value), tensors="torch")
    assert torch.equal(out["grad"], base * 2) and not out["grad"].requires_grad
    assert torch.equal(out["param"], torch.ones(3))
    assert torch.equal(out["t"], base.t().contiguous())
    assert torch.equal(out["step"], base[:, ::2].contiguous())
    assert torch.equal(out["conj"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert out["scalar"].shape == () and out["scalar"].item() == 1.5
    assert torch.equal(out["shared"][1], base[1:3])


def test_contiguous_tensors_are_not_copied_by_the_streaming_writer() -> None:
    t = torch.arange(1000, dtype=torch.int64)
    parts = dssst1.iter_frame({"t": t})
    (buf,) = parts.buffers
    assert np.frombuffer(buf, np.uint8).ctypes.data == t.data_ptr()


def test_decode_is_zero_copy() -> None:
    frame = bytearray(
        dssst1.dumps({"a": np.arange(64, dtype=np.float32), "b": np.ones((2, 3), np.int64)})
    )
    start = np.frombuffer(frame, np.uint8).ctypes.data
    out = dssst1.loads(frame, tensors="torch")
    for t in out.values():
        assert start <= t.data_ptr() < start + len(frame)
    out["a"][0] = 5.0
    assert dssst1.loads(frame)["a"][0] == 5.0


def test_read_only_input_decodes_without_warnings() -> None:
    frame = dssst1.dumps({"a": np.arange(8, dtype=np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = dssst1.loads(frame, tensors="torch")
    assert out["a"].tolist() == list(range(8))


def test_misaligned_tensors_are_copied() -> None:
    (vector,) = [v for v in VECTORS if v["id"] == "nw-misaligned-offsets"]
    frame = bytearray(files_of(vector)[0])
    out = dssst1.loads(frame, tensors="torch")
    assert out["b"].tolist() == [1.5, -2.0] and out["c"].tolist() == [2**40]
    start = np.frombuffer(frame, np.uint8).ctypes.data
    assert not start <= out["c"].data_ptr() < start + len(frame)  # the copy
    assert out["c"].data_ptr() % 8 == 0


def test_python_values_and_flags_in_torch_mode() -> None:
    value = {"nan": float("nan"), "b": b"xy", "t": (torch.zeros(0, 3), [1, "s"])}
    out = dssst1.loads(dssst1.dumps(value), tensors="torch")
    assert out["nan"] != out["nan"] and out["b"] == b"xy"
    assert out["t"][0].shape == (0, 3) and out["t"][1] == [1, "s"]


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if v["valid"] and v["kind"] == "frame"], ids=lambda v: v["id"]
)
def test_valid_frame_vectors_decode_to_torch_like_numpy(vector: dict[str, Any]) -> None:
    data = files_of(vector)[0]
    limits = dssst1.Limits(**vector["limits"]) if vector.get("limits") else None
    as_numpy = dssst1.loads(data, limits=limits)
    as_torch = dssst1.loads(data, tensors="torch", limits=limits)

    def check(a: Any, b: Any) -> None:
        if isinstance(a, np.ndarray):
            assert (
                isinstance(b, torch.Tensor) and tuple(b.shape) == a.shape and raw(b) == a.tobytes()
            )
        elif isinstance(a, dict):
            assert list(a) == list(b)
            for key in a:
                check(a[key], b[key])
        elif isinstance(a, list | tuple):
            assert type(a) is type(b) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                check(x, y)
        else:
            assert repr(a) == repr(b)

    check(as_numpy, as_torch)


def test_torch_save_and_pickles_are_refused() -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buf)
    assert code_of(dssst1.loads, buf.getvalue()) == ErrorCode.ZIP_REFUSED
    assert code_of(dssst1.loads, pickle.dumps(torch.ones(3))) == ErrorCode.PICKLE_REFUSED


def test_unsupported_torch_tensors() -> None:
    assert (
        code_of(dssst1.dumps, {"x": torch.zeros(2, dtype=torch.complex128)})
        == ErrorCode.UNSUPPORTED_TYPE
    )
    sparse = torch.zeros(3, 3).to_sparse()
    assert code_of(dssst1.dumps, {"x": sparse}) == ErrorCode.UNSUPPORTED_TYPE
    meta = torch.zeros(3, device="meta")
    assert code_of(dssst1.dumps, [meta]) == ErrorCode.UNSUPPORTED_TYPE
