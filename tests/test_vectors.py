"""The golden vectors in tests/vectors/ are reproducible, complete and say what they claim.

* ``tools/make_vectors.py --check`` regenerates them byte for byte;
* every invalid vector names a code of DSSST1.md §6 / §8 (§9 for envelopes), every code of those
  tables has one, and every reader check R1..R23 has one;
* the deployed-reader model ``tests.v1ref`` decodes each vector as the index records (``expected``,
  ``expected_v1`` or ``v1_error``);
* a literal, unoptimised reading of §6 / §8 / §9 written here (:class:`Oracle`) gives each vector
  its recorded outcome, so a vector cannot silently fail an earlier check than the one it names.

Never imports ``dssst1``: the vectors are the yardstick for it, not the other way round.
"""

from __future__ import annotations

import binascii
import hashlib
import itertools
import json
import math
import re
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from tests import v1ref
from tests.v1ref.typed import canonical, from_typed, to_typed

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "vectors"
SPEC = ROOT / "proto" / "DSSST1.md"
INDEX: list[dict[str, Any]] = json.loads((VECTORS / "index.json").read_text("utf-8"))["vectors"]
BY_ID = {v["id"]: v for v in INDEX}
DESERIALIZE: Callable[[bytes], list[tuple[str, dict[str, Any]]]] = safetensors.deserialize
#: ``N mod 65536`` of header lengths whose first bytes read 80 02 .. 80 05 (DSSST1.md §5.1, §6).
PICKLE_LIKE_N = frozenset({640, 896, 1152, 1408})


def ids(pred: Any) -> list[dict[str, Any]]:
    return [pytest.param(v, id=v["id"]) for v in INDEX if pred(v)]  # type: ignore[misc]


def read(vec: dict[str, Any]) -> Any:
    """A vector's payload: frame bytes, the list of chunk frames, or the envelope JSON."""
    if vec["kind"] == "envelope":
        return json.loads((VECTORS / vec["files"][0]).read_text("utf-8"))
    frames = [(VECTORS / f).read_bytes() for f in vec["files"]]
    return frames[0] if vec["kind"] == "frame" else frames


# --------------------------------------------------------------------------- spec parsing


def spec_sections() -> dict[str, str]:
    parts = re.split(r"^## (\d+)\. .*$", SPEC.read_text("utf-8"), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def table_codes(section: str) -> list[str]:
    """Backticked codes in the ``code`` column of the tables of a section."""
    codes: list[str] = []
    column = None
    for line in section.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if column is None:
            column = cells.index("code") if "code" in cells else -1
        elif column >= 0 and (m := re.fullmatch(r"`([a-z0-9_]+)`", cells[column])):
            codes.append(m.group(1))
    return codes


SECTIONS = spec_sections()
FRAME_CODES = table_codes(SECTIONS["6"])
CHUNK_CODES = table_codes(SECTIONS["8"])
ENVELOPE_CODES = re.findall(r"→ `([a-z0-9_]+)`", SECTIONS["9"])
READER_CHECKS = dict(re.findall(r"^\| (R\d+) \| `([a-z0-9_]+)` \|", SECTIONS["6"], flags=re.M))


def test_spec_tables_parsed() -> None:
    assert len(FRAME_CODES) == 23 and list(READER_CHECKS.values()) == FRAME_CODES
    assert ENVELOPE_CODES == ["base64_invalid"]
    # the §8 table is in check order; Oracle.chunks checks in exactly this order
    assert CHUNK_CODES == [
        "chunk_descriptor_missing",
        "chunk_kind_mismatch",
        "chunk_descriptor_invalid",
        "too_many_chunks",
        "frame_too_large",
        "chunk_inconsistent",
        "chunk_payload_invalid",
        "chunk_checksum_mismatch",
        "chunk_duplicate_conflict",
        "chunk_missing",
        "frame_size_mismatch",
        "frame_sha256_mismatch",
    ]
    assert spec_dtypes() == Oracle.ITEMSIZE


def spec_dtypes() -> dict[str, int]:
    """Name -> item size from the table of §4 (a row may list several names and sizes)."""
    out: dict[str, int] = {}
    for line in SECTIONS["4"].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = re.findall(r"`([A-Z0-9_]+)`", cells[0]) if line.startswith("| `") else []
        sizes = [int(x) for x in cells[1].split()] if names else []
        assert len(names) == len(sizes), line
        out |= dict(zip(names, sizes, strict=True))
    return out


# --------------------------------------------------------------------------- index and files


def test_regeneration_is_byte_identical() -> None:
    tool = ROOT / "tools" / "make_vectors.py"
    proc = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_index_is_well_formed() -> None:
    assert len(BY_ID) == len(INDEX), "duplicate ids"
    listed = {f for v in INDEX for f in v["files"]} | {"index.json", "README.md"}
    on_disk = {p.relative_to(VECTORS).as_posix() for p in VECTORS.rglob("*") if p.is_file()}
    assert on_disk == listed
    for v in INDEX:
        assert v["kind"] in {"frame", "chunks", "envelope"}, v["id"]
        assert v["origin"] in {"v1-writer", "new-writer", "hand-built"}, v["id"]
        assert v["spec_ref"] and v["description"], v["id"]
        assert ("expected" in v) == v["valid"] == ("error_code" not in v), v["id"]
        assert "expected_v1" not in v or "v1_error" not in v, v["id"]
        assert (v["kind"] == "chunks") == ("chunk_kind" in v), v["id"]


def test_every_code_has_an_invalid_vector() -> None:
    named = set(FRAME_CODES) | set(CHUNK_CODES) | set(ENVELOPE_CODES)
    used = {v["error_code"] for v in INDEX if not v["valid"]}
    alts = {c for v in INDEX for c in v.get("alt_error_codes", [])}
    assert used | alts <= named, f"codes not in DSSST1.md: {(used | alts) - named}"
    assert set(FRAME_CODES) | set(CHUNK_CODES) <= used, "codes without a vector"
    refs = {v["spec_ref"] for v in INDEX if not v["valid"] and v["kind"] == "frame"}
    for check, code in READER_CHECKS.items():
        hits = [v for v in INDEX if v["spec_ref"] == check]
        assert hits and all(v["error_code"] == code for v in hits), check
    assert refs <= set(READER_CHECKS) | {"R2"}


def test_required_valid_vectors_exist() -> None:
    valid = {v["id"] for v in INDEX if v["valid"]}
    for vid in [
        "v1w-dtypes",
        "v1w-scalar",
        "v1w-zero-element",
        "v1w-path-collision",
        "v1w-placeholder",
        "v1w-nan-tokens",
        "v1w-int-keys-stringified",
        "nw-collision-free-names",
        "nw-tensor-free-tuples",
        "nw-nonfinite-floats",
        "nw-bytes",
        "hb-dss-empty-referenced",
        "nw-header-unpadded",
        "nw-misaligned-offsets",
        "nw-op-metadata",
        "ck-out-of-order",
        "ck-identical-duplicate",
        "ck-forced-single",
        "ck-fwd-bwd-label",
        "ck-uppercase-hex",
        "ck-mixed-case-sha256",
        "ck-mixed-operation-labels",
        "r15-c64",
        "v1w-header-640-pickle-prefix",
        "nw-header-pickle-length-avoided",
        "hb-op-empty-string",
        "v1w-depth-64",
    ]:
        assert vid in valid, vid
    dtypes = {a["array"]["dtype"] for _, a in BY_ID["v1w-dtypes"]["expected"]["dict"]}
    assert dtypes == set(v1ref.DTYPES) == set(spec_dtypes())
    assert "C64" in {a["array"]["dtype"] for _, a in BY_ID["r15-c64"]["expected"]["dict"]}
    assert "alt_error_codes" not in BY_ID["ckbad-frame-size-mismatch"]


# --------------------------------------------------------------------------- deployed reader


def v1_view(vec: dict[str, Any]) -> tuple[str, Any]:
    payload = read(vec)
    try:
        if vec["kind"] == "frame":
            value = v1ref.loads(payload)
        elif vec["kind"] == "chunks":
            frame = v1ref.decode_byte_chunks(payload, kind=vec["chunk_kind"])
            value = v1ref.loads(frame)
        else:
            value = v1ref.decode_envelope(payload)
    except Exception as exc:
        cls = type(exc)
        local = cls.__module__ in ("builtins", "tests.v1ref")
        return "error", cls.__name__ if local else f"{cls.__module__}.{cls.__name__}"
    return "ok", canonical(to_typed(value))


@pytest.mark.parametrize("vec", ids(lambda v: True))
def test_deployed_reader_view(vec: dict[str, Any]) -> None:
    status, got = v1_view(vec)
    if "v1_error" in vec:
        assert (status, got) == ("error", vec["v1_error"])
    else:
        assert status == "ok", got
        assert got == canonical(vec.get("expected_v1", vec.get("expected")))


@pytest.mark.parametrize("vec", ids(lambda v: v["valid"] and v["kind"] == "frame"))
def test_deployed_read_metadata(vec: dict[str, Any]) -> None:
    op = v1ref.read_metadata(read(vec))
    assert canonical(to_typed(op)) == canonical(vec.get("expected_op", {"dict": []}))


@pytest.mark.parametrize("vec", ids(lambda v: v["origin"] == "v1-writer" and v["kind"] == "frame"))
def test_v1_writer_frames_are_what_safetensors_writes(vec: dict[str, Any]) -> None:
    """v1ref's blob writer is byte-identical to safetensors.numpy.save (with one metadata key;
    safetensors orders two keys at random)."""
    data = read(vec)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n], object_pairs_hook=list)
    meta = dict(header[0][1])
    if [k for k, _ in header] == ["__metadata__", "__metadata__"]:  # a tensor of that name
        e = dict(header[1][1])
        arr = np.frombuffer(data[8 + n :], v1ref.DTYPES[e["dtype"]]).reshape(e["shape"])
        assert safetensors.numpy.save({"__metadata__": arr}, metadata=meta) == data
        return
    tensors = {
        name: np.frombuffer(bytes(info["data"]), v1ref.DTYPES[info["dtype"]]).reshape(info["shape"])
        for name, info in DESERIALIZE(data)
    }
    if len(meta) == 1:
        assert safetensors.numpy.save(tensors, metadata=meta) == data
    else:
        again = safetensors.numpy.save(tensors, metadata=meta)
        m = int.from_bytes(again[:8], "little")
        assert again[:8] == data[:8] and again[8 + m :] == data[8 + n :]
        assert json.loads(again[8 : 8 + m]) == json.loads(data[8 : 8 + n])


def test_v1ref_chunking_semantics() -> None:
    frame = v1ref.dumps({"x": np.arange(3000, dtype=np.uint8)})
    assert v1ref.encode_byte_chunks(frame, kind="request") == [frame]
    assert v1ref.encode_byte_chunks(frame, kind="request", max_bytes=len(frame)) == [frame]
    chunks = v1ref.encode_byte_chunks(frame, kind="request", max_bytes=8192 + 1000)
    assert chunks == [frame]  # not forced and it fits
    chunks = v1ref.encode_byte_chunks(
        frame, kind="request", max_bytes=8192 + 1000, force_chunk=True
    )
    descs = [v1ref.read_byte_chunk_metadata(c) for c in chunks]
    assert [d["chunk_idx"] for d in descs if d] == [0, 1, 2, 3]
    assert all(d and len(d["chunk_group_id"]) == 36 and "operation" not in d for d in descs)
    assert list(descs[0] or {}) == [
        "chunk_idx",
        "total_chunks",
        "frame_sha256",
        "frame_size_bytes",
        "chunk_group_id",
        "kind",
    ]
    assert v1ref.decode_byte_chunks(chunks[::-1], kind="request") == frame
    with pytest.raises(v1ref.V1WireError):
        v1ref.decode_byte_chunks(chunks, kind="result")
    with pytest.raises(v1ref.V1WireError):
        v1ref.decode_byte_chunks(chunks[:3])
    (one,) = v1ref.encode_byte_chunks(frame, kind="result", chunk_group_id="g", force_chunk=True)
    assert v1ref.read_byte_chunk_metadata(one) == {
        "chunk_idx": 0,
        "total_chunks": 1,
        "frame_sha256": hashlib.sha256(frame).hexdigest(),
        "frame_size_bytes": len(frame),
        "kind": "result",
    }
    # an operation label longer than the 8192-byte allowance forces the halving retry
    big = v1ref.encode_byte_chunks(
        frame,
        kind="request",
        operation="o" * 9000,
        max_bytes=8192 + 2000,
        chunk_group_id="g",
        force_chunk=True,
    )
    sizes = [len(v1ref.loads(c)["payload"]) for c in big]
    assert all(len(c) <= 8192 + 2000 for c in big) and sizes[0] in (1000, 500, 250, 125)
    with pytest.raises(v1ref.V1WireError, match="too small"):
        v1ref.encode_byte_chunks(
            frame, kind="request", max_bytes=100, chunk_group_id="g", force_chunk=True
        )
    with pytest.raises(v1ref.V1WireError):
        v1ref.encode_byte_chunks(frame, kind="other", max_bytes=100)


def test_v1ref_codec_semantics() -> None:
    assert v1ref.read_metadata(b"not-a-frame") == {}
    assert v1ref.read_metadata(v1ref.dumps(1)) == {}
    with pytest.raises(v1ref.V1WireError):
        v1ref.loads("not bytes")
    with pytest.raises(v1ref.V1WireError, match="keys must be strings"):
        v1ref.dumps({1: np.zeros(1)})
    assert v1ref.loads(v1ref.dumps({1: 2})) == {"1": 2}
    with pytest.raises(v1ref.V1WireError, match="pickle"):
        v1ref.loads(b"\x80\x04" + b"\x00" * 20)
    with pytest.raises(v1ref.V1WireError, match="not a valid"):
        v1ref.loads(b"\x08" + b"\x00" * 7 + b"{nojson}")


@pytest.mark.parametrize("vec", ids(lambda v: v["valid"] and v["kind"] == "chunks"))
def test_reassembled_frame_hash(vec: dict[str, Any]) -> None:
    whole = Oracle().chunks(read(vec), vec["chunk_kind"])
    assert hashlib.sha256(whole).hexdigest() == vec["frame_sha256"]


def test_typed_notation_round_trips() -> None:
    for vec in INDEX:
        for key in ("expected", "expected_v1", "expected_op"):
            if key in vec:
                assert canonical(to_typed(from_typed(vec[key]))) == canonical(vec[key]), vec["id"]
    assert canonical(to_typed(True)) != canonical(to_typed(1))
    assert canonical(to_typed(-0.0)) != canonical(to_typed(0.0))
    assert canonical(to_typed((1,))) != canonical(to_typed([1]))


# --------------------------------------------------------------------------- new-writer rules


@pytest.mark.parametrize(
    "vec", ids(lambda v: v["origin"] == "new-writer" and v["kind"] != "envelope")
)
def test_new_writer_frames_follow_section_5(vec: dict[str, Any]) -> None:
    for data in [read(vec)] if vec["kind"] == "frame" else read(vec):
        check_section_5(data)
        if vec["kind"] == "chunks":  # §8: writers emit hex digests in lowercase
            (desc,) = v1ref.read_metadata(data).values()
            for key in ("frame_sha256", "payload_crc32"):
                assert desc.get(key, "").lower() == desc.get(key, ""), key


def check_section_5(data: bytes) -> None:
    """The byte-level writer rules of DSSST1.md §5 that a frame shows."""
    n = int.from_bytes(data[:8], "little")
    assert n % 8 == 0, "§1: header padded to a multiple of 8"
    assert n % 65536 not in PICKLE_LIKE_N, "§5.1: N must not start like a pickle"
    assert data[8 : 8 + n].rstrip(b" ").endswith(b"}"), "§1: padding is spaces only"
    header = json.loads(data[8 : 8 + n], parse_constant=_refuse)  # standard JSON only
    meta = header.pop("__metadata__")
    for text in meta.values():
        json.loads(text, parse_constant=_refuse)  # §5.10: standard JSON only
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    sizes = [Oracle.ITEMSIZE[e["dtype"]] for _, e in items]
    assert sizes == sorted(sizes, reverse=True), "§5.1: descending item size"
    for (a, ea), (b, eb) in itertools.pairwise(items):
        assert Oracle.ITEMSIZE[ea["dtype"]] > Oracle.ITEMSIZE[eb["dtype"]] or a < b, "§5.1: names"
    for _, e in items:
        assert e["data_offsets"][0] % Oracle.ITEMSIZE[e["dtype"]] == 0, "§5.1: aligned offsets"
    if not header:
        raise AssertionError("§5.8: a frame holds at least the placeholder")


def test_section_5_checker_catches_pickle_like_lengths() -> None:
    data = BY_ID["nw-header-pickle-length-avoided"]
    frame = read(data)
    check_section_5(frame)
    n = int.from_bytes(frame[:8], "little")
    shorter = (n - 8).to_bytes(8, "little") + frame[8:n] + frame[8 + n :]
    with pytest.raises(AssertionError, match="pickle"):
        check_section_5(shorter)


def _refuse(token: str) -> Any:
    raise ValueError(f"non-standard JSON token {token}")


# --------------------------------------------------------------------------- the oracle


class Refused(Exception):
    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code


class Pairs(list[tuple[str, Any]]):
    """A JSON object as parsed, duplicates kept."""


class Oracle:
    """DSSST1.md §6 (frames), §8 (chunk groups) and §9 (envelopes), read literally.

    Its JSON parser has no depth limit (:func:`loads_deep`), so a ``dss`` string too deep for an
    ordinary parser is parsed and then refused by R19, in R19's place in the order.
    """

    ITEMSIZE: ClassVar[dict[str, int]] = {
        "F64": 8,
        "F32": 4,
        "F16": 2,
        "BF16": 2,
        "F8_E4M3": 1,
        "F8_E5M2": 1,
        "C64": 8,
    }
    ITEMSIZE |= {f"{s}{b}": b // 8 for s in "IU" for b in (8, 16, 32, 64)} | {"BOOL": 1}
    PLACEHOLDER = "__dss_empty__"
    PICKLE = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
    ZIP = b"PK\x03\x04"

    def __init__(self, limits: dict[str, int] | None = None) -> None:
        lim = {"max_header_bytes": 64 << 20, "max_tensors": 262_144, "max_depth": 64}
        lim |= {"max_frame_bytes": 4 << 30, "max_chunks": 65_536} | (limits or {})
        self.lim = lim

    # ---- frames (§6)
    def frame(self, data: bytes) -> tuple[Any, dict[str, Any]]:
        """``(value, op)`` or :class:`Refused`."""
        if len(data) < 8:
            raise Refused("frame_too_short")  # R1
        try:
            header = self._header(data)  # R4-R7
        except Refused as exc:  # R2 / R3 apply only to a frame failing R4-R7, and then win
            if data[:2] in self.PICKLE:
                raise Refused("pickle_refused") from exc
            if data[:4] == self.ZIP:
                raise Refused("zip_refused") from exc
            raise
        self._no_duplicates(header)  # R8
        top = dict(header)
        meta = top.pop("__metadata__", None)
        if not isinstance(meta, Pairs) or not all(isinstance(v, str) for _, v in meta):
            raise Refused("metadata_invalid")  # R9
        meta_d = dict(meta)
        op: Any = {}
        if meta_d.get("op"):  # an empty op string reads as {}
            try:
                op = json.loads(meta_d["op"])  # NaN / Infinity tokens accepted (§2)
            except ValueError as exc:
                raise Refused("metadata_invalid", "op") from exc
            if not isinstance(op, dict):
                raise Refused("metadata_invalid", "op")
        if "dss" not in meta_d:
            raise Refused("structure_missing")  # R10
        try:
            dss = loads_deep(meta_d["dss"])
        except ValueError as exc:
            raise Refused("structure_not_json") from exc  # R11
        if not isinstance(dss, dict) or "v" not in dss or "tree" not in dss:
            raise Refused("structure_not_json")
        if dss["v"] != "DSSST1":
            raise Refused("unsupported_version")  # R12
        n = int.from_bytes(data[:8], "little")
        tensors = self._tensors(top, data[8 + n :])  # R13-R18
        return self._tree(dss["tree"], tensors), op  # R19-R23

    def _header(self, data: bytes) -> Pairs:
        n = int.from_bytes(data[:8], "little")
        if n > self.lim["max_header_bytes"]:
            raise Refused("header_too_large")
        if n == 0 or 8 + n > len(data):
            raise Refused("header_length_invalid")
        try:
            text = data[8 : 8 + n].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Refused("header_not_utf8") from exc
        try:  # strict RFC 8259: no NaN / Infinity; trailing spaces allowed
            header = json.loads(text.rstrip(" "), object_pairs_hook=Pairs, parse_constant=_refuse)
        except ValueError as exc:
            raise Refused("header_not_json") from exc
        if not isinstance(header, Pairs):
            raise Refused("header_not_json")
        return header

    @staticmethod
    def _no_duplicates(value: Any) -> None:
        """R8 in every object of the header: the top level, tensor entries, ``__metadata__``."""
        stack = [value]
        while stack:
            v = stack.pop()
            if isinstance(v, Pairs):
                keys = [k for k, _ in v]
                if len(keys) != len(set(keys)):
                    raise Refused("header_duplicate_key")
                stack.extend(x for _, x in v)
            elif isinstance(v, list):
                stack.extend(v)

    def _tensors(self, entries: dict[str, Any], body: bytes) -> dict[str, np.ndarray]:
        if len(entries) > self.lim["max_tensors"]:
            raise Refused("too_many_tensors")

        def uint(x: Any) -> bool:  # a JSON integer: not 4.0, not true
            return isinstance(x, int) and not isinstance(x, bool) and x >= 0

        for name, e in entries.items():
            fields = dict(e) if isinstance(e, Pairs) else {}
            if (
                not isinstance(e, Pairs)
                or set(fields) != {"dtype", "shape", "data_offsets"}
                or not isinstance(fields["dtype"], str)
                or not isinstance(fields["shape"], list)
                or not all(uint(d) for d in fields["shape"])
                or not isinstance(fields["data_offsets"], list)
                or len(fields["data_offsets"]) != 2
                or not all(uint(o) for o in fields["data_offsets"])
                or fields["data_offsets"][0] > fields["data_offsets"][1]
            ):
                raise Refused("tensor_entry_invalid", name)
            entries[name] = fields
        for name, e in entries.items():
            if e["dtype"] not in self.ITEMSIZE:
                raise Refused("dtype_unknown", name)
        for name, e in entries.items():
            begin, end = e["data_offsets"]
            if math.prod(e["shape"]) * self.ITEMSIZE[e["dtype"]] != end - begin:
                raise Refused("tensor_size_mismatch", name)
        at = 0
        for begin, end in sorted(tuple(e["data_offsets"]) for e in entries.values()):
            if begin != at or end > len(body):  # sorted by (begin, end)
                raise Refused("offsets_invalid")
            at = end
        if at != len(body):
            raise Refused("trailing_bytes")
        out = {}
        for name, e in entries.items():
            begin, end = e["data_offsets"]
            dtype = v1ref.DTYPES[e["dtype"]]
            out[name] = np.frombuffer(body[begin:end], dtype).reshape(e["shape"])
        return out

    @staticmethod
    def depth(tree: Any) -> int:
        """R19's depth, iteratively: the root node is at depth 1, each d/l/u child one deeper,
        and inside a j leaf each JSON array or object one deeper than what holds it (the j
        leaf's own value, when an array or object, one deeper than the j node)."""
        deepest = 0
        stack: list[tuple[Any, int, bool]] = [(tree, 1, True)]  # (item, depth, is a node)
        while stack:
            item, d, is_node = stack.pop()
            deepest = max(deepest, d)
            if not is_node:  # JSON inside a j leaf
                kids = item.values() if isinstance(item, dict) else item
                stack.extend((k, d + 1, False) for k in kids if isinstance(k, list | dict))
            elif isinstance(item, list) and len(item) == 2:
                tag, body = item
                if tag in ("l", "u") and isinstance(body, list):
                    stack.extend((k, d + 1, True) for k in body)
                elif tag == "d" and isinstance(body, list):
                    pairs = [p for p in body if isinstance(p, list) and len(p) == 2]
                    stack.extend((p[1], d + 1, True) for p in pairs)
                elif tag == "j" and isinstance(body, list | dict):
                    stack.append((body, d + 1, False))
        return deepest

    def _tree(self, tree: Any, tensors: dict[str, np.ndarray]) -> Any:
        if self.depth(tree) > self.lim["max_depth"]:
            raise Refused("tree_too_deep")  # R19
        named: set[str] = set()
        value = self._walk(tree, tensors, named)  # R20-R22, node by node, depth first
        for name in tensors:  # R23, after the walk
            if name not in named and name != self.PLACEHOLDER:
                raise Refused("tensor_unreferenced", name)
        return value

    def _walk(self, node: Any, tensors: dict[str, np.ndarray], named: set[str]) -> Any:
        """Check one node's own form (R20; for a t node then R21, R22 and the py flag's fit to
        its tensor), then walk its children in order. A node's own form covers its tag, arity,
        body type, flags and (for d) the pairs and their keys, not the children's forms."""
        if not isinstance(node, list) or not node or not isinstance(node[0], str):
            raise Refused("tree_invalid", repr(node)[:40])
        tag, args = node[0], node[1:]
        if tag == "t" and len(args) in (1, 2) and isinstance(args[0], str):
            flags = args[1] if len(args) == 2 else {}
            if not isinstance(flags, dict) or flags.get("py", "float") not in ("float", "bytes"):
                raise Refused("tree_invalid", "flags")
            scalar, py = flags.get("scalar") is True, flags.get("py")
            if (py == "float" and not scalar) or (py == "bytes" and scalar):
                raise Refused("tree_invalid", "py flag with scalar")
            name = args[0]
            if name not in tensors:
                raise Refused("tensor_missing", name)  # R21
            arr = tensors[name]
            if scalar and list(arr.shape) != [1]:
                raise Refused("scalar_shape_invalid", name)  # R22
            if (py == "float" and arr.dtype != np.float64) or (
                py == "bytes" and (arr.dtype != np.uint8 or arr.ndim != 1)
            ):
                raise Refused("tree_invalid", f"py flag on {name}")
            named.add(name)
            if py == "float":
                return float(arr[0])
            if py == "bytes":
                return arr.tobytes()
            return arr.reshape(()) if scalar else arr
        if tag == "j" and len(args) == 1:
            return args[0]
        if tag in ("l", "u") and len(args) == 1 and isinstance(args[0], list):
            kids = [self._walk(child, tensors, named) for child in args[0]]
            return kids if tag == "l" else tuple(kids)
        if tag == "d" and len(args) == 1 and isinstance(args[0], list):
            for pair in args[0]:  # the d node's own form: [[str key, child], ...]
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                    raise Refused("tree_invalid", "dict pair")
            return {key: self._walk(child, tensors, named) for key, child in args[0]}
        raise Refused("tree_invalid", repr(node)[:40])

    # ---- chunk groups (§8), fed one frame at a time, then finished; checks in table order
    def chunks(self, frames: list[bytes], kind: str) -> bytes:
        if len(frames) == 1:
            value, op = self.frame(frames[0])
            if "request_chunk" not in op and "result_chunk" not in op:
                return frames[0]  # passthrough
        first: dict[str, Any] | None = None
        size_s: int | None = None  # the length every non-last chunk has
        parts: dict[int, bytes] = {}
        other = "result" if kind == "request" else "request"
        for data in frames:
            value, op = self.frame(data)
            if f"{kind}_chunk" not in op:
                raise Refused(
                    "chunk_kind_mismatch" if f"{other}_chunk" in op else "chunk_descriptor_missing"
                )
            d = op[f"{kind}_chunk"]
            self._descriptor(d)
            if d["total_chunks"] > self.lim["max_chunks"]:
                raise Refused("too_many_chunks")
            if d["frame_size_bytes"] > self.lim["max_frame_bytes"]:
                raise Refused("frame_too_large")
            first = first or d
            if _group_key(d) != _group_key(first):
                raise Refused("chunk_inconsistent")
            if (
                not isinstance(value, dict)
                or set(value) != {"payload"}
                or not isinstance(value["payload"], np.ndarray)
                or value["payload"].dtype != np.uint8
                or value["payload"].ndim != 1
            ):
                raise Refused("chunk_payload_invalid")
            payload = value["payload"].tobytes()
            idx, total = d["chunk_idx"], d["total_chunks"]
            if not payload:
                raise Refused("chunk_payload_invalid", "empty")
            if idx != total - 1:
                size_s = len(payload) if size_s is None else size_s
                if len(payload) != size_s:
                    raise Refused("chunk_payload_invalid", "non-last chunks differ in length")
            if "payload_crc32" in d and int(d["payload_crc32"], 16) != zlib.crc32(payload):
                raise Refused("chunk_checksum_mismatch")
            if idx in parts:
                if parts[idx] != payload:
                    raise Refused("chunk_duplicate_conflict")
                continue  # an identical repeat is ignored
            parts[idx] = payload
        assert first is not None
        total = first["total_chunks"]
        if set(parts) != set(range(total)):
            raise Refused("chunk_missing")
        if (total - 1) * (size_s or 0) + len(parts[total - 1]) != first["frame_size_bytes"]:
            raise Refused("frame_size_mismatch")
        whole = b"".join(parts[i] for i in range(total))
        if hashlib.sha256(whole).hexdigest() != first["frame_sha256"].lower():
            raise Refused("frame_sha256_mismatch")
        return whole

    @staticmethod
    def _descriptor(d: Any) -> None:
        def is_int(x: Any) -> bool:  # a JSON integer: not true, not "0", not 3.0
            return isinstance(x, int) and not isinstance(x, bool)

        def hex_digits(x: Any, n: int) -> bool:
            return isinstance(x, str) and re.fullmatch(f"[0-9a-fA-F]{{{n}}}", x) is not None

        ok = (
            isinstance(d, dict)
            and all(is_int(d.get(k)) for k in ("chunk_idx", "total_chunks", "frame_size_bytes"))
            and d["total_chunks"] >= 1
            and 0 <= d["chunk_idx"] < d["total_chunks"]
            and d["frame_size_bytes"] >= 0
            and hex_digits(d.get("frame_sha256"), 64)
            and all(isinstance(d.get(k, ""), str) for k in ("chunk_group_id", "operation"))
            and ("payload_crc32" not in d or hex_digits(d["payload_crc32"], 8))
        )
        if not ok:
            raise Refused("chunk_descriptor_invalid")

    # ---- envelopes (§9)
    def envelope(self, obj: Any) -> Any:
        def b64(text: str) -> bytes:  # strict: standard alphabet, correct padding, nothing else
            try:
                return binascii.a2b_base64(text.encode("ascii"), strict_mode=True)
            except (UnicodeEncodeError, binascii.Error) as exc:
                raise Refused("base64_invalid") from exc

        if isinstance(obj, dict):
            return self.frame(b64(obj["payload_b64"]))[0]
        frames = []
        for event in obj:
            data = b64(event["payload_b64"])
            sha = event.get("payload_sha256")
            if sha is not None and hashlib.sha256(data).hexdigest() != sha.lower():
                raise Refused("chunk_checksum_mismatch")
            frames.append(data)
        return self.frame(self.chunks(frames, "result"))[0]


def _group_key(d: dict[str, Any]) -> tuple[Any, ...]:
    """What chunk_inconsistent compares: hex case-insensitively, operation after aliasing."""
    op = d.get("operation")
    return (
        d["total_chunks"],
        d["frame_sha256"].lower(),
        d["frame_size_bytes"],
        d.get("chunk_group_id"),
        "forward-backward" if op == "fwd-bwd" else op,
    )


def loads_deep(text: str) -> Any:
    """``json.loads`` (NaN / Infinity accepted) without a nesting limit: parsed on a thread with
    a large stack and a high recursion limit, so any depth up to what memory holds parses."""
    result: list[Any] = []

    def run() -> None:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 200_000))
        try:
            result.append(json.loads(text))
        except Exception as exc:  # handed to the caller
            result.append(exc)
        finally:
            sys.setrecursionlimit(limit)

    try:
        return json.loads(text)
    except RecursionError:
        pass
    old = threading.stack_size(256 << 20)
    try:
        worker = threading.Thread(target=run)
        worker.start()
        worker.join()
    finally:
        threading.stack_size(old)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def oracle_outcome(vec: dict[str, Any]) -> tuple[str, Any]:
    oracle = Oracle(vec.get("limits"))
    payload = read(vec)
    try:
        if vec["kind"] == "frame":
            value, op = oracle.frame(payload)
            return "ok", (canonical(to_typed(value)), canonical(to_typed(op)))
        if vec["kind"] == "chunks":
            value = oracle.frame(oracle.chunks(payload, vec["chunk_kind"]))[0]
        else:
            value = oracle.envelope(payload)
    except Refused as exc:
        return "error", exc.code
    return "ok", (canonical(to_typed(value)), None)


@pytest.mark.parametrize("vec", ids(lambda v: True))
def test_literal_reading_of_the_spec_agrees(vec: dict[str, Any]) -> None:
    status, got = oracle_outcome(vec)
    if vec["valid"]:
        assert status == "ok", got
        assert got[0] == canonical(vec["expected"])
        if vec["kind"] == "frame":
            assert got[1] == canonical(vec.get("expected_op", {"dict": []}))
    else:
        assert status == "error", "the oracle accepts an invalid vector"
        assert got in [vec["error_code"], *vec.get("alt_error_codes", [])]
