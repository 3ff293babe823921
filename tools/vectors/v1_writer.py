"""Valid frames exactly as the deployed (v1) writer emits them, hazards included."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np

from tests import v1ref

from .common import INF, NAN, RESPONSE_OPTIONS, Vector, add, v1_frame


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
