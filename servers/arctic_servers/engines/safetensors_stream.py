"""A safetensors file written tensor by tensor, and read back tensor by tensor.

`safetensors.torch.save_file` builds the file's bytes in memory before writing them (a second
copy of every tensor, more than once over), and `load_file` reads the whole file into new
tensors; for a weight sync through /dev/shm of a 2 GB model that was 4 GB more on the trainer
and 2 GB more on the sampler. `write` lays the header out first (offsets from the shapes) and
then writes each tensor's own bytes; `read` yields each tensor as its reader takes it (a
memory-mapped view, copied by the one who keeps it). The files are ordinary safetensors files.

No torch at import: the embedded model builder (`tiny_model.py`) writes NumPy arrays with it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# torch / NumPy dtype name -> safetensors dtype
DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}  # fmt: skip
ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1}  # fmt: skip


def write(
    path: Path,
    specs: Iterable[tuple[str, str, tuple[int, ...]]],
    buffers: Iterable[Any],
    metadata: dict[str, str] | None = None,
) -> int:
    """Write a file whose tensors are `specs` (name, dtype name, shape), in order, and whose
    bytes are `buffers` (one per spec, produced as they are written: anything `memoryview`
    takes, a contiguous NumPy array for one); the bytes written."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    off = 0
    sizes = []
    for name, dtype, shape in specs:
        st = DTYPES[dtype]
        n = ITEMSIZE[st] * math.prod(shape)
        header[name] = {"dtype": st, "shape": list(shape), "data_offsets": [off, off + n]}
        sizes.append(n)
        off += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with path.open("wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        wrote = 0
        for buf, n in zip(buffers, sizes, strict=True):
            view = memoryview(buf).cast("B")
            if len(view) != n:
                raise ValueError(f"a buffer of {len(view)} bytes for a tensor of {n}")
            f.write(view)
            wrote += n
    return 8 + len(head) + wrote


def write_torch(path: Path, tensors: dict[str, Any]) -> int:
    """`write` of torch tensors (CPU, any dtype: their own bytes, no copy of a contiguous one)."""
    import torch

    def raw(t: torch.Tensor) -> Any:
        return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()

    specs = [(n, str(t.dtype).split(".")[-1], tuple(t.shape)) for n, t in tensors.items()]
    return write(path, specs, (raw(t) for t in tensors.values()))


def read_torch(path: str) -> Iterator[tuple[str, Any]]:
    """(name, tensor) of a safetensors file, one at a time (each read when it is reached)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            yield name, f.get_tensor(name)
