#!/usr/bin/env python3
"""Generate the DSSST1 golden vectors in ``tests/vectors/`` (see tests/vectors/README.md).

Deterministic: fixed values, no randomness, no timestamps, index fields in a fixed order, so running
it twice writes identical bytes. ``--check`` regenerates into a temporary directory and exits 1
when anything differs from the committed files.

Frames come from three sources, recorded per vector as ``origin``:

* ``v1-writer``  -- ``tests.v1ref.dumps`` / ``encode_byte_chunks``: exactly what the deployed writer
  emits (hazards included);
* ``new-writer`` -- built here byte by byte the way DSSST1.md §5 tells a conforming writer to;
* ``hand-built`` -- built here byte by byte to pin one reader rule (valid) or one reader check
  (invalid).

This script never imports ``dssst1``: the vectors must not depend on the codec they test.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import pickle
import shutil
import struct
import sys
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import v1ref  # noqa: E402
from tests.v1ref.typed import canonical, to_typed  # noqa: E402

VECTOR_DIR = REPO / "tests" / "vectors"
HAND_WRITTEN = frozenset({"README.md"})  # files in VECTOR_DIR this script does not generate
_UNSET: Any = object()
NAN, INF = float("nan"), float("inf")
#: ``N mod 65536`` of the header lengths whose little-endian bytes start with a pickle opcode
#: (80 02 .. 80 05): 640, 896, 1152, 1408. DSSST1.md §5.1: a new writer never emits one.
PICKLE_LIKE_N = frozenset(0x80 | (p << 8) for p in range(2, 6))
MAX_HEADER = 64 * 1024 * 1024


def pickle_like(n: int) -> bool:
    return n % 65536 in PICKLE_LIKE_N


@dataclass
class Vector:
    id: str
    kind: str  # "frame" | "chunks" | "envelope"
    origin: str  # "v1-writer" | "new-writer" | "hand-built"
    spec_ref: str
    description: str
    payload: Any  # frame bytes | list of chunk-frame bytes | envelope JSON value
    expected: Any = _UNSET  # the decoded Python value (valid vectors)
    error_code: str | None = None  # invalid vectors
    alt_error_codes: tuple[str, ...] = ()
    expected_op: Any = _UNSET  # op metadata of a valid frame, when it has one
    expected_v1: Any = _UNSET  # valid: what the deployed reader yields when it differs
    v1_error: str | None = None  # valid: the exception class the deployed reader raises
    chunk_kind: str | None = None
    limits: dict[str, int] | None = None


VECTORS: list[Vector] = []


def add(vec: Vector) -> None:
    if any(v.id == vec.id for v in VECTORS):
        raise ValueError(f"duplicate vector id {vec.id}")
    VECTORS.append(vec)


# --------------------------------------------------------------------------- frame building


class Raw(str):
    """JSON text inserted into a header verbatim (for duplicate keys, NaN, broken JSON...)."""

    __slots__ = ()


def js(obj: Any) -> str:
    """Standard, compact JSON (what a DSSST1.md §5 writer emits)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dss(tree: Any, v: Any = "DSSST1") -> str:
    return js({"v": v, "tree": tree})


def hdr(*fields: tuple[str, Any]) -> str:
    """A header object from ``(key, value)`` pairs, in order; duplicates allowed."""
    return "{" + ",".join(f"{js(k)}:{v if isinstance(v, Raw) else js(v)}" for k, v in fields) + "}"


def blob(
    header: str | bytes, data: bytes = b"", *, pad: bool = True, n: int | None = None
) -> bytes:
    """``N`` + header (+ spaces to a multiple of 8 when ``pad``) + data; ``n`` overrides ``N``.

    ``pad`` pads as DSSST1.md §5.1 tells a writer: to a multiple of 8, and 8 more spaces when
    ``N mod 65536`` would be 640, 896, 1152 or 1408 (a pickle-like prefix).
    """
    hb = header.encode("utf-8") if isinstance(header, str) else header
    if pad:
        hb += b" " * (-len(hb) % 8)
        if pickle_like(len(hb)):
            hb += b" " * 8
    return (len(hb) if n is None else n).to_bytes(8, "little") + hb + data


def entry(arr: np.ndarray, begin: int) -> dict[str, Any]:
    return {
        "dtype": v1ref.dtype_name(arr.dtype),
        "shape": list(arr.shape),
        "data_offsets": [begin, begin + arr.nbytes],
    }


def layout(
    tensors: Sequence[tuple[str, np.ndarray]], *, spec_order: bool = True
) -> tuple[list[tuple[str, Any]], bytes]:
    """Header entries and data section; DSSST1.md §5.1 order (item size desc, then name)."""
    items = sorted(tensors, key=lambda t: (-t[1].dtype.itemsize, t[0])) if spec_order else tensors
    entries: list[tuple[str, Any]] = []
    data = b""
    for name, arr in items:
        entries.append((name, entry(arr, len(data))))
        data += np.ascontiguousarray(arr).tobytes()
    return entries, data


def frame(
    tree: Any,
    tensors: Sequence[tuple[str, np.ndarray]],
    *,
    op: Any = None,
    extra_meta: dict[str, str] | None = None,
    pad: bool = True,
    spec_order: bool = True,
    metadata_last: bool = False,
) -> bytes:
    """A frame in the DSSST1.md §5 writer style (standard compact JSON everywhere)."""
    meta = {"dss": dss(tree)}
    if op is not None:
        meta["op"] = js(op)
    meta.update(extra_meta or {})
    entries, data = layout(tensors, spec_order=spec_order)
    fields = (
        [*entries, ("__metadata__", meta)] if metadata_last else [("__metadata__", meta), *entries]
    )
    return blob(hdr(*fields), data, pad=pad)


def u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


# The base tensor most invalid frames are built around.
X = np.arange(4, dtype=np.float32)
XB = X.tobytes()
XE = entry(X, 0)
TREE_X = ["d", [["x", ["t", "x"]]]]
META_X = {"dss": dss(TREE_X)}


def with_x(metadata: Any) -> bytes:
    """A frame holding tensor ``x`` whose ``__metadata__`` is ``metadata`` (JSON or Raw)."""
    return blob(hdr(("__metadata__", metadata), ("x", XE)), XB)


def with_entry(e: Any, data: bytes = XB) -> bytes:
    """A frame whose tree is ``{"x": <t x>}`` and whose ``x`` entry is ``e`` (JSON or Raw)."""
    return blob(hdr(("__metadata__", META_X), ("x", e)), data)


# --------------------------------------------------------------------------- helpers for adding


def v1_frame(
    vid: str,
    obj: Any,
    ref: str,
    desc: str,
    *,
    metadata: Any = None,
    expected: Any = _UNSET,
    **kw: Any,
) -> None:
    """A valid frame exactly as the deployed writer produces it from ``obj``."""
    data = v1ref.dumps(obj, metadata=metadata)
    exp = obj if expected is _UNSET else expected
    op = metadata if metadata else _UNSET
    add(Vector(vid, "frame", "v1-writer", ref, desc, data, expected=exp, expected_op=op, **kw))


def ok_frame(
    vid: str, origin: str, data: bytes, expected: Any, ref: str, desc: str, **kw: Any
) -> None:
    add(Vector(vid, "frame", origin, ref, desc, data, expected=expected, **kw))


def bad_frame(
    vid: str, code: str, ref: str, desc: str, data: bytes, *, origin: str = "hand-built", **kw: Any
) -> None:
    add(Vector(vid, "frame", origin, ref, desc, data, error_code=code, **kw))


# --------------------------------------------------------------------------- valid: v1 writer

RESPONSE_OPTIONS = {"response_options": {"format": "dssst1", "delivery": "chunked"}}


def v1_writer_frames() -> None:
    ids = np.arange(8, dtype=np.int64).reshape(2, 4) + 100
    v1_frame(
        "v1w-nested",
        {
            "args": [],
            "kwargs": {"input_ids": ids, "attention_mask": np.ones((2, 4), dtype=np.int64)},
            "context": {
                "advantages": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4),
                "loss_mask": np.array([[0, 1, 1, 1], [0, 0, 1, 1]], dtype=np.bool_),
            },
            "processing": {
                "post": ["compute_logprobs"],
                "loss_fn": "ppo",
                "config": {"clip_ratio": 0.2, "loss_agg_mode": "token-mean"},
            },
            "nested": [1, {"x": np.array([0.5, 1.5, 2.5], dtype=np.float32)}, "s"],
            "pair": (np.array([7], dtype=np.int32), "tag", [1, 2], None, True),
        },
        "§10, §3",
        "dotted-path names (kwargs.input_ids, nested.1.x, pair.0), d/l/u nodes, "
        "tensor-free subtrees as j leaves, a tuple holding a tensor",
        metadata=RESPONSE_OPTIONS,
    )
    v1_frame(
        "v1w-scalar",
        {
            "loss": np.array(0.5, dtype=np.float32),
            "step": np.array(7),
            "flag": np.array(True),
            "vec": np.array([1.0]),
        },
        "§3 scalar, §5.6",
        '0-dim arrays stored with shape [1] and {"scalar": true}; the 1-element 1-D `vec` '
        "keeps shape [1] (no flag)",
    )
    v1_frame(
        "v1w-root-tensor",
        np.arange(5, dtype=np.int32),
        "§10 __root__",
        'a bare tensor is named __root__; tree ["t", "__root__"]',
    )
    v1_frame(
        "v1w-root-scalar",
        np.array(3.25),
        "§10 __root__, §3 scalar",
        'a bare 0-dim float64 tensor: ["t", "__root__", {"scalar": true}]',
    )
    v1_frame(
        "v1w-dtypes",
        {
            "bool": np.array([True, False, True]),
            "u8": np.array([0, 1, 255], dtype=np.uint8),
            "i8": np.array([-128, -1, 127], dtype=np.int8),
            "u16": np.array([0, 65535], dtype=np.uint16),
            "i16": np.array([-32768, 32767], dtype=np.int16),
            "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
            "i32": np.array([[-(2**31), 0], [1, 2**31 - 1]], dtype=np.int32),
            "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
            "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
            "f16": np.array([65504, 6e-8, -0.0, INF, NAN], dtype=np.float16),
            "bf16": np.array([[1.5, -0.0], [3.0e38, INF], [-INF, NAN]], dtype=ml_dtypes.bfloat16),
            "f32": np.array([1.0e-45, -3.4e38, INF, NAN], dtype=np.float32),
            "f64": np.array([5e-324, 1.7e308, -0.0, -INF, NAN], dtype=np.float64),
            "f8_e4m3": np.array([448, -448, 2**-9, -0.0, NAN], dtype=ml_dtypes.float8_e4m3fn),
            "f8_e5m2": np.array([57344, 2**-16, INF, -INF, NAN], dtype=ml_dtypes.float8_e5m2),
            "c64": np.array(
                [1 + 2j, complex(-0.0, INF), complex(NAN, -1.0e-45), 3.4e38 - 0j],
                dtype=np.complex64,
            ),
        },
        "§4, §10",
        "every dtype of §4 with extreme and special values (NaN, ±inf, -0, subnormals, "
        "integer limits); safetensors' layout order: U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 "
        "I16 F8_E4M3 F8_E5M2 I8 U8 BOOL",
    )
    v1_frame(
        "r15-c64",
        {"z": np.array([[1 + 2j, -3.5 - 0.25j]], dtype=np.complex64), "r": np.ones(2, np.float32)},
        "§4 C64",
        "C64 (complex64, 8 bytes: binary32 real then imaginary) is in §4: a valid tensor beside "
        "an F32 one (was dtype_unknown before C64 joined the table; the id is kept)",
    )
    v1_frame(
        "v1w-zero-element",
        {
            "a": np.zeros(0, dtype=np.float32),
            "b": np.zeros((2, 0, 3), dtype=np.int64),
            "c": np.zeros(0, dtype=np.uint8),
            "d": np.ones(2, dtype=np.float32),
            "e": np.zeros((0,), dtype=ml_dtypes.bfloat16),
        },
        "§1 zero elements",
        "0-element tensors have begin == end, several share an offset with a non-empty tensor",
    )
    x, y = np.array([1, 2], dtype=np.int64), np.array([30, 40], dtype=np.int64)
    v1_frame(
        "v1w-path-collision",
        {"a.b": x, "a": {"b": y}},
        "§3 several references, §10",
        "dotted-path collision: both nodes name tensor `a.b`, which holds y (x is lost); "
        "both decode to y, in v1 and in a conforming reader",
        expected={"a.b": y, "a": {"b": y}},
    )
    v1_frame(
        "v1w-placeholder",
        {"a": 1, "b": [1, 2.5, "s", None, True], "c": {"d": "e"}},
        "§5.8, §6 placeholder",
        "no tensor: tree is one j leaf and the frame holds the "
        "placeholder __dss_empty__ (U8 [1] = 0), which readers drop",
    )
    v1_frame("v1w-placeholder-none", None, "§5.8", 'None alone: ["j", null] + placeholder')
    v1_frame(
        "v1w-nan-tokens",
        {
            "x": np.array([1.0], dtype=np.float32),
            "loss": NAN,
            "bounds": [INF, -INF],
            "stats": {"max": INF, "min": -INF},
        },
        "§2 NaN tokens, §10",
        "NaN, Infinity and -Infinity as bare tokens inside the dss "
        "string (json.dumps allow_nan=True); readers must accept them",
    )
    v1_frame(
        "v1w-op-nan-tokens",
        {"x": np.array([2], dtype=np.int64)},
        "§2 NaN tokens",
        "an op string holding NaN and Infinity tokens (plus router_replay)",
        metadata={"router_replay": {"sampling_job_id": "20"}, "temperature": NAN, "max_ratio": INF},
    )
    v1_frame(
        "v1w-int-keys-stringified",
        {"x": np.array([1], dtype=np.int64), "top_logprobs": {17: -0.5, 4: -1.25}},
        "§10 lossy j leaves",
        "a tensor-free dict with int keys is a j leaf: the keys come "
        "back as strings (the reader decodes what is there)",
        expected={"x": np.array([1], dtype=np.int64), "top_logprobs": {"17": -0.5, "4": -1.25}},
    )
    v1_frame(
        "v1w-tuples-in-json-leaf",
        {"x": np.array([1], dtype=np.int64), "meta": {"shape": (2, 3), "pairs": [(1, 2)]}},
        "§10 lossy j leaves",
        "tuples inside a tensor-free dict are written as JSON arrays and come back as lists",
        expected={"x": np.array([1], dtype=np.int64), "meta": {"shape": [2, 3], "pairs": [[1, 2]]}},
    )
    v1_frame(
        "v1w-tuple-no-tensor",
        (1, "a", [2, 3], (4,), ()),
        "§3 u node, §5.8",
        "tuples are always u nodes, even without a tensor; lists inside stay j leaves",
    )
    v1_frame(
        "v1w-empty-containers",
        {"x": np.array([1], dtype=np.int8), "e": {}, "l": [], "t": ()},
        "§3",
        'empty dict/list as j leaves, () as ["u", []]',
    )
    v1_frame(
        "v1w-op-metadata",
        {"x": np.array([3.0], dtype=np.float32)},
        "§2 op",
        "op metadata (response_options + router_replay) with json.dumps separators",
        metadata={**RESPONSE_OPTIONS, "router_replay": {"sampling_job_id": "20"}},
    )
    v1_frame(
        "v1w-user-dss-empty",
        {"__dss_empty__": np.array([5, 6], dtype=np.int16), "y": np.array([1], dtype=np.int16)},
        "§6 placeholder rule",
        "a user tensor at path __dss_empty__ is referenced by the "
        "tree: a conforming reader returns it; the deployed reader drops it and fails",
        v1_error="KeyError",
    )
    v1_frame(
        "v1w-names-escaped",
        {
            "ключ": np.array([1], dtype=np.int8),
            'q"uote\\back\nnl\t\x01': np.array([2], dtype=np.int8),
            "": np.array([3], dtype=np.int8),
            "a": {"": np.array([4], dtype=np.int8)},
        },
        "§3 opaque names",
        "raw UTF-8 and JSON-escaped tensor names; the empty key at the "
        "root gets the name __root__ and the nested one `a.`",
    )
    base = np.arange(6, dtype=np.float32)
    v1_frame(
        "v1w-shared-and-strided",
        {"a": base, "b": base, "c": [base, base[1:]], "t": base.reshape(2, 3).T},
        "§5.7",
        "one array referenced several times, a view and a transposed array are each "
        "written with their own C-order bytes",
    )
    v1_frame(
        "v1w-list-root",
        [np.array([1.0], dtype=np.float64), 1, "s", None],
        "§3 l node",
        "a list holding a tensor at the root: names 0, ...",
    )
    deep: Any = np.array([9], dtype=np.uint8)
    for _ in range(60):
        deep = [deep]
    v1_frame(
        "v1w-deep-60",
        deep,
        "§7 depth",
        "60 nested lists around a tensor: l nodes at depths 1..60, the t node at 61",
    )
    deep = np.array([9], dtype=np.uint8)
    for _ in range(63):
        deep = [deep]
    v1_frame(
        "v1w-depth-64",
        deep,
        "§6 R19 depth",
        "63 nested lists around a tensor: the root l node is at depth 1, the t node at depth "
        "64 = max_depth exactly (accepted; see r19-depth-65)",
    )
    v1_frame(
        "v1w-fwd-bwd-body",
        {
            "args": [],
            "kwargs": {
                "input_ids": ids,
                "attention_mask": np.ones((2, 4), dtype=np.int64),
                "position_ids": np.tile(np.arange(4, dtype=np.int64), (2, 1)),
            },
            "context": {
                "input_ids": ids,
                "advantages": np.full((2, 4), 0.25, dtype=np.float32),
                "loss_mask": np.ones((2, 4), dtype=np.float32),
                "old_log_probs_shifted": np.full((2, 4), -1.5, dtype=np.float32),
            },
            "processing": {
                "post": ["compute_logprobs"],
                "loss_fn": "ppo",
                "config": {"loss_agg_mode": "token-mean"},
            },
        },
        "DESIGN.md §3",
        "the canonical forward-backward body as the deployed client frames it",
        metadata=RESPONSE_OPTIONS,
    )
    # A frame whose header length N is 640: its first two bytes are 80 02, a pickle opcode.
    obj: dict[str, Any] = {"x": np.array([1], dtype=np.int64), "note": ""}
    while int.from_bytes(v1ref.dumps(obj)[:8], "little") < 640:
        obj["note"] += "n"
    assert v1ref.dumps(obj)[:8] == (640).to_bytes(8, "little")
    v1_frame(
        "v1w-header-640-pickle-prefix",
        obj,
        "§6 R2 precedence, §10",
        "N = 640, so the frame starts with 80 02 like a pickle; it passes R4-R7, so R2 does not "
        "apply: a frame, not a pickle (the deployed reader also accepts it)",
    )
    op = {"router_replay": {"sampling_job_id": "7"}}
    tree = ["d", [["x", ["t", "x"]]]]
    xs = {"x": np.array([1.0, -1.0], dtype=np.float64)}
    meta = {"op": json.dumps(op), "dss": json.dumps({"v": "DSSST1", "tree": tree})}
    data = v1ref.save_safetensors(xs, meta)
    twin = v1ref.dumps(xs, metadata=op)
    assert len(data) == len(twin) and data[:8] == twin[:8] and data != twin
    add(
        Vector(
            "v1w-op-before-dss",
            "frame",
            "v1-writer",
            "§10 metadata order",
            "the deployed writer's metadata hash map put op before dss (either order occurs)",
            data,
            expected=xs,
            expected_op=op,
        )
    )


# --------------------------------------------------------------------------- valid: new writer


def new_writer_frames() -> None:
    x, y = np.array([1, 2], dtype=np.int64), np.array([30, 40], dtype=np.int64)
    ok_frame(
        "nw-collision-free-names",
        "new-writer",
        frame(
            ["d", [["a.b", ["t", "a.b"]], ["a", ["d", [["b", ["t", "a.b~1"]]]]]]],
            [("a.b", x), ("a.b~1", y)],
        ),
        {"a.b": x, "a": {"b": y}},
        "§5.2",
        "the path collision closed: a.b and a.b~1",
    )
    t = np.array([1.5], dtype=np.float32)
    tree = [
        "d",
        [
            ["x", ["t", "x"]],
            [
                "meta",
                [
                    "d",
                    [
                        ["shape", ["u", [["j", 2], ["j", 3]]]],
                        ["ids", ["d", [["k", ["l", [["u", [["j", 1], ["j", 2]]]]]]]]],
                        ["ok", ["j", {"a": [1, 2]}]],
                    ],
                ],
            ],
        ],
    ]
    ok_frame(
        "nw-tensor-free-tuples",
        "new-writer",
        frame(tree, [("x", t)]),
        {"x": t, "meta": {"shape": (2, 3), "ids": {"k": [(1, 2)]}, "ok": {"a": [1, 2]}}},
        "§5.3",
        "tensor-free subtrees holding tuples are d/l/u nodes, so tuples stay tuples "
        "at any depth; a JSON-exact subtree stays a j leaf",
    )
    f64 = np.float64
    pyf = {"scalar": True, "py": "float"}
    tree = [
        "d",
        [
            ["x", ["t", "x"]],
            ["loss", ["t", "loss", pyf]],
            ["hi", ["t", "hi", pyf]],
            ["lo", ["t", "lo", pyf]],
            ["vals", ["l", [["j", 1.0], ["t", "vals.1", pyf], ["j", -2.5]]]],
        ],
    ]
    tensors: list[tuple[str, np.ndarray]] = [
        ("x", t),
        ("loss", np.array([NAN], f64)),
        ("hi", np.array([INF], f64)),
        ("lo", np.array([-INF], f64)),
        ("vals.1", np.array([NAN], f64)),
    ]
    ok_frame(
        "nw-nonfinite-floats",
        "new-writer",
        frame(tree, tensors),
        {"x": t, "loss": NAN, "hi": INF, "lo": -INF, "vals": [1.0, NAN, -2.5]},
        "§3 py float, §5.5",
        'non-finite floats as scalar F64 tensors with {"scalar": true, "py": "float"}; '
        "the deployed reader sees 0-dim float64 arrays",
        expected_v1={
            "x": t,
            "loss": np.array(NAN),
            "hi": np.array(INF),
            "lo": np.array(-INF),
            "vals": [1.0, np.array(NAN), -2.5],
        },
    )
    blob1, blob2 = b"\x00\x01\xfe\xff", b""
    pyb = {"py": "bytes"}
    ok_frame(
        "nw-bytes",
        "new-writer",
        frame(
            ["d", [["blob", ["t", "blob", pyb]], ["empty", ["t", "empty", pyb]]]],
            [("blob", u8(blob1)), ("empty", u8(blob2))],
        ),
        {"blob": blob1, "empty": blob2},
        "§3 py bytes, §5.5",
        'bytes as 1-D U8 tensors with {"py": "bytes"} (one empty); the deployed reader '
        "sees uint8 arrays",
        expected_v1={"blob": u8(blob1), "empty": u8(blob2)},
    )
    a, b = np.array([5, 6], dtype=np.int16), np.array([7], dtype=np.int16)
    ok_frame(
        "nw-reserved-names-renamed",
        "new-writer",
        frame(
            [
                "d",
                [
                    ["__dss_empty__", ["t", "__dss_empty__~1"]],
                    ["__metadata__", ["t", "__metadata__~1"]],
                ],
            ],
            [("__dss_empty__~1", a), ("__metadata__~1", b)],
        ),
        {"__dss_empty__": a, "__metadata__": b},
        "§5.2 reserved names",
        "values at paths __dss_empty__ and __metadata__ get the names ...~1",
    )
    z = np.array([1, 2, 3], dtype=np.int32)
    ok_frame(
        "nw-header-unpadded",
        "hand-built",
        frame(["d", [["z", ["t", "z"]]]], [("z", z)], pad=False),
        {"z": z},
        "§1 padding",
        "header length not a multiple of 8 (another safetensors writer): readers must accept it",
    )
    tensors = [
        ("a", np.array([1, 2, 3], dtype=np.uint8)),
        ("b", np.array([1.5, -2.0], np.float32)),
        ("c", np.array([2**40], dtype=np.int64)),
    ]
    data = frame(["d", [[n, ["t", n]] for n, _ in tensors]], tensors, pad=False, spec_order=False)
    assert (int.from_bytes(data[:8], "little") + 8 + 3) % 4 != 0
    ok_frame(
        "nw-misaligned-offsets",
        "hand-built",
        data,
        dict(tensors),
        "§6 alignment",
        "F32 and I64 tensors at data offsets 3 and 11 behind an unpadded header: misaligned "
        "in memory, still returned",
    )
    note = ""
    while True:
        tree = ["d", [["z", ["t", "z"]], ["note", ["j", note]]]]
        text = hdr(("__metadata__", {"dss": dss(tree)}), ("z", entry(z, 0)))
        if len(text.encode()) + (-len(text.encode()) % 8) == 640:
            break
        note += "n"
    data = frame(tree, [("z", z)])
    assert int.from_bytes(data[:8], "little") == 648 and data[8 + 640 : 8 + 648] == b" " * 8
    ok_frame(
        "nw-header-pickle-length-avoided",
        "new-writer",
        data,
        {"z": z, "note": note},
        "§5.1 pickle-like N",
        "a header that padded to 8 would be 640 bytes (80 02, a pickle prefix) gets 8 more "
        "spaces: N = 648",
    )
    op = {**RESPONSE_OPTIONS, "router_replay": {"sampling_job_id": "20"}}
    ok_frame(
        "nw-op-metadata",
        "new-writer",
        frame(["d", [["x", ["t", "x"]]]], [("x", t)], op=op),
        {"x": t},
        "§2 op",
        "op metadata in standard compact JSON",
        expected_op=op,
    )
    ok_frame(
        "nw-placeholder",
        "new-writer",
        frame(
            ["d", [["a", ["j", 1]], ["t", ["u", [["j", 1]]]]]],
            [("__dss_empty__", np.zeros(1, np.uint8))],
        ),
        {"a": 1, "t": (1,)},
        "§5.8, §5.3",
        "no tensor: structural d/u nodes + placeholder",
    )
    ok_frame(
        "hb-dss-empty-referenced",
        "hand-built",
        frame(["t", "__dss_empty__"], [("__dss_empty__", np.zeros(1, np.uint8))]),
        np.zeros(1, np.uint8),
        "§6 placeholder rule",
        "a tensor named __dss_empty__ that "
        "the tree references is returned, even though it looks exactly like the "
        "placeholder (the deployed reader drops it and fails)",
        v1_error="KeyError",
    )
    e0, f = np.zeros(0, dtype=np.float32), np.array([1.0, 2.0], dtype=np.float32)
    meta = {"dss": dss(["d", [["e", ["t", "e"]], ["f", ["t", "f"]], ["g", ["t", "g"]]]])}
    g = np.array([3], dtype=np.uint8)
    header = hdr(
        ("g", entry(g, 8)), ("f", entry(f, 0)), ("e", entry(e0, 0)), ("__metadata__", meta)
    )
    ok_frame(
        "hb-header-order",
        "hand-built",
        blob(header, f.tobytes() + g.tobytes()),
        {"e": e0, "f": f, "g": g},
        "§1 data_offsets",
        "header entries out of offset order, __metadata__ last, and a 0-element tensor "
        "listed after a non-empty one with the same begin (sort by (begin, end))",
    )
    ok_frame(
        "hb-extra-metadata-keys",
        "hand-built",
        frame(TREE_X, [("x", X)], extra_meta={"format": "pt", "zz": "ignored"}),
        {"x": X},
        "§2",
        "other __metadata__ keys are ignored",
    )
    y1 = np.array([4], dtype=np.int32)
    ok_frame(
        "hb-unknown-flags",
        "hand-built",
        frame(
            ["d", [["x", ["t", "x", {"scalar": True, "future": {"a": 1}}]], ["y", ["t", "y", {}]]]],
            [("x", np.array([2.5])), ("y", y1)],
        ),
        {"x": np.array(2.5), "y": y1},
        "§3 flags",
        "unknown flag keys and an empty flags object are ignored",
    )
    ok_frame(
        "hb-op-empty-string",
        "hand-built",
        with_x({**META_X, "op": ""}),
        {"x": X},
        "§6 R9 empty op",
        "an empty op string reads as {} (as the deployed read_metadata does)",
        expected_op={},
    )
    ok_frame(
        "hb-placeholder-any-dtype",
        "hand-built",
        frame(TREE_X, [("x", X), ("__dss_empty__", np.array([[1.5, 2.5]], np.float64))]),
        {"x": X},
        "§5.8, §6 R23 placeholder",
        "an unreferenced __dss_empty__ that is F64 [1, 2] (not the U8 [1] zero placeholder) "
        "is dropped all the same",
    )
    ok_frame(
        "hb-extra-padding",
        "hand-built",
        blob(hdr(("__metadata__", META_X), ("x", XE)) + " " * 24, XB),
        {"x": X},
        "§1 padding",
        "24 spaces of padding beyond the 8-byte boundary",
    )
    ok_frame(
        "hb-shared-reference",
        "hand-built",
        frame(["l", [["t", "x"], ["t", "x"], ["u", [["t", "x"]]]]], [("x", X)]),
        [X, X, (X,)],
        "§3 several references",
        "three t nodes name one tensor",
    )
    ok_frame(
        "hb-placeholder-with-tensors",
        "hand-built",
        frame(TREE_X, [("x", X), ("__dss_empty__", np.zeros(1, np.uint8))]),
        {"x": X},
        "§6 R23 placeholder",
        "an unreferenced __dss_empty__ beside referenced tensors is "
        "dropped (not tensor_unreferenced)",
    )
    e1 = np.zeros((0, 2), dtype=np.int16)
    meta = {"dss": dss(["d", [["x", ["t", "x"]], ["e", ["t", "e"]]]])}
    ok_frame(
        "hb-zero-length-at-end",
        "hand-built",
        blob(hdr(("__metadata__", meta), ("x", XE), ("e", entry(e1, 16))), XB),
        {"x": X, "e": e1},
        "§1 data_offsets",
        "a 0-element tensor at [16, 16], the very end of the data section",
    )
    ok_frame(
        "hb-opaque-names",
        "hand-built",
        frame(
            ["d", [["kwargs", ["d", [["input_ids", ["t", "0"]], ["mask", ["t", "1"]]]]]]],
            [("0", z), ("1", np.array([True, False]))],
        ),
        {"kwargs": {"input_ids": z, "mask": np.array([True, False])}},
        "§3 opaque names",
        "tensor names unrelated to the paths: the tree says which goes where",
    )


# --------------------------------------------------------------------------- invalid frames


def deep_list(inner: Any, levels: int) -> Any:
    for _ in range(levels):
        inner = [inner]
    return inner


ZIP_LOCAL = b"PK\x03\x04"


def tiny_zip() -> bytes:
    """A stored one-file zip archive (what torch.save writes is a zip), packed by hand."""
    name, content = b"archive/data.pkl", b"\x80\x02}q\x00."
    crc = zlib.crc32(content)
    local = (
        struct.pack(
            "<4sHHHHHIIIHH",
            ZIP_LOCAL,
            20,
            0,
            0,
            0,
            0x21,
            crc,
            len(content),
            len(content),
            len(name),
            0,
        )
        + name
        + content
    )
    central = (
        struct.pack(
            "<4sHHHHHHIIIHHHHHII",
            b"PK\x01\x02",
            20,
            20,
            0,
            0,
            0,
            0x21,
            crc,
            len(content),
            len(content),
            len(name),
            0,
            0,
            0,
            0,
            0,
            0,
        )
        + name
    )
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local), 0)
    return local + central + end


def invalid_frames() -> None:
    bad_frame("r01-empty", "frame_too_short", "R1", "zero bytes", b"")
    bad_frame("r01-seven-bytes", "frame_too_short", "R1", "seven bytes", b"\x10" + b"\x00" * 6)
    # Literal bytes (not pickle.dumps at generation time, so another Python cannot change them).
    p2 = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01K\x01s."
    p5 = (
        b"\x80\x05\x95\x1a\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\tinput_ids\x94]\x94"
        b"(K\x01K\x02K\x03es."
    )
    assert pickle.loads(p2) == {"a": 1} and pickle.loads(p5) == {"input_ids": [1, 2, 3]}
    for data in (p2, p5, tiny_zip()):  # R2 / R3 apply only to a frame that also fails R4-R7
        assert int.from_bytes(data[:8], "little") > MAX_HEADER
    bad_frame(
        "r02-pickle-protocol-2",
        "pickle_refused",
        "R2",
        "pickle.dumps({'a': 1}, 2): read as N it is over 64 MiB (fails R4), so R2 applies",
        p2,
    )
    bad_frame(
        "r02-pickle-protocol-5",
        "pickle_refused",
        "R2",
        "pickle.dumps({'input_ids': [1, 2, 3]}, 5): fails R4, so R2 applies",
        p5,
    )
    pickle_n = (640).to_bytes(8, "little")
    assert pickle_n[:2] == b"\x80\x02"
    junk = (b"}q\x00X\x01\x00\x00\x00aq\x01K\x01s." * 40)[:640]
    bad_frame(
        "r02-pickle-prefix-header-not-json",
        "pickle_refused",
        "R2",
        "starts 80 02 with N = 640, a valid header length (passes R4, R5), but the 640 header "
        "bytes are pickle opcodes, not JSON (fails R7): R2 takes precedence",
        pickle_n + junk + XB,
    )
    bad_frame(
        "r02-pickle-prefix-past-end",
        "pickle_refused",
        "R2",
        "starts 80 03 (N = 896) and the frame is 100 bytes long: fails R5, R2 takes precedence",
        (896).to_bytes(8, "little") + b"\x00" * 92,
    )
    bad_frame(
        "r03-zip",
        "zip_refused",
        "R3",
        "a zip archive (torch.save format); PK 03 04 read as N is over 64 MiB (fails R4)",
        tiny_zip(),
    )
    meta_only = hdr(("x", XE), ("note", Raw('"' + "n" * 500 + '"')))
    meta_only += " " * (640 - len(meta_only))
    assert len(meta_only) == 640
    bad_frame(
        "r09-pickle-prefix-no-metadata",
        "metadata_invalid",
        "R9",
        "N = 640 (starts 80 02) and the header is a JSON object, so R4-R7 pass and R2 does not "
        "apply: the frame fails R9 (no __metadata__) instead",
        blob(meta_only, XB, pad=False),
    )
    limit = MAX_HEADER
    bad_frame(
        "r04-header-too-large",
        "header_too_large",
        "R4",
        "N = 64 MiB + 8 with a short body: refused before reading the header",
        blob(hdr(("__metadata__", META_X)), n=limit + 8),
    )
    bad_frame(
        "r04-header-2-63",
        "header_too_large",
        "R4",
        "N = 2^63",
        blob(hdr(("__metadata__", META_X)), n=2**63),
    )
    bad_frame("r05-zero-length", "header_length_invalid", "R5", "N = 0", blob(b"", b"{}      "))
    bad_frame(
        "r05-past-end",
        "header_length_invalid",
        "R5",
        "8 + N exceeds the frame length",
        blob(hdr(("__metadata__", META_X), ("x", XE)), XB, n=4096),
    )
    bad_frame(
        "r05-64mib-exactly-short",
        "header_length_invalid",
        "R5",
        "N = 64 MiB exactly (not over the limit) but the frame is short",
        blob(hdr(("__metadata__", META_X)), n=limit),
    )
    x_entry = js(XE).encode()
    bad_frame(
        "r06-invalid-byte",
        "header_not_utf8",
        "R6",
        "a 0xff byte in a tensor name",
        blob(b'{"__metadata__":' + js(META_X).encode() + b',"x\xff":' + x_entry + b"}", XB),
    )
    bad_frame(
        "r06-encoded-surrogate",
        "header_not_utf8",
        "R6",
        "a UTF-8-encoded surrogate (ED A0 80) inside a metadata value",
        blob(
            b'{"__metadata__":{"dss":'
            + js(META_X["dss"]).encode()
            + b',"note":"\xed\xa0\x80"},"x":'
            + x_entry
            + b"}",
            XB,
        ),
    )
    bad_frame("r07-garbage", "header_not_json", "R7", "header is not JSON", blob("not json", XB))
    bad_frame("r07-array", "header_not_json", "R7", "header is a JSON array", blob("[]", XB))
    bad_frame("r07-string", "header_not_json", "R7", "header is a JSON string", blob('"x"'))
    bad_frame(
        "r07-nul-padding",
        "header_not_json",
        "R7",
        "valid header JSON padded with NUL bytes instead of spaces",
        blob(hdr(("__metadata__", META_X), ("x", XE)).encode() + b"\x00" * 7, XB, pad=False),
    )
    bad_frame(
        "r07-nan-in-header",
        "header_not_json",
        "R7",
        "a bare NaN token in the header itself (only the dss / op strings may hold one)",
        with_entry(Raw('{"dtype":"F32","shape":[NaN],"data_offsets":[0,16]}')),
    )
    bad_frame(
        "r07-infinity-in-metadata",
        "header_not_json",
        "R7",
        "a bare Infinity token as a __metadata__ value: the outer header must be strict JSON "
        "(a lenient parser would go on to metadata_invalid)",
        with_x(Raw("{" + js("dss") + ":" + js(META_X["dss"]) + ',"n":Infinity}')),
    )
    bad_frame(
        "r07-truncated",
        "header_not_json",
        "R7",
        "header JSON cut short",
        blob(hdr(("__metadata__", META_X), ("x", XE))[:-1], XB),
    )
    bad_frame(
        "r08-duplicate-tensor-name",
        "header_duplicate_key",
        "R8",
        "tensor x listed twice",
        blob(hdr(("__metadata__", META_X), ("x", XE), ("x", XE)), XB),
    )
    bad_frame(
        "r08-duplicate-entry-field",
        "header_duplicate_key",
        "R8",
        "dtype twice in an entry",
        with_entry(Raw('{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]}')),
    )
    bad_frame(
        "r08-duplicate-metadata-key",
        "header_duplicate_key",
        "R8",
        "dss twice inside __metadata__ (same value both times)",
        with_x(Raw("{" + (js("dss") + ":" + js(META_X["dss"]) + ",") * 2 + '"op":"{}"}')),
    )
    bad_frame(
        "r08-v1-tensor-named-metadata",
        "header_duplicate_key",
        "R8",
        "the deployed writer given a value at path __metadata__ writes a second "
        "__metadata__ key (its own reader refuses the frame too)",
        v1ref.dumps({"__metadata__": np.array([1, 2], dtype=np.uint8)}),
        origin="v1-writer",
    )
    bad_frame(
        "r09-no-metadata", "metadata_invalid", "R9", "no __metadata__", blob(hdr(("x", XE)), XB)
    )
    bad_frame(
        "r09-metadata-array", "metadata_invalid", "R9", "__metadata__ is an array", with_x([])
    )
    bad_frame(
        "r09-metadata-non-string",
        "metadata_invalid",
        "R9",
        "a __metadata__ value that is a number",
        with_x({**META_X, "n": 1}),
    )
    bad_frame(
        "r09-op-array",
        "metadata_invalid",
        "R9",
        "op is a JSON array",
        with_x({**META_X, "op": "[1, 2]"}),
    )
    bad_frame(
        "r09-op-not-json",
        "metadata_invalid",
        "R9",
        "op is not JSON",
        with_x({**META_X, "op": '{"response_options": '}),
    )
    bad_frame(
        "r10-no-dss",
        "structure_missing",
        "R10",
        "__metadata__ has op but no dss",
        with_x({"op": "{}"}),
    )
    bad_frame("r10-empty-metadata", "structure_missing", "R10", "__metadata__ is {}", with_x({}))
    bad_frame(
        "r11-dss-not-json",
        "structure_not_json",
        "R11",
        "dss is not JSON",
        with_x({"dss": '{"v": "DSSST1", "tree": '}),
    )
    bad_frame(
        "r11-dss-array",
        "structure_not_json",
        "R11",
        "dss is a JSON array",
        with_x({"dss": js(["DSSST1", TREE_X])}),
    )
    bad_frame(
        "r11-dss-no-tree",
        "structure_not_json",
        "R11",
        "dss object without tree",
        with_x({"dss": js({"v": "DSSST1"})}),
    )
    bad_frame(
        "r11-dss-no-v",
        "structure_not_json",
        "R11",
        "dss object without v",
        with_x({"dss": js({"tree": TREE_X})}),
    )
    for vid, v in [
        ("r12-version-2", "DSSST2"),
        ("r12-version-lowercase", "dssst1"),
        ("r12-version-number", 1),
    ]:
        bad_frame(
            vid,
            "unsupported_version",
            "R12",
            f"v = {json.dumps(v)}",
            with_x({"dss": dss(TREE_X, v)}),
        )
    five = [(f"t{i}", np.array([i], dtype=np.uint8)) for i in range(5)]
    bad_frame(
        "r13-too-many-tensors",
        "too_many_tensors",
        "R13",
        "5 tensors read with max_tensors = 4 (see limits; a frame over the default "
        "262,144 would be ~14 MB)",
        frame(["l", [["t", n] for n, _ in five]], five),
        limits={"max_tensors": 4},
    )
    for vid, e, what in [
        ("r14-missing-dtype", {"shape": [4], "data_offsets": [0, 16]}, "no dtype"),
        (
            "r14-dtype-not-string",
            {"dtype": 7, "shape": [4], "data_offsets": [0, 16]},
            "dtype is a number",
        ),
        (
            "r14-shape-negative",
            {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]},
            "negative dimension",
        ),
        (
            "r14-shape-float",
            Raw('{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}'),
            "dimension written 4.0 (not an integer)",
        ),
        (
            "r14-shape-bool",
            {"dtype": "F32", "shape": [True], "data_offsets": [0, 16]},
            "dimension true (a bool is not an integer)",
        ),
        (
            "r14-offsets-float",
            Raw('{"dtype":"F32","shape":[4],"data_offsets":[0,16.0]}'),
            "end offset written 16.0 (not an integer)",
        ),
        (
            "r14-offsets-bool",
            {"dtype": "F32", "shape": [0], "data_offsets": [False, False]},
            "offsets false, false (a bool is not an integer) on a 0-element tensor and an "
            "empty data section",
        ),
        (
            "r14-shape-not-list",
            {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]},
            "shape is a number",
        ),
        (
            "r14-offsets-three",
            {"dtype": "F32", "shape": [4], "data_offsets": [0, 16, 16]},
            "three data_offsets",
        ),
        (
            "r14-offsets-begin-after-end",
            {"dtype": "F32", "shape": [0], "data_offsets": [16, 0]},
            "begin > end",
        ),
        (
            "r14-offsets-negative",
            {"dtype": "F32", "shape": [0], "data_offsets": [-1, -1]},
            "negative offsets",
        ),
        ("r14-extra-key", {**XE, "note": "x"}, "an extra key in the entry"),
        (
            "r14-entry-not-object",
            [XE["dtype"], XE["shape"], XE["data_offsets"]],
            "the entry is an array",
        ),
    ]:
        data = b"" if vid == "r14-offsets-bool" else XB
        bad_frame(vid, "tensor_entry_invalid", "R14", what, with_entry(e, data))
    for vid, name, size in [
        ("r15-f4", "F4", 2),
        ("r15-f8-e8m0", "F8_E8M0", 4),
        ("r15-lowercase", "f32", 16),
        ("r15-numpy-name", "float32", 16),
    ]:
        bad_frame(
            vid,
            "dtype_unknown",
            "R15",
            f"dtype {name}",
            with_entry({"dtype": name, "shape": [4], "data_offsets": [0, size]}, XB[:size]),
        )
    bad_frame(
        "r16-size-short",
        "tensor_size_mismatch",
        "R16",
        "F32 [4] over 12 bytes",
        with_entry({"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}, XB[:12]),
    )
    bad_frame(
        "r16-huge-shape",
        "tensor_size_mismatch",
        "R16",
        "F32 [2^31, 2^31, 2] declared over 0 bytes (2^63 elements): no allocation",
        with_entry({"dtype": "F32", "shape": [2**31, 2**31, 2], "data_offsets": [0, 0]}, b""),
    )
    bad_frame(
        "r16-odd-bf16",
        "tensor_size_mismatch",
        "R16",
        "BF16 [2] over 3 bytes",
        with_entry({"dtype": "BF16", "shape": [2], "data_offsets": [0, 3]}, b"\x80?\x00"),
    )
    two = hdr(
        ("__metadata__", {"dss": dss(["l", [["t", "x"], ["t", "y"]]])}),
        ("x", Raw("{}")),
        ("y", Raw("{}")),
    )
    for vid, ex, ey, data, what in [
        ("r17-gap-at-start", [4, 20], [20, 24], 24, "the first range begins at 4"),
        ("r17-gap-middle", [0, 16], [20, 24], 24, "4 bytes between the ranges"),
        ("r17-overlap", [0, 16], [12, 16], 16, "the ranges overlap"),
        ("r17-past-end", [0, 16], [16, 20], 16, "a range ends past the data section"),
        ("r17-zero-length-past-end", [0, 16], [20, 20], 16, "an empty range past the end"),
    ]:
        ny = (ey[1] - ey[0]) // 4
        text = two.replace(
            '"x":{}', '"x":' + js({"dtype": "F32", "shape": [4], "data_offsets": ex})
        )
        text = text.replace(
            '"y":{}', '"y":' + js({"dtype": "F32", "shape": [ny], "data_offsets": ey})
        )
        bad_frame(vid, "offsets_invalid", "R17", what, blob(text, bytes(range(data))))
    bad_frame(
        "r18-trailing-bytes",
        "trailing_bytes",
        "R18",
        "3 bytes after the last tensor",
        with_x(META_X) + b"\x00\x00\x00",
    )
    bad_frame(
        "r18-trailing-after-placeholder",
        "trailing_bytes",
        "R18",
        "a deployed-writer placeholder frame plus one byte",
        v1ref.dumps({"a": 1}) + b"\x00",
    )
    deep: Any = np.array([9], dtype=np.uint8)
    for _ in range(80):
        deep = [deep]
    bad_frame(
        "r19-deep-lists",
        "tree_too_deep",
        "R19",
        "80 nested l nodes (t node at depth 81); the deployed writer produces this and the "
        "deployed reader accepts it",
        v1ref.dumps(deep),
        origin="v1-writer",
    )
    bad_frame(
        "r19-depth-65",
        "tree_too_deep",
        "R19",
        "64 nested lists around a tensor: root l node at depth 1, the t node at depth 65, one "
        "over max_depth (see v1w-depth-64)",
        v1ref.dumps(deep_list(np.array([9], dtype=np.uint8), 64)),
        origin="v1-writer",
    )
    bad_frame(
        "r19-deep-json-leaf",
        "tree_too_deep",
        "R19",
        "a j leaf (depth 2) whose JSON value nests 70 arrays: each JSON array is one level "
        "deeper, so the innermost is at depth 71 or 72 depending on how the j node's own value "
        "is counted, over 64 either way; the deployed writer produces this for a tensor-free "
        "nested list",
        v1ref.dumps({"x": X, "deep": deep_list(1, 70)}),
        origin="v1-writer",
    )
    n_deep = 5000
    deep_tree = '["l",[' * n_deep + '["t","x"]' + "]]" * n_deep
    deep_dss = '{"v":"DSSST1","tree":' + deep_tree + "}"
    bad_frame(
        "r19-dss-5000-deep",
        "tree_too_deep",
        "R19",
        "5000 nested l nodes (10,000 nested JSON arrays) in the dss string: too deep for many "
        "JSON parsers; fails R19 (tree_too_deep), never a crash or structure_not_json",
        blob(hdr(("__metadata__", {"dss": deep_dss}), ("x", XE)), XB),
    )
    u8x = np.array([1, 2, 3], dtype=np.uint8)
    for vid, tree, tensors, what in [
        ("r20-unknown-tag", ["x", ["t", "x"]], None, "tag x"),
        ("r20-tag-not-string", [1, []], None, "a numeric tag"),
        ("r20-empty-node", ["d", [["x", []]]], None, "an empty node []"),
        ("r20-tree-not-array", {"x": ["t", "x"]}, None, "the tree is an object"),
        ("r20-t-no-name", ["d", [["x", ["t"]]]], None, '["t"] without a name'),
        ("r20-t-name-not-string", ["d", [["x", ["t", 0]]]], None, "a numeric tensor name"),
        ("r20-t-too-long", ["d", [["x", ["t", "x", {}, 1]]]], None, "four elements in a t node"),
        ("r20-flags-not-object", ["d", [["x", ["t", "x", True]]]], None, "flags true"),
        ("r20-dict-key-not-string", ["d", [[1, ["t", "x"]]]], None, "a numeric dict key"),
        ("r20-dict-pair-arity", ["d", [["x", ["t", "x"], 1]]], None, "a dict pair of three"),
        ("r20-dict-not-list", ["d", {"x": ["t", "x"]}], None, "d body is an object"),
        ("r20-list-not-list", ["l", "x"], None, "l body is a string"),
        (
            "r20-tuple-not-list",
            ["d", [["x", ["t", "x"]], ["u", ["u", 5]]]],
            None,
            "u body is a number",
        ),
        ("r20-j-no-value", ["d", [["x", ["t", "x"]], ["j", ["j"]]]], None, '["j"] alone'),
        ("r20-j-extra", ["d", [["x", ["t", "x"]], ["j", ["j", 1, 2]]]], None, "a j node of three"),
        ("r20-py-unknown", ["t", "x", {"py": "int"}], None, "py: int"),
        (
            "r20-py-float-no-scalar",
            ["t", "f", {"py": "float"}],
            [("f", np.array([1.0]))],
            "py float without scalar",
        ),
        (
            "r20-py-float-f32",
            ["t", "f", {"scalar": True, "py": "float"}],
            [("f", np.array([1.0], dtype=np.float32))],
            "py float on an F32 tensor",
        ),
        (
            "r20-py-bytes-2d",
            ["t", "b", {"py": "bytes"}],
            [("b", u8x.reshape(3, 1))],
            "py bytes on a 2-D U8 tensor",
        ),
        (
            "r20-py-bytes-i8",
            ["t", "b", {"py": "bytes"}],
            [("b", u8x.astype(np.int8))],
            "py bytes on an I8 tensor",
        ),
        (
            "r20-py-bytes-scalar",
            ["t", "b", {"scalar": True, "py": "bytes"}],
            [("b", np.array([7], dtype=np.uint8))],
            "py bytes together with scalar on a U8 [1] tensor (R22 alone would pass)",
        ),
        (
            "r20-before-unreferenced",
            ["l", [["t", "x"], ["bogus"]]],
            [("x", X), ("y", X)],
            "a malformed second node and an unreferenced tensor y: R23 runs after the walk",
        ),
    ]:
        bad_frame(vid, "tree_invalid", "R20", what, frame(tree, tensors or [("x", X)]))
    bad_frame(
        "r21-tensor-missing",
        "tensor_missing",
        "R21",
        "a t node names an absent tensor",
        frame(["l", [["t", "x"], ["t", "nope"]]], [("x", X)]),
    )
    bad_frame(
        "r21-before-later-invalid-node",
        "tensor_missing",
        "R21",
        "the first node names an absent tensor, the third is malformed: R20-R22 run node by "
        "node in a depth-first walk, so the earlier node's R21 wins",
        frame(["l", [["t", "nope"], ["t", "x"], ["bogus", 1]]], [("x", X)]),
    )
    bad_frame(
        "r21-placeholder-name-absent",
        "tensor_missing",
        "R21",
        "a t node names __dss_empty__, which the frame does not hold",
        frame(["l", [["t", "x"], ["t", "__dss_empty__"]]], [("x", X)]),
    )
    for vid, arr, what in [
        ("r22-scalar-shape-2", np.array([1.0, 2.0]), "stored shape [2]"),
        ("r22-scalar-shape-1x1", np.array([[1.0]]), "stored shape [1, 1]"),
        ("r22-scalar-shape-0dim", np.array(1.0), "stored shape [] (0-dim on the wire)"),
    ]:
        bad_frame(
            vid,
            "scalar_shape_invalid",
            "R22",
            f"a scalar flag on a tensor of {what}",
            frame(["t", "s", {"scalar": True}], [("s", arr)]),
        )
    bad_frame(
        "r22-before-later-invalid-node",
        "scalar_shape_invalid",
        "R22",
        "a scalar flag on a [2] tensor in the first node, an unknown tag in the second: node "
        "by node, R22 at the first node wins over R20 at the second",
        frame(["l", [["t", "s", {"scalar": True}], ["q", []]]], [("s", np.array([1.0, 2.0]))]),
    )
    bad_frame(
        "r23-tensor-unreferenced",
        "tensor_unreferenced",
        "R23",
        "tensor y is named by no t node",
        frame(TREE_X, [("x", X), ("y", X)]),
    )
    bad_frame(
        "r23-placeholder-variant-unreferenced",
        "tensor_unreferenced",
        "R23",
        "an unreferenced tensor named __dss_empty__~1 (only __dss_empty__ itself may be)",
        frame(TREE_X, [("x", X), ("__dss_empty__~1", np.zeros(1, np.uint8))]),
    )


# --------------------------------------------------------------------------- chunk groups

GROUP = "group-1"
INNER_OBJ = {"input_ids": np.arange(256, dtype=np.int64).reshape(4, 64), "loss_fn": "ppo"}
INNER = v1ref.dumps(INNER_OBJ, metadata=RESPONSE_OPTIONS)
S = 1024  # chunk payload size of the hand-made groups
INNER_SHA = hashlib.sha256(INNER).hexdigest()


def chunk_frame(payload: Any, desc: Any, *, kind: str = "request") -> bytes:
    """A chunk frame as the deployed writer makes it; ``payload`` bytes or any value."""
    value = {"payload": u8(payload)} if isinstance(payload, bytes) else payload
    return v1ref.dumps(value, metadata={f"{kind}_chunk": desc})


def desc(idx: Any, total: int = 3, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "chunk_idx": idx,
        "total_chunks": total,
        "frame_sha256": INNER_SHA,
        "frame_size_bytes": len(INNER),
        "chunk_group_id": GROUP,
        "operation": "forward-backward",
    }
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def piece(i: int, size: int = S) -> bytes:
    return INNER[i * size : (i + 1) * size]


def std_chunks() -> list[bytes]:
    chunks = v1ref.encode_byte_chunks(
        INNER,
        kind="request",
        operation="forward-backward",
        max_bytes=8192 + S,
        chunk_group_id=GROUP,
        force_chunk=True,
    )
    assert len(chunks) == 3 and chunks[0] == chunk_frame(piece(0), desc(0))
    return chunks


def ok_chunks(
    vid: str,
    origin: str,
    frames: list[bytes],
    ref: str,
    what: str,
    *,
    kind: str = "request",
    value: Any = None,
    **kw: Any,
) -> None:
    add(
        Vector(
            vid,
            "chunks",
            origin,
            ref,
            what,
            frames,
            chunk_kind=kind,
            expected=INNER_OBJ if value is None else value,
            **kw,
        )
    )


def bad_chunks(
    vid: str,
    code: str,
    what: str,
    frames: list[bytes],
    *,
    kind: str = "request",
    origin: str = "hand-built",
    **kw: Any,
) -> None:
    add(
        Vector(
            vid,
            "chunks",
            origin,
            f"§8 {code}",
            what,
            frames,
            chunk_kind=kind,
            error_code=code,
            **kw,
        )
    )


def chunk_groups() -> None:
    c = std_chunks()
    assert len(INNER) % S != 0  # the last standard chunk is short
    ok_chunks(
        "ck-in-order",
        "v1-writer",
        c,
        "§8",
        "3 request chunks (force_chunk, max_bytes = 8192 + 1024, so S = 1024) in order",
    )
    ok_chunks(
        "ck-out-of-order",
        "v1-writer",
        [c[2], c[0], c[1]],
        "§8 order-independent",
        "the same chunks delivered 2, 0, 1",
    )
    ok_chunks(
        "ck-identical-duplicate",
        "v1-writer",
        [c[0], c[1], c[1], c[2]],
        "§8 chunk_duplicate_conflict (identical repeat)",
        "chunk 1 delivered twice with identical bytes: accepted and ignored (the deployed "
        "all-at-once decoder refuses the count)",
        v1_error="V1WireError",
    )
    forced = v1ref.encode_byte_chunks(
        INNER,
        kind="request",
        operation="forward-backward",
        max_bytes=16384,
        chunk_group_id="group-a",
        force_chunk=True,
    )
    assert len(forced) == 1
    ok_chunks(
        "ck-forced-single",
        "v1-writer",
        forced,
        "§8 total_chunks 1",
        "force_chunk: one chunk covering the whole frame (chunk_idx 0, total_chunks 1)",
    )
    fb = v1ref.encode_byte_chunks(
        INNER,
        kind="request",
        operation="fwd-bwd",
        max_bytes=8192 + 1200,
        chunk_group_id="group-fwd-bwd",
        force_chunk=True,
    )
    ok_chunks(
        "ck-fwd-bwd-label",
        "v1-writer",
        fb,
        "§8 operation",
        "the legacy operation label fwd-bwd (S = 1200)",
    )
    res = v1ref.encode_byte_chunks(INNER, kind="result", max_bytes=8192 + 1500, force_chunk=True)
    ok_chunks(
        "ck-result",
        "v1-writer",
        [res[1], res[0]],
        "§8 result_chunk",
        "result chunks: no chunk_group_id, no operation; delivered 1, 0",
        kind="result",
    )
    half = len(INNER) // 2
    assert 2 * half == len(INNER)
    ex = v1ref.encode_byte_chunks(
        INNER, kind="request", max_bytes=8192 + half, chunk_group_id="group-even", force_chunk=True
    )
    ok_chunks(
        "ck-exact-multiple",
        "v1-writer",
        ex,
        "§8",
        f"the frame is exactly 2 x S (S = {half}): the last chunk is full; no operation",
    )
    crc = [
        chunk_frame(piece(i), desc(i, payload_crc32=f"{zlib.crc32(piece(i)):08x}"))
        for i in range(3)
    ]
    ok_chunks(
        "ck-crc32",
        "new-writer",
        crc,
        "§8 payload_crc32",
        "every descriptor carries a correct payload_crc32 (lowercase hex)",
    )
    upper = INNER_SHA.upper()
    ok_chunks(
        "ck-uppercase-hex",
        "hand-built",
        [
            chunk_frame(
                piece(i), desc(i, frame_sha256=upper, payload_crc32=f"{zlib.crc32(piece(i)):08X}")
            )
            for i in range(3)
        ],
        "§8 hex case",
        "every descriptor carries frame_sha256 and payload_crc32 in uppercase hex: compared "
        "case-insensitively (writers emit lowercase)",
        v1_error="V1WireError",
    )
    ok_chunks(
        "ck-mixed-case-sha256",
        "hand-built",
        [chunk_frame(piece(0), desc(0, frame_sha256=upper)), c[1], c[2]],
        "§8 chunk_inconsistent (hex case)",
        "chunk 0's frame_sha256 is uppercase, chunks 1 and 2 lowercase: the same digest, "
        "not chunk_inconsistent",
        v1_error="V1WireError",
    )
    ok_chunks(
        "ck-mixed-operation-labels",
        "hand-built",
        [c[0], chunk_frame(piece(1), desc(1, operation="fwd-bwd")), c[2]],
        "§8 chunk_inconsistent (operation alias)",
        "chunk 1 says fwd-bwd, chunks 0 and 2 forward-backward: labels are compared after "
        "alias resolution, so the group is consistent",
        v1_error="V1WireError",
    )
    ok_chunks(
        "ck-passthrough",
        "v1-writer",
        [INNER],
        "§8 passthrough",
        "a single frame that is not a chunk frame is the whole value",
    )

    plain = v1ref.dumps({"payload": u8(piece(1))})
    bad_chunks(
        "ckbad-descriptor-missing",
        "chunk_descriptor_missing",
        "the second frame of the group has no descriptor",
        [c[0], plain, c[2]],
    )
    res3 = [
        chunk_frame(piece(i), desc(i, chunk_group_id=None, operation=None), kind="result")
        for i in range(3)
    ]
    bad_chunks(
        "ckbad-kind-result-for-request",
        "chunk_kind_mismatch",
        "result_chunk descriptors where request chunks are expected",
        res3,
    )
    bad_chunks(
        "ckbad-kind-mixed",
        "chunk_kind_mismatch",
        "chunk 0 is a request chunk, chunk 1 a result chunk",
        [c[0], res3[1], res3[2]],
    )
    for vid, d, what in [
        ("idx-out-of-range", desc(3), "chunk_idx 3 of 3"),
        ("idx-negative", desc(-1), "chunk_idx -1"),
        ("idx-string", desc("0"), 'chunk_idx "0" (a string)'),
        ("idx-bool", desc(True), "chunk_idx true (a bool)"),
        ("total-zero", desc(0, 0), "total_chunks 0"),
        ("size-missing", desc(0, frame_size_bytes=None), "no frame_size_bytes"),
        ("sha-malformed", desc(0, frame_sha256="abc123"), "frame_sha256 is 6 hex digits"),
        ("sha-not-hex", desc(0, frame_sha256="z" * 64), "frame_sha256 is 64 non-hex chars"),
        ("total-bool", desc(0, True), "total_chunks true (a bool; chunk_idx 0 would fit 1)"),
        ("total-float", desc(0, 3.0), "total_chunks 3.0 (not a JSON integer)"),
        (
            "size-string",
            desc(0, frame_size_bytes=str(len(INNER))),
            "frame_size_bytes as a decimal string",
        ),
        ("crc-malformed", desc(0, payload_crc32="12345"), "payload_crc32 of 5 digits"),
        (
            "crc-not-string",
            desc(0, payload_crc32=zlib.crc32(piece(0))),
            "payload_crc32 is the (correct) CRC as a JSON number",
        ),
        ("group-not-string", desc(0, chunk_group_id=7), "chunk_group_id is a number"),
        ("not-object", [0, 3], "the descriptor is an array"),
    ]:
        bad_chunks(
            f"ckbad-desc-{vid}",
            "chunk_descriptor_invalid",
            f"first chunk: {what}",
            [chunk_frame(piece(0), d), c[1], c[2]],
        )
    for vid, value, what in [
        ("i32", {"payload": np.frombuffer(piece(0), dtype=np.int32)}, "payload is I32"),
        ("2d", {"payload": u8(piece(0)).reshape(2, S // 2)}, "payload is 2-D"),
        ("missing", {"data": u8(piece(0))}, "no payload key"),
        ("extra-key", {"payload": u8(piece(0)), "note": "x"}, "a key beside payload"),
        ("scalar", {"payload": np.array(7, dtype=np.uint8)}, "payload is a 0-dim tensor"),
    ]:
        bad_chunks(
            f"ckbad-payload-{vid}",
            "chunk_payload_invalid",
            f"first chunk: {what}",
            [chunk_frame(value, desc(0)), c[1], c[2]],
        )
    bad_chunks(
        "ckbad-payload-short-middle",
        "chunk_payload_invalid",
        "chunk 1 (not last) holds S - 1 bytes",
        [c[0], chunk_frame(INNER[S : 2 * S - 1], desc(1)), c[2]],
    )
    bad_chunks(
        "ckbad-payload-empty",
        "chunk_payload_invalid",
        "the last chunk's payload is empty (a 0-element U8 tensor)",
        [c[0], c[1], chunk_frame(b"", desc(2))],
    )
    bad_chunks(
        "ckbad-frame-size-last-overruns",
        "frame_size_mismatch",
        "the last chunk holds 5 bytes more than frame_size_bytes leaves for it: 2 * S + "
        "len(last) exceeds frame_size_bytes",
        [c[0], c[1], chunk_frame(piece(2) + b"\x00" * 5, desc(2))],
    )
    bad_chunks(
        "ckbad-too-many-chunks",
        "too_many_chunks",
        "total_chunks 65,537 (one over the default 65,536) with 1-byte chunks",
        [chunk_frame(b"\x00", desc(0, 65537, frame_size_bytes=65537))],
    )
    size = 65536 * 81920
    bad_chunks(
        "ckbad-frame-too-large",
        "frame_too_large",
        "frame_size_bytes 5 GiB (default request limit 4 GiB) in an otherwise consistent "
        "first chunk: 65,536 chunks of 81,920 bytes",
        [chunk_frame(bytes(81920), desc(0, 65536, frame_size_bytes=size))],
    )
    bad_chunks(
        "ckbad-frame-too-large-later-chunk",
        "frame_too_large",
        "chunk 1 claims frame_size_bytes 5 GiB: frame_too_large is checked before "
        "chunk_inconsistent",
        [c[0], chunk_frame(piece(1), desc(1, frame_size_bytes=size))],
    )
    bad_chunks(
        "ckbad-inconsistent-before-payload",
        "chunk_inconsistent",
        "chunk 1 has another chunk_group_id and an I32 payload: chunk_inconsistent is checked "
        "before chunk_payload_invalid",
        [
            c[0],
            chunk_frame(
                {"payload": np.frombuffer(piece(1), dtype=np.int32)},
                desc(1, chunk_group_id="group-2"),
            ),
            c[2],
        ],
    )
    inconsistent: list[tuple[str, dict[str, Any], str]] = [
        ("sha", {"frame_sha256": "0" * 64}, "frame_sha256"),
        ("group", {"chunk_group_id": "group-2"}, "chunk_group_id"),
        ("operation", {"operation": "generate"}, "operation"),
        ("operation-absent", {"operation": None}, "operation (absent)"),
        ("total", {"total_chunks": 4}, "total_chunks"),
        ("size", {"frame_size_bytes": len(INNER) + 1}, "frame_size_bytes"),
    ]
    for vid, over, what in inconsistent:
        bad_chunks(
            f"ckbad-inconsistent-{vid}",
            "chunk_inconsistent",
            f"chunk 1's {what} differs from chunk 0's",
            [c[0], chunk_frame(piece(1), desc(1, **over)), c[2]],
        )
    other = bytes(b ^ 0xFF for b in piece(1))
    bad_chunks(
        "ckbad-duplicate-conflict",
        "chunk_duplicate_conflict",
        "chunk 1 arrives twice with different bytes",
        [c[0], c[1], chunk_frame(other, desc(1)), c[2]],
    )
    bad_chunks(
        "ckbad-checksum",
        "chunk_checksum_mismatch",
        "chunk 1's payload_crc32 is wrong",
        [crc[0], chunk_frame(piece(1), desc(1, payload_crc32="00000000")), crc[2]],
    )
    bad_chunks(
        "ckbad-checksum-before-duplicate",
        "chunk_checksum_mismatch",
        "chunk 1 arrives again with other bytes under its original payload_crc32: "
        "chunk_checksum_mismatch is checked before chunk_duplicate_conflict",
        [
            crc[0],
            crc[1],
            chunk_frame(other, desc(1, payload_crc32=f"{zlib.crc32(piece(1)):08x}")),
            crc[2],
        ],
    )
    bad_chunks(
        "ckbad-missing",
        "chunk_missing",
        "chunks 0 and 2 of 3, then the group is finished",
        [c[0], c[2]],
    )
    bad_chunks(
        "ckbad-frame-size-mismatch",
        "frame_size_mismatch",
        "one chunk of total 1 holding 8 bytes fewer than frame_size_bytes",
        [chunk_frame(INNER[:-8], desc(0, 1))],
    )
    flipped = bytearray(piece(1))
    flipped[10] ^= 0x01
    bad_chunks(
        "ckbad-frame-sha256-mismatch",
        "frame_sha256_mismatch",
        "one bit of chunk 1 flipped: sizes agree, the reassembled SHA-256 does not",
        [c[0], chunk_frame(bytes(flipped), desc(1)), c[2]],
    )


# --------------------------------------------------------------------------- envelopes


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


# --------------------------------------------------------------------------- v1 view and output


def v1_outcome(vec: Vector) -> tuple[str, Any]:
    """``("ok", value)`` or ``("error", class name)`` from the deployed-reader model."""
    try:
        if vec.kind == "frame":
            return "ok", v1ref.loads(vec.payload)
        if vec.kind == "chunks":
            return "ok", v1ref.loads(v1ref.decode_byte_chunks(vec.payload, kind=vec.chunk_kind))
        return "ok", v1ref.decode_envelope(vec.payload)
    except Exception as exc:  # the class is the record
        cls = type(exc)
        local = cls.__module__ in ("builtins", v1ref.__name__)
        return "error", cls.__name__ if local else f"{cls.__module__}.{cls.__name__}"


def frames_of(vec: Vector) -> list[bytes]:
    if vec.kind == "frame":
        return [vec.payload]
    if vec.kind == "chunks":
        return list(vec.payload)
    return []


def index_entry(vec: Vector, files: list[str]) -> dict[str, Any]:
    valid = vec.error_code is None
    out: dict[str, Any] = {
        "id": vec.id,
        "kind": vec.kind,
        "valid": valid,
        "origin": vec.origin,
        "files": files,
    }
    if vec.chunk_kind is not None:
        out["chunk_kind"] = vec.chunk_kind
    if vec.limits is not None:
        out["limits"] = vec.limits
    status, got = v1_outcome(vec)
    if valid:
        out["expected"] = to_typed(vec.expected)
        if vec.kind == "chunks":  # every valid group here carries INNER
            out["frame_sha256"] = INNER_SHA
        if vec.expected_op is not _UNSET:
            out["expected_op"] = to_typed(vec.expected_op)
        want_v1 = out["expected"] if vec.expected_v1 is _UNSET else to_typed(vec.expected_v1)
        if vec.v1_error is not None:
            if (status, got) != ("error", vec.v1_error):
                raise AssertionError(f"{vec.id}: v1 gave {status} {got!r}, not {vec.v1_error}")
            out["v1_error"] = vec.v1_error
        else:
            if status != "ok" or canonical(to_typed(got)) != canonical(want_v1):
                raise AssertionError(f"{vec.id}: v1 view differs: {status} {got!r}")
            if vec.expected_v1 is not _UNSET:
                out["expected_v1"] = want_v1
        for f in frames_of(vec) if vec.origin == "new-writer" else []:
            if pickle_like(int.from_bytes(f[:8], "little")):  # DSSST1.md §5.1
                raise AssertionError(f"{vec.id}: a new-writer header length starts like a pickle")
    else:
        out["error_code"] = vec.error_code
        if vec.alt_error_codes:
            out["alt_error_codes"] = list(vec.alt_error_codes)
        out["v1_error" if status == "error" else "expected_v1"] = (
            got if status == "error" else to_typed(got)
        )
    out["spec_ref"] = vec.spec_ref
    out["description"] = vec.description
    return out


def build() -> None:
    VECTORS.clear()
    for make in (v1_writer_frames, new_writer_frames, invalid_frames, chunk_groups, envelopes):
        make()


def write(out: Path) -> None:
    build()
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for vec in VECTORS:
        if vec.kind == "frame":
            files = [f"{vec.id}.bin"]
            (out / files[0]).write_bytes(vec.payload)
        elif vec.kind == "chunks":
            (out / vec.id).mkdir(exist_ok=True)
            files = [f"{vec.id}/{i:02d}.bin" for i in range(len(vec.payload))]
            for name, data in zip(files, vec.payload, strict=True):
                (out / name).write_bytes(data)
        else:
            files = [f"{vec.id}.json"]
            (out / files[0]).write_text(json.dumps(vec.payload, indent=1) + "\n")
        index.append(index_entry(vec, files))
    text = json.dumps(
        {"format": "dssst1-golden-vectors/1", "vectors": index}, indent=1, ensure_ascii=False
    )
    (out / "index.json").write_text(text + "\n", encoding="utf-8")


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def check(committed: Path) -> list[str]:
    """Differences between a fresh generation and ``committed`` (empty when identical)."""
    with tempfile.TemporaryDirectory() as tmp:
        write(Path(tmp))
        fresh = tree_files(Path(tmp))
    have = {k: v for k, v in tree_files(committed).items() if k not in HAND_WRITTEN}
    problems = [f"missing: {k}" for k in sorted(fresh.keys() - have.keys())]
    problems += [f"stale: {k}" for k in sorted(have.keys() - fresh.keys())]
    problems += [f"differs: {k}" for k in sorted(fresh.keys() & have.keys()) if fresh[k] != have[k]]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=VECTOR_DIR, help="output directory")
    parser.add_argument(
        "--check",
        action="store_true",
        help="regenerate into a temporary directory and diff against --out",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    if args.out.exists():  # drop stale vectors; keep the hand-written README.md
        for child in args.out.iterdir():
            if child.name not in HAND_WRITTEN:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    write(args.out)
    n_valid = sum(v.error_code is None for v in VECTORS)
    print(
        f"wrote {len(VECTORS)} vectors ({n_valid} valid, {len(VECTORS) - n_valid} invalid) "
        f"to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
