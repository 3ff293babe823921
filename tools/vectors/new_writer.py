"""Valid frames built byte by byte as a conforming writer (DSSST1.md §5) or one reader rule asks."""

from __future__ import annotations

import numpy as np

from .common import (
    INF,
    META_X,
    NAN,
    RESPONSE_OPTIONS,
    TREE_X,
    XB,
    XE,
    X,
    blob,
    dss,
    entry,
    frame,
    hdr,
    ok_frame,
    u8,
    with_x,
)


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
