"""Declared sizes are checked before anything is allocated (DSSST1.md §6, §7)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, resource
    import numpy as np
    import dssst1

    def frame(header, data=b""):
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return len(text).to_bytes(8, "little") + text + data

    def meta(tree):
        return {"dss": json.dumps({"v": "DSSST1", "tree": tree})}

    def entry(dtype, shape, offsets):
        return {"dtype": dtype, "shape": shape, "data_offsets": offsets}

    tree = meta(["t", "x"])
    cases = {
        # 2^40 one-byte elements that the frame does not hold
        "offsets_invalid": frame({"__metadata__": tree, "x": entry("U8", [2**40], [0, 2**40])}),
        # 2^40 eight-byte elements declared over an 8-byte range
        "tensor_size_mismatch": frame(
            {"__metadata__": tree, "x": entry("I64", [2**20, 2**20], [0, 8])}, bytes(8)
        ),
        # a header length of 2^40
        "header_too_large": (2**40).to_bytes(8, "little") + b"{}",
    }
    descriptor = {"chunk_idx": 0, "total_chunks": 2**16, "frame_sha256": "0" * 64,
                  "frame_size_bytes": 2**40}
    chunk = dssst1.dumps({"payload": np.zeros(2**14, np.uint8)},
                         metadata={"request_chunk": descriptor})

    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    try:
        bytearray(2 << 30)
    except MemoryError:
        pass
    else:
        raise SystemExit("the address-space limit is not in force")
    for code, data in cases.items():
        try:
            dssst1.loads(data)
        except dssst1.DSSError as exc:
            assert exc.code == code, (code, str(exc))
        else:
            raise SystemExit(f"{code}: accepted")
    try:
        dssst1.ChunkAssembler("request").feed(chunk)
    except dssst1.DSSError as exc:
        assert exc.code == "frame_too_large", str(exc)
    print("ok")
    """
)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS semantics are Linux's")
def test_declared_2_pow_40_elements_are_refused_under_a_1_gib_address_space() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
