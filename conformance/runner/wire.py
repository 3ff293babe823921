"""What the runner sends and receives, whatever the transport: `Call`, `Reply`, chunk frames.

A `Call` is one logical request resolved against the method table; a transport turns it into
HTTP requests or one gRPC call and answers `Reply`s. Chunk frames are built here with the codec
(`dssst1.dumps` of `{"payload": U8}` with a `request_chunk` descriptor), so a case controls every
descriptor field, the order, duplicates, drops and corrupted payloads.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import dssst1
from arctic_sdk.spec.model import MethodInfo

from .values import summarize

OCTET = "application/octet-stream"
JSON_TYPE = "application/json"
ERROR_TRAILER = "x-arctic-error-bin"
DEFAULT_CHUNK_BYTES = 1 << 20


@dataclass
class Call:
    """One logical request (a chunk group is one call; HTTP sends it as several requests)."""

    method: MethodInfo | None  # None only with a raw http/grpc override
    job_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case protocol headers
    json_body: Any = None  # JSON-bodied ops (HTTP) / unary messages (gRPC)
    has_json: bool = False
    frames: list[bytes] | None = None  # DSSST1 frames, sent one per request / stream message
    raw_body: bytes | None = None  # HTTP: the exact bytes
    socket_bytes: bytes | None = None  # HTTP: the exact request (line, headers, body) on a socket
    content_type: str | None = None
    content_length: int | None = None  # HTTP: a declared length, no body sent
    accept: str | None = None
    http_method: str | None = None
    http_path: str | None = None  # relative to the prefix (or absolute when it starts with //)
    grpc_path: str | None = None
    timeout: float = 60.0
    summary: str = ""  # the logical body, for failure reports


@dataclass
class Reply:
    """One answer, normalised across transports."""

    transport: str
    status: int | None = None  # HTTP status
    grpc_code: str | None = None  # gRPC status name ("OK" on success)
    body: Any = None  # parsed JSON, decoded DSSST1 value, or raw bytes
    headers: dict[str, str] = field(default_factory=dict)
    sent: str = ""
    received: str = ""
    transport_error: str | None = None  # no answer at all (connection, timeout)
    decode_error: str | None = None  # the answer came but could not be read
    grpc_details: str = ""
    request_status: bool = False  # the body is a RequestStatus (a data-plane answer)

    @property
    def is_error(self) -> bool:
        if self.transport_error is not None:
            return True
        if self.transport == "grpc":
            return self.grpc_code not in (None, "OK")
        return self.status is not None and self.status >= 400

    @property
    def error(self) -> dict[str, Any] | None:
        """The `error` object of an error body, when the answer has one."""
        if isinstance(self.body, Mapping) and isinstance(self.body.get("error"), Mapping):
            return dict(self.body["error"])
        return None

    @property
    def code(self) -> str | None:
        err = self.error
        return str(err.get("code")) if err is not None and "code" in err else None

    def describe_status(self) -> str:
        if self.transport_error is not None:
            return f"no answer ({self.transport_error})"
        head = f"gRPC {self.grpc_code}" if self.transport == "grpc" else f"HTTP {self.status}"
        return f"{head} ({self.code})" if self.code else head

    def display(self) -> str:
        lines = [f"  request:  {self.sent}", f"  response: {self.describe_status()}"]
        if self.grpc_details:
            lines.append(f"  details:  {self.grpc_details[:300]}")
        if self.received:
            lines.append(f"  body:     {self.received}")
        return "\n".join(lines)


def redact(headers: Mapping[str, str]) -> dict[str, str]:
    return {
        k: ("Bearer ***" if k.lower() == "authorization" and v else v) for k, v in headers.items()
    }


def describe_body(call: Call) -> str:
    if call.content_length is not None:
        return f"(no body, Content-Length {call.content_length})"
    if call.frames is not None:
        sizes = [len(f) for f in call.frames]
        value = f" carrying {call.summary}" if call.summary else ""
        return f"{len(sizes)} DSSST1 frame(s) of {sizes[:6]} bytes{value}"
    if call.raw_body is not None:
        return f"{len(call.raw_body)} raw bytes {call.raw_body[:40]!r}"
    if call.has_json:
        return summarize(call.json_body, 300)
    return "(no body)"


# ---------------------------------------------------------------------------- chunk frames


@dataclass
class ChunkPlan:
    """How to send a frame as a chunk group (conformance/cases/README.md, `chunks`)."""

    count: int | None = None  # number of chunks (default: by DEFAULT_CHUNK_BYTES)
    order: Sequence[int] | None = None  # indices in delivery order; repeats and gaps allowed
    corrupt: frozenset[int] = frozenset()  # this index's *last* delivery carries other bytes
    group: str = ""
    operation: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)  # descriptor fields, all chunks
    crc: bool = False  # add payload_crc32
    bad_crc: frozenset[int] = frozenset()  # a wrong payload_crc32 on these indices


def chunk_frames(frame: bytes, plan: ChunkPlan) -> list[bytes]:
    """The chunk frames of `frame` in the plan's delivery order."""
    size = len(frame)
    n = plan.count or max(1, math.ceil(size / DEFAULT_CHUNK_BYTES))
    n = max(1, min(n, size))
    step = math.ceil(size / n)
    parts = [frame[i * step : (i + 1) * step] for i in range(n)]
    parts = [p for p in parts if p]
    n = len(parts)
    sha = hashlib.sha256(frame).hexdigest()
    order = list(plan.order) if plan.order is not None else list(range(n))
    last = {idx: pos for pos, idx in enumerate(order)}
    out: list[bytes] = []
    for pos, idx in enumerate(order):
        payload = parts[idx % n]
        if idx in plan.corrupt and last[idx] == pos:
            payload = bytes([payload[0] ^ 0xFF]) + payload[1:]
        desc: dict[str, Any] = {
            "chunk_idx": idx,
            "total_chunks": n,
            "frame_sha256": sha,
            "frame_size_bytes": size,
            "chunk_group_id": plan.group,
        }
        if plan.operation is not None:
            desc["operation"] = plan.operation
        if plan.crc or idx in plan.bad_crc:
            crc = zlib.crc32(payload) ^ (0xFFFF if idx in plan.bad_crc else 0)
            desc["payload_crc32"] = f"{crc & 0xFFFFFFFF:08x}"
        desc.update(plan.overrides)
        value = {"payload": np.frombuffer(payload, dtype=np.uint8)}
        out.append(dssst1.dumps(value, metadata={"request_chunk": desc}))
    return out


def assemble_result(frames: Sequence[bytes]) -> Any:
    """The value of answer frames: a result chunk group, or plain frames (one value each)."""
    if not frames:
        return None
    if dssst1.read_chunk_descriptor(frames[0]) is None:
        values = [dssst1.loads(f) for f in frames]
        return values[0] if len(values) == 1 else values
    asm = dssst1.ChunkAssembler(kind="result")
    whole = None
    for f in frames:
        whole = asm.feed(f)
    if whole is None:
        raise ValueError(f"the answer's result chunk group is incomplete: missing {asm.missing()}")
    return dssst1.loads(bytes(whole))


# ---------------------------------------------------------------------------- hand-built frames


def build_frame(spec: Mapping[str, Any]) -> bytes:
    """A frame built byte by byte (for limits a writer never crosses).

    `{many_tensors: N}`: N zero-length U8 tensors (R13); `{deep: N}`: a structure tree nested N
    levels (R19); `{header_length: N}`: a frame declaring an N-byte header (R4); `{hex: ...}`;
    `{surrogate_key: VALUE}`: `{"\\ud800": VALUE}`, a tree key that escapes a lone surrogate
    (text that is not Unicode; no writer produces it).
    """
    if "hex" in spec:
        return bytes.fromhex(str(spec["hex"]))
    if "header_length" in spec:
        return int(spec["header_length"]).to_bytes(8, "little") + b"{" + b" " * 15
    if "many_tensors" in spec:
        n = int(spec["many_tensors"])
        entry = '"t%d":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'
        dss = json.dumps(json.dumps({"v": "DSSST1", "tree": ["j", None]}))
        head = "{" + ",".join(entry % i for i in range(n)) + f',"__metadata__":{{"dss":{dss}}}}}'
        return _frame(head.encode(), b"")
    if "deep" in spec:
        tree: Any = ["j", 0]
        for _ in range(int(spec["deep"]) - 1):
            tree = ["l", [tree]]
        text = json.dumps({"v": "DSSST1", "tree": tree}, separators=(",", ":"))
        header = {
            "__metadata__": {"dss": text},
            "__dss_empty__": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        }
        return _frame(json.dumps(header, separators=(",", ":")).encode(), b"\x00")
    if "surrogate_key" in spec:
        leaf = json.dumps(["j", spec["surrogate_key"]])
        text = '{"v":"DSSST1","tree":["d",[["\\ud800",' + leaf + "]]]}"
        header = {
            "__metadata__": {"dss": text},
            "__dss_empty__": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        }
        return _frame(json.dumps(header, separators=(",", ":")).encode(), b"\x00")
    raise ValueError(
        f"frame spec {dict(spec)} is not many_tensors, deep, header_length, surrogate_key or hex"
    )


def _frame(header: bytes, data: bytes) -> bytes:
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + data
