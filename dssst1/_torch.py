"""The torch adapter: DSSST1 dtypes <-> torch dtypes, tensor views for readers, bytes for writers.

This module imports torch only inside its functions; nothing imports it unless a caller decodes
with ``tensors="torch"`` or encodes a value that already holds a ``torch.Tensor`` (which means
torch is imported already).

Decoding: each tensor is a ``torch.frombuffer`` view on the frame buffer (zero-copy), reshaped.
Two documented exceptions: a tensor whose bytes are not aligned in memory to its item size is
copied (torch kernels assume aligned data), and a zero-element tensor is a fresh empty tensor.
torch has no read-only tensors: views on a read-only buffer (``bytes``) must not be written to;
decode a ``bytearray`` for writable tensors. torch warns once per view of a read-only buffer;
the reader silences that one warning with ``warnings.catch_warnings``, which (before Python
3.14) changes the process-wide filters for the duration of the decode.

Encoding: the tensor is detached and brought to the CPU; contiguous CPU tensors are not copied
(the frame's memoryview shares their memory), others are made contiguous with one copy.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from ._errors import DSSError, ErrorCode
from ._format import DTYPE_ITEMSIZE
from ._header import Entry
from ._numpy import TensorBytes
from ._tree import MakeTensor

__all__ = [
    "is_torch_tensor",
    "quiet_readonly",
    "tensor_bytes",
    "torch_dtypes",
    "torch_factory",
]

_NOT_WRITABLE = "The given buffer is not writable"


def is_torch_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor, without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


@cache
def torch_dtypes() -> dict[str, Any]:
    """DSSST1 dtype name -> torch dtype (imports torch)."""
    import torch

    return {
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


@cache
def _names_by_dtype() -> dict[Any, str]:
    return {dtype: name for name, dtype in torch_dtypes().items()}


def tensor_bytes(tensor: Any, path: str) -> TensorBytes:
    """The DSSST1 dtype, shape and C-order bytes of a torch tensor (see the module docstring)."""
    import torch

    name = _names_by_dtype().get(tensor.dtype)
    if name is None:
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, path, "a tensor of a DSSST1 dtype", f"{tensor.dtype}"
        )
    try:
        data = tensor.detach()
        if data.layout != torch.strided:
            raise DSSError(
                ErrorCode.UNSUPPORTED_TYPE, path, "a dense (strided) tensor", f"{data.layout}"
            )
        if data.device.type != "cpu":
            data = data.cpu()
        if data.is_conj():
            data = data.resolve_conj()
        if data.is_neg():
            data = data.resolve_neg()
        if not data.is_contiguous():
            data = data.contiguous()
        shape = list(data.shape)
        flat = data.reshape(-1).view(torch.uint8).numpy()
    except DSSError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        # e.g. a meta tensor, or a tensor subclass without storage
        raise DSSError(
            ErrorCode.UNSUPPORTED_TYPE, path, "a tensor with CPU-readable storage", str(exc)
        ) from exc
    return name, shape, memoryview(flat)


def torch_factory(buffer: memoryview) -> MakeTensor:
    """A tensor factory that returns torch views on ``buffer``; call it inside `quiet_readonly`.

    Raises ``ImportError`` with an install hint when torch is not installed.
    """
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'dssst1: tensors="torch" needs PyTorch (pip install "arctic-sdk[torch]")'
        ) from exc

    dtypes = torch_dtypes()
    frombuffer = torch.frombuffer
    empty = torch.empty
    base = 0
    if len(buffer):
        with quiet_readonly(buffer):
            base = frombuffer(buffer, dtype=torch.uint8, count=1).data_ptr()

    def make(entry: Entry) -> Any:
        dtype, shape, offset, nbytes = entry
        tdtype = dtypes[dtype]
        if nbytes == 0:
            return empty(shape, dtype=tdtype)
        itemsize = DTYPE_ITEMSIZE[dtype]
        if (base + offset) % itemsize:
            copied = bytearray(buffer[offset : offset + nbytes])
            return frombuffer(copied, dtype=tdtype).view(shape)
        flat = frombuffer(buffer, dtype=tdtype, count=nbytes // itemsize, offset=offset)
        return flat.view(shape)

    return make


@contextmanager
def quiet_readonly(buffer: memoryview) -> Iterator[None]:
    """Silence torch's "buffer is not writable" warning while decoding a read-only buffer.

    The views are documented as read-only by contract (see the module docstring); the warning
    would otherwise fire once per tensor (and fail test suites that turn warnings into errors).
    """
    if not buffer.readonly:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _NOT_WRITABLE, UserWarning)
        yield
