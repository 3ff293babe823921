"""The HTTP wire (PROTOCOL.md §3): `Exchange` -> `HttpRequest`, `HttpResponse` -> reply.

Routes, verbs and body kinds come from the method table; path parameters are bound from the
exchange, the rest of a body-less op's fields travel as query parameters.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import dssst1

from .. import __version__
from ..errors import ServerError
from ..spec.model import BodyKind, MethodInfo
from ..spec.tables import methods as M
from .capabilities import Capabilities
from .effects import Buffers, ConnectionFailure, HttpRequest, HttpResponse
from .errors_parse import parse_error, retry_after, to_exception
from .replies import ChunkCached, Exchange, Lost, Raw, Refused, Reply, Status, Submitted, Value

OCTET = "application/octet-stream"
JSON = "application/json"
USER_AGENT = f"arctic-sdk/{__version__}"


def is_data_plane(method: MethodInfo) -> bool:
    """Ops answered with a `RequestStatus` / 202 (the TrainingService RPCs)."""
    return method.service == M.FORWARD_BACKWARD.service


def route(method: MethodInfo, params: Mapping[str, str]) -> str:
    """The op's path with its parameters bound (URL-quoted)."""
    return _route(method.http_path, tuple(params.items()))


@functools.lru_cache(maxsize=1024)
def _route(path: str, params: tuple[tuple[str, str], ...]) -> str:
    return path.format(**{k: quote(str(v), safe="") for k, v in params})


def auth_headers(token: str | None) -> dict[str, str]:
    if not token:
        return {}
    return {
        "Authorization": f"Bearer {token}",
        "X-Snowflake-Authorization-Token-Type": "PROGRAMMATIC_ACCESS_TOKEN",
    }


class HttpWire:
    """Builds and parses HTTP exchanges for one server prefix."""

    name = "http"

    def __init__(
        self, prefix: str, token: str | None, redact: Callable[[str], str], tensors: str = "numpy"
    ) -> None:
        self.prefix = prefix.rstrip("/")
        self._auth = auth_headers(token)
        self._redact = redact
        self._tensors = tensors

    # ------------------------------------------------------------------ limits and batching

    def max_chunk_bytes(self, caps: Capabilities) -> int:
        return min(caps.max_chunk_bytes, caps.max_body_bytes)

    def frames_for(self, method: MethodInfo) -> bool:
        """Whether the op's body travels as chunk frames on this wire."""
        return method.body is BodyKind.DSSST1

    @staticmethod
    def batches(chunks: Sequence[Buffers]) -> list[list[Buffers]]:
        """One POST per chunk frame."""
        return [[c] for c in chunks]

    # ------------------------------------------------------------------ requests

    def build(self, ex: Exchange, timeout: float | None) -> HttpRequest:
        method = ex.method
        url = self.prefix + route(method, ex.path_params)
        if ex.query:
            url += "?" + urlencode(list(ex.query))
        headers = {"User-Agent": USER_AGENT, **self._auth}
        body: bytes | Buffers | None = None
        if ex.frames:
            (body,) = ex.frames
            headers["Content-Type"] = OCTET
        elif ex.json_body is not None and method.body is not BodyKind.NONE:
            body = json.dumps(ex.json_body, separators=(",", ":"), default=_json_default).encode()
            headers["Content-Type"] = JSON
        headers["Accept"] = f"{OCTET}, {JSON}" if ex.accept_octet else JSON
        if ex.idempotency_key:
            headers["Idempotency-Key"] = ex.idempotency_key
        if ex.seq is not None:
            headers["X-Arctic-Seq"] = str(ex.seq)
        if ex.sub_job_id:
            headers["X-Arctic-Sub-Job"] = ex.sub_job_id
        if ex.respond_async:
            headers["Prefer"] = "respond-async"
        return HttpRequest(
            method=method.http_method,
            url=url,
            headers=headers,
            body=body,
            op=method,
            path_params=dict(ex.path_params),
            query=tuple(ex.query),
            timeout=timeout,
        )

    # ------------------------------------------------------------------ answers

    def parse(self, ex: Exchange, resp: HttpResponse | ConnectionFailure) -> Reply:
        if isinstance(resp, ConnectionFailure):
            return Lost(resp)
        method = ex.method
        # the request's id (a data-plane answer), else the server's id of this exchange
        rid = resp.headers.get("x-arctic-request-id") or resp.headers.get("x-request-id")
        if resp.status >= 400 or resp.status < 200:
            parsed = parse_error(resp.body, resp.status)
            return Refused(
                to_exception(
                    parsed,
                    status=resp.status,
                    op=method.name,
                    request_id=rid,
                    retry_after_s=retry_after(resp.headers, parsed.details),
                    redact=self._redact,
                )
            )
        if resp.content_type == OCTET:
            if method.response_type == "" and is_data_plane(method):
                return Raw(resp.body)
            try:
                value = dssst1.loads(resp.body, tensors=self._tensors)  # type: ignore[arg-type]
            except dssst1.DSSError as exc:
                return Refused(self._bad_answer(method, f"undecodable DSSST1 answer: {exc}", rid))
            return self._classify(method, value, in_place=True, status=resp.status)
        if not resp.body:
            return Value({})
        try:
            value = json.loads(resp.body)
        except ValueError:
            text = resp.body[:200].decode("utf-8", "replace")
            return Refused(self._bad_answer(method, f"answer is not JSON: {text!r}", rid))
        return self._classify(method, value, in_place=False, status=resp.status)

    def _classify(self, method: MethodInfo, value: Any, *, in_place: bool, status: int) -> Reply:
        if not (is_data_plane(method) or method is M.GET_REQUEST) or not isinstance(value, dict):
            return Value(value)
        if value.get("chunk_cached"):
            return ChunkCached(value)
        if "status" in value:
            return Status(value, in_place=in_place)
        if status == 202 or "request_id" in value:
            return Submitted(str(value.get("request_id", "")), value.get("job_id"))
        return Value(value)

    def _bad_answer(self, method: MethodInfo, message: str, rid: str | None) -> ServerError:
        return ServerError(self._redact(message), code="internal", op=method.name, request_id=rid)


def _json_default(value: Any) -> Any:
    """NumPy scalars and arrays in JSON bodies (e.g. a learning rate computed with NumPy)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
