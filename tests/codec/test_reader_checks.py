"""Reader checks R1-R23 (DSSST1.md §6): each code from a crafted frame, and their order."""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from typing import Any

import numpy as np
import pytest

import dssst1
from dssst1 import ErrorCode as E
from dssst1 import Limits

from .helpers import code_of, dss, frame_of, raw_frame

I64_2 = ("I64", [2], bytes(16))
TREE_X = ["d", [["x", ["t", "x"]]]]


def ok_header(**entries: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"__metadata__": dss(["d", [[k, ["t", k]] for k in entries]])}
    header.update(entries)
    return header


def entry(dtype: Any = "I64", shape: Any = (2,), offsets: Any = (0, 16)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def check(frame: Any, code: E, limits: Limits | None = None) -> dssst1.DSSError:
    with pytest.raises(dssst1.DSSError) as info:
        dssst1.loads(frame, limits=limits)
    assert info.value.code is code, str(info.value)
    assert info.value.path and info.value.expected
    return info.value


def test_valid_frame_helpers_decode() -> None:
    assert dssst1.loads(raw_frame(ok_header(x=entry()), bytes(16)))["x"].shape == (2,)


# R1-R5 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"", b"\x00", b"1234567"])
def test_r1_frame_too_short(data: bytes) -> None:
    check(data, E.FRAME_TOO_SHORT)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_r2_pickle_refused(protocol: int) -> None:
    check(pickle.dumps({"a": np.zeros(3)}, protocol=protocol), E.PICKLE_REFUSED)


def test_r2_spares_a_valid_frame_whose_length_looks_like_a_pickle() -> None:
    # N = 0x0280 starts the frame with 80 02; the deployed writer makes such frames (rule 1).
    for n in (0x0280, 0x0380, 0x0480, 0x0580):
        header = json.dumps(ok_header(x=entry())).encode()
        header += b" " * (n - len(header))
        frame = raw_frame(header, bytes(16), pad=False)
        assert frame[:2] in (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
        assert dssst1.loads(frame)["x"].tolist() == [0, 0]


def test_r3_zip_refused() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", b"x" * 100)
    check(buf.getvalue(), E.ZIP_REFUSED)


def test_r4_header_too_large() -> None:
    check((64 * 1024 * 1024 + 1).to_bytes(8, "little") + b"{}", E.HEADER_TOO_LARGE)
    check((2**64 - 1).to_bytes(8, "little"), E.HEADER_TOO_LARGE)
    frame = raw_frame(ok_header(x=entry()), bytes(16))
    check(frame, E.HEADER_TOO_LARGE, Limits(max_header_bytes=16))


def test_r5_header_length_invalid() -> None:
    check(bytes(8), E.HEADER_LENGTH_INVALID)
    check(bytes(16), E.HEADER_LENGTH_INVALID)
    check(raw_frame("{}", length=100), E.HEADER_LENGTH_INVALID)


# R6-R8 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b'{"a":"\xff"}', b'{"a":"\xed\xa0\x80"}', b"\xc3"])
def test_r6_header_not_utf8(raw: bytes) -> None:
    check(raw_frame(raw), E.HEADER_NOT_UTF8)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "garbage",
        '{"a": NaN}',
        '{"a": Infinity}',
        '{"a":',
        "123",
        '"s"',
        "{}x",
        "\x00{}",
        "[" * 100_000,
    ],
    ids=lambda t: t[:12],
)
def test_r7_header_not_json(text: str) -> None:
    check(raw_frame(text), E.HEADER_NOT_JSON)


def test_r7_tolerates_json_whitespace_around_the_object() -> None:
    text = json.dumps(ok_header(x=entry()))
    assert dssst1.loads(raw_frame("\n\t " + text + "\r\n", bytes(16)))["x"].shape == (2,)


def test_r8_header_duplicate_key() -> None:
    text = json.dumps(ok_header(x=entry()))
    dup_top = text[:-1] + ',"x":' + json.dumps(entry()) + "}"
    assert check(raw_frame(dup_top, bytes(16)), E.HEADER_DUPLICATE_KEY).path == "header['x']"
    dup_entry = text.replace('"dtype": "I64"', '"dtype": "I64", "dtype": "I64"')
    check(raw_frame(dup_entry, bytes(16)), E.HEADER_DUPLICATE_KEY)
    dup_meta = text.replace('"__metadata__": {', '"__metadata__": {"dss": "x", ')
    check(raw_frame(dup_meta, bytes(16)), E.HEADER_DUPLICATE_KEY)
    # R7 comes first: not an object, or not valid JSON at all
    check(raw_frame('[{"a":1,"a":2}]'), E.HEADER_NOT_JSON)
    check(raw_frame('{"a":1,"a":2'), E.HEADER_NOT_JSON)
    # R8 comes before R9
    check(raw_frame('{"a":1,"a":2}'), E.HEADER_DUPLICATE_KEY)


# R9-R13 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta",
    [None, [], "s", {"dss": 1}, {"dss": "{}", "other": {"a": 1}}, {"dss": "x", "op": "not json"}],
    ids=repr,
)
def test_r9_metadata_invalid(meta: Any) -> None:
    header: dict[str, Any] = {"x": entry()}
    if meta is not None:
        header["__metadata__"] = meta
    check(raw_frame(header, bytes(16)), E.METADATA_INVALID)


@pytest.mark.parametrize("op", ["[1]", '"s"', "1", "{", "null"])
def test_r9_op_not_an_object(op: str) -> None:
    header = ok_header(x=entry())
    header["__metadata__"]["op"] = op
    check(raw_frame(header, bytes(16)), E.METADATA_INVALID)
    assert code_of(dssst1.read_metadata, raw_frame(header, bytes(16))) == E.METADATA_INVALID
    assert dssst1.peek_metadata(raw_frame(header, bytes(16))) == {}


def test_r10_structure_missing() -> None:
    check(raw_frame({"__metadata__": {}, "x": entry()}, bytes(16)), E.STRUCTURE_MISSING)
    check(raw_frame({"__metadata__": {"op": "{}"}}), E.STRUCTURE_MISSING)


@pytest.mark.parametrize("text", ["not json", "[1]", '{"v": "DSSST1"}', '{"tree": ["j", 1]}', "{"])
def test_r11_structure_not_json(text: str) -> None:
    check(raw_frame({"__metadata__": {"dss": text}, "x": entry()}, bytes(16)), E.STRUCTURE_NOT_JSON)


@pytest.mark.parametrize("v", ["DSSST2", "dssst1", 1, None, ["DSSST1"]])
def test_r12_unsupported_version(v: Any) -> None:
    check(frame_of(TREE_X, {"x": I64_2}, v=v), E.UNSUPPORTED_VERSION)


def test_r13_too_many_tensors() -> None:
    frame = frame_of(["l", [["t", "a"], ["t", "b"]]], {"a": I64_2, "b": I64_2})
    check(frame, E.TOO_MANY_TENSORS, Limits(max_tensors=1))
    assert len(dssst1.loads(frame, limits=Limits(max_tensors=2))) == 2


# R14-R18 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        [1, 2],
        "entry",
        {"dtype": "I64", "shape": [2]},
        {**entry(), "extra": 1},
        entry(dtype=5),
        entry(dtype=None),
        entry(shape="2"),
        {"dtype": "I64", "shape": {"a": 1}, "data_offsets": [0, 16]},
        entry(shape=[True, 2]),
        entry(shape=[2.0]),
        entry(shape=[-2]),
        entry(offsets=[0, 16, 16]),
        entry(offsets=[0]),
        entry(offsets=[-1, 15]),
        entry(offsets=[16, 0]),
        entry(offsets=[0.0, 16]),
        entry(shape=[1] * 65, offsets=[0, 8]),
    ],
    ids=lambda b: json.dumps(b)[:40],
)
def test_r14_tensor_entry_invalid(bad: Any) -> None:
    check(raw_frame(ok_header(x=bad), bytes(16)), E.TENSOR_ENTRY_INVALID)


def test_r14_allows_64_dimensions() -> None:
    frame = raw_frame(ok_header(x=entry(shape=[1] * 63 + [2], offsets=[0, 16])), bytes(16))
    assert dssst1.loads(frame)["x"].ndim == 64


@pytest.mark.parametrize("dtype", ["C128", "f32", "float32", "F8_E8M0", "", "i64", "F4"])
def test_r15_dtype_unknown(dtype: str) -> None:
    check(raw_frame(ok_header(x=entry(dtype=dtype)), bytes(16)), E.DTYPE_UNKNOWN)


@pytest.mark.parametrize(
    "shape,offsets,data",
    [
        ([3], [0, 16], 16),
        ([2, 2], [0, 16], 16),
        ([2**40], [0, 16], 16),
        ([2**62, 2**62], [0, 8], 8),
    ],
)
def test_r16_tensor_size_mismatch(shape: list[int], offsets: list[int], data: int) -> None:
    check(
        raw_frame(ok_header(x=entry(shape=shape, offsets=offsets)), bytes(data)),
        E.TENSOR_SIZE_MISMATCH,
    )


def test_r16_zero_dims() -> None:
    frame = raw_frame(ok_header(x=entry(shape=[2**50, 0, 3], offsets=[0, 0])))
    assert dssst1.loads(frame)["x"].shape == (2**50, 0, 3)
    # a zero-element shape no array library can hold is refused up front (not a crash)
    for shape in ([2**62, 0], [2**63, 0], [0, 2**40, 2**40]):
        check(raw_frame(ok_header(x=entry(shape=shape, offsets=[0, 0]))), E.TENSOR_ENTRY_INVALID)


def two(a: list[int], b: list[int], data: int) -> bytes:
    header = ok_header(
        a=entry(shape=[(a[1] - a[0]) // 8], offsets=a),
        b=entry(shape=[(b[1] - b[0]) // 8], offsets=b),
    )
    return raw_frame(header, bytes(data))


@pytest.mark.parametrize(
    "a,b,data",
    [
        ([8, 16], [16, 24], 24),
        ([0, 8], [16, 24], 24),
        ([0, 16], [8, 24], 24),
        ([0, 8], [8, 24], 16),
    ],
    ids=["gap-start", "gap-middle", "overlap", "past-end"],
)
def test_r17_offsets_invalid(a: list[int], b: list[int], data: int) -> None:
    check(two(a, b, data), E.OFFSETS_INVALID)


def test_r17_zero_length_ranges() -> None:
    header = ok_header(x=entry(), e=entry(shape=[0], offsets=[16, 16]))
    assert dssst1.loads(raw_frame(header, bytes(16)))["e"].shape == (0,)
    header = ok_header(x=entry(), e=entry(shape=[0], offsets=[8, 8]))
    check(raw_frame(header, bytes(16)), E.OFFSETS_INVALID)
    header = ok_header(x=entry(), e=entry(shape=[0], offsets=[24, 24]))
    check(raw_frame(header, bytes(16)), E.OFFSETS_INVALID)


def test_r17_entries_in_any_header_order() -> None:
    assert set(dssst1.loads(two([8, 16], [0, 8], 16))) == {"a", "b"}


def test_r18_trailing_bytes() -> None:
    check(raw_frame(ok_header(x=entry()), bytes(17)), E.TRAILING_BYTES)
    check(raw_frame({"__metadata__": dss(["j", 1])}, b"x"), E.TRAILING_BYTES)
    assert dssst1.loads(raw_frame({"__metadata__": dss(["j", 1])})) == 1  # no tensor at all


# R19-R23 -------------------------------------------------------------------------------


def nested(depth: int) -> Any:
    node: Any = ["t", "x"]
    for _ in range(depth - 1):
        node = ["l", [node]]
    return node


def test_r19_tree_too_deep() -> None:
    assert dssst1.loads(frame_of(nested(64), {"x": I64_2})) is not None
    check(frame_of(nested(65), {"x": I64_2}), E.TREE_TOO_DEEP)
    check(frame_of(nested(3), {"x": I64_2}), E.TREE_TOO_DEEP, Limits(max_depth=2))
    deep_dict: Any = ["t", "x"]
    for _ in range(70):
        deep_dict = ["d", [["k", deep_dict]]]
    check(frame_of(deep_dict, {"x": I64_2}), E.TREE_TOO_DEEP)


@pytest.mark.parametrize(
    "tree",
    [
        "x",
        [],
        [1, "x"],
        ["q", []],
        ["t"],
        ["t", 5],
        ["t", "x", {}, 1],
        ["t", "x", []],
        ["t", "x", {"scalar": 1}],
        ["j"],
        ["j", 1, 2],
        ["d", {}],
        ["d", [["a"]]],
        ["d", [[1, ["t", "x"]]]],
        ["d", [["a", ["t", "x"]], ["a", ["t", "x"]]]],
        ["d", [["a", ["t", "x"]]], 3],
        ["l", "x"],
        ["u", {"a": 1}],
        ["t", "x", {"py": "str"}],
        ["t", "x", {"py": 1}],
        ["t", "x", {"py": "float"}],
        ["t", "x", {"py": "float", "scalar": True}],
        ["t", "x", {"py": "bytes"}],
    ],
    ids=lambda t: json.dumps(t)[:40],
)
def test_r20_tree_invalid(tree: Any) -> None:
    check(frame_of(tree, {"x": ("I64", [1], bytes(8))}), E.TREE_INVALID)


def test_r20_py_flags_on_the_right_dtypes() -> None:
    frame = frame_of(["t", "x", {"py": "bytes", "scalar": True}], {"x": ("U8", [1], b"a")})
    check(frame, E.TREE_INVALID)
    frame = frame_of(["t", "x", {"py": "bytes"}], {"x": ("U8", [1, 1], b"a")})
    check(frame, E.TREE_INVALID)
    assert dssst1.loads(frame_of(["t", "x", {"py": "bytes"}], {"x": ("U8", [1], b"a")})) == b"a"
    f64 = np.array([2.5]).tobytes()
    value = dssst1.loads(
        frame_of(["t", "x", {"py": "float", "scalar": True}], {"x": ("F64", [1], f64)})
    )
    assert value == 2.5 and type(value) is float


def test_r20_unknown_flags_are_ignored() -> None:
    frame = frame_of(
        ["t", "x", {"scalar": True, "future": [1], "py2": 0}], {"x": ("F64", [1], bytes(8))}
    )
    assert dssst1.loads(frame).shape == ()
    assert dssst1.loads(frame_of(["t", "x", {"scalar": False}], {"x": I64_2})).shape == (2,)


def test_r21_tensor_missing() -> None:
    check(frame_of(["l", [["t", "x"], ["t", "y"]]], {"x": I64_2}), E.TENSOR_MISSING)
    check(frame_of(["t", "__dss_empty__"], {"x": I64_2}), E.TENSOR_MISSING)


@pytest.mark.parametrize("shape,size", [([2], 16), ([], 8), ([1, 1], 8), ([0], 0)])
def test_r22_scalar_shape_invalid(shape: list[int], size: int) -> None:
    check(
        frame_of(["t", "x", {"scalar": True}], {"x": ("I64", shape, bytes(size))}),
        E.SCALAR_SHAPE_INVALID,
    )
    frame = frame_of(
        ["t", "x", {"scalar": True, "py": "float"}], {"x": ("F64", shape, bytes(size))}
    )
    check(frame, E.SCALAR_SHAPE_INVALID)


def test_r23_tensor_unreferenced_and_the_placeholder() -> None:
    check(frame_of(["t", "x"], {"x": I64_2, "y": I64_2}), E.TENSOR_UNREFERENCED)
    placeholder = ("U8", [1], b"\x00")
    assert dssst1.loads(frame_of(["t", "x"], {"x": I64_2, "__dss_empty__": placeholder})).shape == (
        2,
    )
    # a referenced tensor named like the placeholder is returned, not dropped
    value = dssst1.loads(frame_of(["l", [["t", "__dss_empty__"]]], {"__dss_empty__": placeholder}))
    assert value[0].tolist() == [0]


def test_shared_references_and_nan_tokens_inside_dss() -> None:
    frame = frame_of(["l", [["t", "x"], ["u", [["t", "x"]]], ["j", float("nan")]]], {"x": I64_2})
    assert b"NaN" in frame
    out = dssst1.loads(frame)
    assert out[0].tolist() == out[1][0].tolist() == [0, 0]
    assert out[2] != out[2]
    header = json.loads(raw_frame({})[8:].decode())
    assert header == {}


def test_op_nan_tokens_are_accepted() -> None:
    frame = frame_of(TREE_X, {"x": I64_2}, op='{"a": NaN, "b": -Infinity}')
    op = dssst1.read_metadata(frame)
    assert op["a"] != op["a"] and op["b"] == float("-inf")


# order ---------------------------------------------------------------------------------


def test_order_r14_before_r15_and_r16_across_entries() -> None:
    header = ok_header(a=entry(dtype="BAD"), b=entry(shape=[3]), c=entry(dtype=7))
    check(raw_frame(header, bytes(16)), E.TENSOR_ENTRY_INVALID)
    header = ok_header(a=entry(shape=[3]), b=entry(dtype="BAD"))
    check(raw_frame(header, bytes(16)), E.DTYPE_UNKNOWN)


def test_order_r17_before_r18() -> None:
    check(two([0, 8], [16, 24], 40), E.OFFSETS_INVALID)


def test_order_within_the_tree() -> None:
    # R19 over the whole tree first
    check(frame_of(["l", [["q"], nested(70)]], {"x": I64_2}), E.TREE_TOO_DEEP)
    # then R20-R22 node by node, depth first: the first failing node decides
    check(frame_of(["l", [["t", "nope"], ["q"]]], {"x": I64_2}), E.TENSOR_MISSING)
    check(frame_of(["l", [["q"], ["t", "nope"]]], {"x": I64_2}), E.TREE_INVALID)
    scalar_then_bad = ["l", [["t", "x", {"scalar": True}], ["q"]]]
    check(frame_of(scalar_then_bad, {"x": I64_2}), E.SCALAR_SHAPE_INVALID)
    bad_then_scalar = ["l", [["l", [["q"]]], ["t", "x", {"scalar": True}]]]
    check(frame_of(bad_then_scalar, {"x": I64_2}), E.TREE_INVALID)
    # within one node: form, then the tensor's presence, then its fit, then the scalar shape
    check(frame_of(["t", "nope", {"py": "str"}], {"x": I64_2}), E.TREE_INVALID)
    check(frame_of(["t", "nope", {"py": "float", "scalar": True}], {"x": I64_2}), E.TENSOR_MISSING)
    check(frame_of(["t", "x", {"py": "float", "scalar": True}], {"x": I64_2}), E.TREE_INVALID)
    # R23 after the walk
    unref_then_scalar = ["l", [["t", "x", {"scalar": True}]]]
    check(frame_of(unref_then_scalar, {"x": I64_2, "y": I64_2}), E.SCALAR_SHAPE_INVALID)
    check(frame_of(["l", [["t", "x"], ["q"]]], {"x": I64_2, "y": I64_2}), E.TREE_INVALID)


def test_r19_counts_json_inside_j_leaves() -> None:
    def arrays(n: int) -> Any:
        value: Any = 1
        for _ in range(n):
            value = [value]
        return value

    # the j node at depth 1, its outermost array at depth 2: 63 arrays reach depth 64
    assert dssst1.loads(frame_of(["j", arrays(63)], {})) == arrays(63)
    check(frame_of(["j", arrays(64)], {}), E.TREE_TOO_DEEP)
    check(frame_of(["l", [["j", {"a": arrays(62)}]]], {}), E.TREE_TOO_DEEP)
    assert dssst1.loads(frame_of(["l", [["j", {"a": arrays(61)}]]], {})) == [{"a": arrays(61)}]
    # JSON too deep for the parser: still R19, never a crash or structure_not_json
    deep = '{"v": "DSSST1", "tree": ' + '["l", [' * 5000 + '["j", 1]' + "]]" * 5000 + "}"
    check(raw_frame({"__metadata__": {"dss": deep}}), E.TREE_TOO_DEEP)


def test_order_header_before_tree() -> None:
    check(frame_of(["q"], {"x": ("I64", [3], bytes(16))}), E.TENSOR_SIZE_MISMATCH)
    check(frame_of(["q"], {"x": I64_2}, v="DSSST9"), E.UNSUPPORTED_VERSION)


def test_empty_containers_at_the_depth_limit() -> None:
    node: Any = ["l", []]
    for _ in range(63):
        node = ["u", [node]]
    assert dssst1.loads(frame_of(node, {})) is not None  # the empty l node is at depth 64
    check(frame_of(["l", [node]], {}), E.TREE_TOO_DEEP)
    dnode: Any = ["d", []]
    for _ in range(63):
        dnode = ["d", [["k", dnode]]]
    assert dssst1.loads(frame_of(dnode, {})) is not None
