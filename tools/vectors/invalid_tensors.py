"""Invalid frames for reader checks R14-R23: tensor entries, dtypes, sizes, offsets, tree."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests import v1ref

from .common import (
    META_X,
    TREE_X,
    XB,
    XE,
    Raw,
    X,
    bad_frame,
    blob,
    dss,
    frame,
    hdr,
    js,
    with_entry,
    with_x,
)


def deep_list(inner: Any, levels: int) -> Any:
    for _ in range(levels):
        inner = [inner]
    return inner


def invalid_tensor_frames() -> None:
    """Invalid frames, second part: R14-R23, in registry order (after invalid_header_frames)."""
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
