"""The golden-vector case family: every vector of `tests/vectors/index.json` sent as a request body.

- `frame` vectors are the body of `forward-backward`, sent as a one-chunk chunk group
  (PROTOCOL.md §3.5; the empty frame, which no chunk can carry, is sent as the bare body).
- `chunks` vectors are sent frame by frame as they are (HTTP: one POST each; gRPC: one stream).
  Two adjustments keep them meaningful on a live server: at each send every chunk group id in a
  header is replaced by a fresh id of the same length (`rename_groups`: the bytes, offsets and
  hashes are otherwise untouched and vectors sharing `group-1` do not collide), and a vector whose
  first frame is a
  well-formed chunk other than 0 has its chunk 0 moved to the front (§3.5: the server holds no
  state for an unknown group and asks for chunk 0 first).
- inline `envelope` vectors are the `payload` of the `forward` operation (the SDK's fallback for
  `forward`, PROTOCOL.md §11). Event-list envelopes only travel server → client and are listed in
  `NOT_SENDABLE`.

A valid vector must not be refused with a codec code (it may be refused as a body that is not a
forward-backward request). An invalid vector must be refused with its code, mapped to what a server
answers where PROTOCOL.md says so (a conflicting resend is `chunk_group_conflict`, a group closed
with chunks missing is `chunk_group_missing_chunks`).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dssst1
from arctic_sdk.spec.tables import methods as M

from .model import Case, Step
from .values import CaseDataError

# An installed runner reads the copy its wheel carries (hatch_build.py); a checkout, tests/vectors.
PACKAGED_VECTORS = Path(__file__).resolve().parents[1] / "vectors"
CHECKOUT_VECTORS = Path(__file__).resolve().parents[2] / "tests" / "vectors"
DEFAULT_VECTORS = (
    PACKAGED_VECTORS if (PACKAGED_VECTORS / "index.json").exists() else CHECKOUT_VECTORS
)
NOT_SENDABLE = {
    "env-result-chunk-events": "a list of result_chunk events: only a server sends those",
    "env-result-chunk-events-no-sha": "a list of result_chunk events: only a server sends those",
    "envbad-event-sha": "a list of result_chunk events: only a server sends those",
}
SCHEMA_CODES = [
    "invalid_argument",
    "missing_field",
    "dtype_mismatch",
    "shape_mismatch",
    "unsupported_option",
    "invalid_json",
]
# Codes that depend on a reader limit, with the default the vectors were built against.
LIMIT_OF = {
    "header_too_large": "max_header_bytes",
    "too_many_tensors": "max_tensors",
    "tree_too_deep": "max_depth",
    "too_many_chunks": "max_chunks",
    "frame_too_large": "max_frame_bytes",
}
DEFAULTS = {
    "max_header_bytes": 64 << 20,
    "max_tensors": 262_144,
    "max_depth": 64,
    "max_chunks": 65_536,
    "max_frame_bytes": 4 << 30,
}
# Where the spec lets a server answer one of several codes (the ambiguity is named).
ALTERNATIVES: dict[str, list[str]] = {
    # §3.5 (unknown group, chunk != 0 -> restart) vs §8 (index out of range) on the first frame.
    "ckbad-desc-idx-out-of-range": ["chunk_group_restart_required"],
    # a frame without descriptor is a passthrough body over HTTP (§8, last paragraph).
    "ckbad-descriptor-missing": SCHEMA_CODES,
    # chunk 1 names another group: to a server that is chunk 1 of an unknown group.
    "ckbad-inconsistent-group": ["chunk_group_restart_required"],
    "ckbad-inconsistent-before-payload": ["chunk_group_restart_required"],
    # the operation label disagrees with the route: refused as a bad argument is also fine.
    "ckbad-inconsistent-operation": ["invalid_argument"],
    "ckbad-inconsistent-operation-absent": ["invalid_argument"],
    # an empty body: "fewer than 8 bytes" or "no body".
    "r01-empty": ["missing_field"],
}
# Codec code -> what a server answers (PROTOCOL.md §3.5, DSSST1.md §8 last paragraph).
SERVER_CODE = {
    "chunk_duplicate_conflict": "chunk_group_conflict",
    "chunk_inconsistent": "chunk_group_conflict",
}
_GROUP = re.compile(rb"group-[A-Za-z0-9-]+")


def load_index(vectors_dir: Path) -> list[dict[str, Any]]:
    data = json.loads((vectors_dir / "index.json").read_text())
    return list(data["vectors"])


def vector_cases(
    area: str, vectors_dir: Path | None, defaults: Mapping[str, Any], source: str
) -> list[Case]:
    root = vectors_dir or DEFAULT_VECTORS
    if not (root / "index.json").exists():  # never a silently smaller suite
        raise CaseDataError(
            f"{source}: the golden vectors are not at {root} (no index.json); "
            "pass --vectors DIR (tests/vectors of a checkout)"
        )
    out = []
    for v in load_index(root):
        if v["id"] in NOT_SENDABLE:
            continue
        case = _case(area, v, root)
        case.tier = str(defaults.get("tier", "required"))
        case.source = source
        out.append(case)
    return out


def _case(area: str, v: dict[str, Any], root: Path) -> Case:
    vid, kind = v["id"], v["kind"]
    features: list[str] = []
    code = v.get("error_code")
    if v.get("limits"):
        features += [f"limit:{k}=={val}" for k, val in v["limits"].items()]
    elif code in LIMIT_OF:
        features.append(f"limit:{LIMIT_OF[code]}<={DEFAULTS[LIMIT_OF[code]]}")
    if vid in ("v1w-depth-64", "v1w-deep-60"):
        features.append("limit:max_depth>=64")
    if vid in ("ck-crc32", "ckbad-checksum", "ckbad-checksum-before-duplicate"):
        features.append("chunk_checksum")
    expect = _expect(v)
    if kind == "envelope":
        features += [f"route:{M.OPERATION.name}", f"operation_type:{M.FORWARD.operation_type}"]
        envelope = json.loads((root / v["files"][0]).read_text())
        step = {
            "call": M.OPERATION.name,
            "body": {"operation_type": M.FORWARD.operation_type, "payload": envelope},
            "expect": expect,
        }
    elif kind == "chunks":
        features.append(f"route:{M.FORWARD_BACKWARD.name}")
        step = {
            "call": M.FORWARD_BACKWARD.name,
            "raw": {"frames": _chunk_files(v, root)},
            "expect": expect,
        }
    else:
        features.append(f"route:{M.FORWARD_BACKWARD.name}")
        data = (root / v["files"][0]).read_bytes()
        key = "raw" if not data else "body"
        step = {
            "call": M.FORWARD_BACKWARD.name,
            key: {"hex": data.hex()} if not data else {"frame_bytes": data},
            "expect": expect,
        }
    return Case(
        id=f"{area}/vector/{vid}",
        area=area,
        title=v.get("description", ""),
        features=tuple(features),
        job="shared",
        steps=[Step("call", step)],
        spec=str(v.get("spec_ref", "")),
        covers=(code,) if code else (),
    )


def _expect(v: dict[str, Any]) -> dict[str, Any]:
    vid, code = v["id"], v.get("error_code")
    if v["valid"]:
        if v["kind"] == "chunks" and v.get("chunk_kind") == "result":
            return {"error": "chunk_kind_mismatch"}
        if vid == "ck-passthrough":  # §4.3 wants chunk frames over gRPC; §8 allows passthrough
            return {"not_codec_error": {"allow": ["chunk_descriptor_missing"]}}
        return {"not_codec_error": True}
    if code == "chunk_missing":  # HTTP: chunks wait for the rest; gRPC: the stream closed the group
        return {"status": "chunk_cached", "grpc": {"error": "chunk_group_missing_chunks"}}
    code = str(code)
    main = SERVER_CODE.get(code, code)
    codes = [main, *([code] if code != main else []), *ALTERNATIVES.get(vid, [])]
    if vid == "ckbad-descriptor-missing":
        return {"error_any": codes}
    return {"error": main} if len(codes) == 1 else {"error_any": codes}


def _chunk_files(v: dict[str, Any], root: Path) -> list[bytes]:
    frames = [(root / f).read_bytes() for f in v["files"]]
    try:
        first = dssst1.read_chunk_descriptor(frames[0])
    except dssst1.DSSError:
        return frames
    if first is not None and first.chunk_idx != 0:
        for i, f in enumerate(frames):
            try:
                d = dssst1.read_chunk_descriptor(f)
            except dssst1.DSSError:
                continue
            if d is not None and d.chunk_idx == 0:
                return [f, *frames[:i], *frames[i + 1 :]]
    return frames


def rename_groups(frames: list[bytes]) -> list[bytes]:
    """Give every `group-*` id in the frames' headers a fresh id of the same length."""
    names: dict[bytes, bytes] = {}

    def fresh(m: re.Match[bytes]) -> bytes:
        old = m.group(0)
        if old not in names:
            names[old] = b"g" + secrets.token_hex(len(old))[: len(old) - 1].encode()
        return names[old]

    out = []
    for f in frames:
        if len(f) < 8:
            out.append(f)
            continue
        n = int.from_bytes(f[:8], "little")
        end = min(8 + n, len(f))
        out.append(f[:8] + _GROUP.sub(fresh, f[8:end]) + f[end:])
    return out
