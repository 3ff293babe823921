"""The capabilities document (PROTOCOL.md §5), and the defaults for servers that lack it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..spec.model import STANDARD_CONFIG_KEYS, Fallback, MethodInfo
from ..spec.tables import methods as M

MiB = 1024 * 1024

# PROTOCOL.md §5: a server without the capabilities route (the deployed Cortex).
_DEPLOYED_ROUTES = frozenset(
    m.name
    for m in (
        M.FORWARD_BACKWARD,
        M.GENERATE,
        M.STEP,
        M.SAVE_CHECKPOINT,
        M.LOAD_CHECKPOINT,
        M.OPERATION,
    )
)
# Every operation type the method table falls back to, and the deployed `tail-logs`.
_DEPLOYED_OPERATION_TYPES = frozenset(
    {m.operation_type for m in M.METHODS if m.operation_type} | {"tail-logs"}
)


def config_keys_of(doc: Mapping[str, Any]) -> dict[str, frozenset[str]]:
    """The sub-job config keys a capabilities document advertises (absent: the standard)."""
    keys = doc.get("config_keys") or {}
    return {
        role: frozenset(str(k) for k in keys[role]) if keys.get(role) else std
        for role, std in STANDARD_CONFIG_KEYS.items()
    }


@dataclass(frozen=True)
class Capabilities:
    """What a server offers; `discovered` is False for the §5 defaults."""

    routes: frozenset[str]
    operation_types: frozenset[str] = frozenset()
    idempotency: bool = False
    sequencing: bool = False
    octet_results: bool = False
    chunk_checksum: bool = False
    leases: bool = False
    grpc: bool = False
    grpc_port: int = 0
    max_body_bytes: int = 60 * MiB
    max_chunk_bytes: int = 60 * MiB
    max_grpc_message_bytes: int = 4 * MiB
    max_frame_bytes: int = 4096 * MiB
    max_chunks: int = 65_536
    discovered: bool = False
    server: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def deployed(cls) -> Capabilities:
        """The defaults of PROTOCOL.md §5 for a server without `GET /capabilities`."""
        return cls(routes=_DEPLOYED_ROUTES, operation_types=_DEPLOYED_OPERATION_TYPES)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Capabilities:
        feats = doc.get("features") or {}
        lim = doc.get("limits") or {}

        def num(name: str, default: int) -> int:
            value = lim.get(name)
            return int(value) if isinstance(value, int | float) and value > 0 else default

        return cls(
            routes=frozenset(str(r) for r in doc.get("routes") or ()),
            operation_types=frozenset(str(t) for t in doc.get("operation_types") or ()),
            idempotency=bool(feats.get("idempotency")),
            sequencing=bool(feats.get("sequencing")),
            octet_results=bool(feats.get("octet_results")),
            chunk_checksum=bool(feats.get("chunk_checksum")),
            leases=bool(feats.get("leases")),
            grpc=bool(feats.get("grpc")),
            grpc_port=int(feats.get("grpc_port") or 0),
            max_body_bytes=num("max_body_bytes", 60 * MiB),
            max_chunk_bytes=num("max_chunk_bytes", 60 * MiB),
            max_grpc_message_bytes=num("max_grpc_message_bytes", 4 * MiB),
            max_frame_bytes=num("max_frame_bytes", 4096 * MiB),
            max_chunks=num("max_chunks", 65_536),
            discovered=True,
            server=str(doc.get("server") or ""),
            raw=dict(doc),
        )

    def has_route(self, method: MethodInfo) -> bool:
        """Whether the server serves `method` on its own route.

        Only data-plane ops and ops with a fallback are checked: the job control plane and
        polls exist on every server (the §5 defaults list data-plane routes only).
        """
        if method.fallback is Fallback.NONE and (
            method.protocol or method.service != M.FORWARD_BACKWARD.service
        ):
            return True
        return method.name in self.routes
