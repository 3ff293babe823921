"""Server-side protocol settings: limits, features and how answers are given."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MiB = 1024 * 1024


def token_digest(token: str) -> str:
    """The sha256 hex digest a server may keep instead of a token (`token_sha256`)."""
    return hashlib.sha256(token.encode()).hexdigest()


_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


def parse_tokens(lines: Iterable[str]) -> frozenset[str]:
    """Token digests from lines: `sha256:<hex>` (a digest) or a plaintext token (hashed here).

    Blank lines and `#` comments are skipped; a line may end in `# owner` to say whose it is.
    """
    out: set[str] = set()
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _DIGEST.match(line)
        out.add(m.group(1) if m else token_digest(line))
    return frozenset(out)


@dataclass(frozen=True)
class ProtocolLimits:
    """Advertised in the capabilities document (`Limits` in jobs.proto)."""

    max_body_bytes: int = 60 * MiB
    max_chunk_bytes: int = 60 * MiB
    max_header_bytes: int = 64 * MiB
    max_frame_bytes: int = 4 * 1024 * MiB
    max_chunks: int = 65_536
    max_tensors: int = 262_144
    max_depth: int = 64
    max_grpc_message_bytes: int = 4 * MiB
    retention_seconds: int = 24 * 3600
    sequence_gap_timeout_seconds: float = 60.0
    # Results whose DSSST1 frame is larger travel as result_chunk events, not inline.
    max_inline_result_bytes: int = 8 * MiB
    # Chunk frame size of result_chunk events.
    result_chunk_bytes: int = 4 * MiB
    default_max_events: int = 16
    max_events: int = 512
    # Chunk bytes incomplete request chunk groups may hold (allocated as they arrive), per job
    # and over the server; past either, a chunk is 429 rate_limited (PROTOCOL.md §3.5).
    max_open_chunk_bytes_per_job: int = 4 * 1024 * MiB
    max_open_chunk_bytes: int = 8 * 1024 * MiB
    # An incomplete group idle this long is dropped (its later chunks: restart required).
    chunk_group_ttl_seconds: int = 3600
    # HTTP read timeouts: headers (and an idle keep-alive connection) / a request body.
    header_read_timeout_seconds: float = 15.0
    body_read_timeout_seconds: float = 300.0
    # Sub-jobs one CreateJob may configure.
    max_sub_jobs: int = 16
    # Sampling requests (generate, OpenAI completions) one job may have queued or running; past
    # it a call is refused with 429 `rate_limited` and `Retry-After` (0 = no bound).
    max_sampling_requests_per_job: int = 256

    @property
    def frame_bytes(self) -> int:
        """The largest request frame that can arrive (advertised as `max_frame_bytes`): the
        codec's `max_frame_bytes`, or less where the chunk budgets cannot hold a group that
        large (such a group is refused at its first chunk: `chunk_groups.py`)."""
        return min(
            self.max_frame_bytes, self.max_open_chunk_bytes_per_job, self.max_open_chunk_bytes
        )


@dataclass(frozen=True)
class ProtocolConfig:
    """How a server speaks the protocol; business logic lives in the servicer."""

    server: str = "arctic"
    server_version: str = "0.1.0"
    limits: ProtocolLimits = field(default_factory=ProtocolLimits)
    # Accepted bearer tokens; empty = no auth.
    tokens: frozenset[str] = frozenset()
    # Accepted tokens as sha256 hex digests (`token_digest`), so a server need not hold them in
    # plaintext; auth is on when `tokens` or `token_sha256` is non-empty.
    token_sha256: frozenset[str] = frozenset()
    # Data-plane requests one token may have pending or running at once (0 = no limit); past it
    # a call is refused with 429 `rate_limited`, `Retry-After` and `details.queue_position`.
    max_inflight_per_token: int = 0
    # "inline": wait for every call (200); "async": answer 202 at once, except that an
    # inline_preferred op waits up to inline_wait_seconds; "auto": every op waits up to
    # inline_wait_seconds, then 202.
    answer_mode: str = "auto"
    inline_wait_seconds: float = 2.0
    idempotency: bool = True
    sequencing: bool = True
    octet_results: bool = True
    chunk_checksum: bool = True
    leases: bool = False
    lease_default_seconds: int = 0
    lease_max_seconds: int = 0
    grpc_port: int = 0
    openai: bool = False
    # /metrics (`metrics_http.py`): with auth on, served only to these operator tokens (sha256
    # digests); `metrics_port` (0 = a free port) also serves it without auth on a listener of
    # its own at `metrics_host` (None: no such listener).
    metrics_token_sha256: frozenset[str] = frozenset()
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.answer_mode not in {"inline", "async", "auto"}:
            raise ValueError(
                f"answer_mode: {self.answer_mode!r} is not one of 'inline', 'async', 'auto'"
            )
