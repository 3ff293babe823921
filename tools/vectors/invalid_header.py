"""Invalid frames for reader checks R1-R13: framing, header, metadata, structure, version."""

from __future__ import annotations

import json
import pickle
import struct
import zlib

import numpy as np

from tests import v1ref

from .common import (
    MAX_HEADER,
    META_X,
    TREE_X,
    XB,
    XE,
    Raw,
    bad_frame,
    blob,
    dss,
    frame,
    hdr,
    js,
    with_entry,
    with_x,
)

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


def invalid_header_frames() -> None:
    """Invalid frames, first part: R1-R13, in registry order."""
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
