"""The plumbing every Tinker route shares: auth (`X-API-Key`), bodies parsed with the SDK's own
pydantic request types, and errors answered in the shapes the 0.38 SDK reads.

Auth: `X-API-Key` (the SDK insists on a `tml-` prefix): `tml-<token>` or `<token>`, judged by
the protocol core's rule against the server's tokens (`auth.py`); a server without tokens
accepts any key. Request bodies are parsed with the SDK's own pydantic request types
(`extra="forbid"`: an unknown field is refused by name).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pydantic
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from . import wire
from .auth import NO_TOKEN, caller_token
from .backend import Backend
from .errors import TinkerError
from .ops import Ops
from .route_table import P
from .sampling import Sampler
from .settings import TinkerSettings
from .state import State
from .store import Store

__all__ = ["P", "RouteBase", "iso", "ttl_s"]

log = logging.getLogger("arctic_servers.tinker")
MAX_JSON = 16 << 20  # a JSON body (decoded); forward_backward's protobuf: the app's limit
_CLOSE = web.RequestKey("tinker_close_connection", bool)


def ttl_s(v: int | None) -> float | None:
    """`ttl_seconds`: the checkpoint's tinker:// path stops resolving (404) after it."""
    if v is None:
        return None
    if int(v) <= 0:
        raise TinkerError(
            400, f"ttl_seconds = {v!r}; expected > 0", "invalid_argument", field="ttl_seconds"
        )
    return float(v)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


class RouteBase:
    def __init__(
        self,
        backend: Backend,
        settings: TinkerSettings,
    ) -> None:
        self.state = State(settings.session_timeout_s)
        self.ops = Ops(self.state, backend, settings)
        self.sampler = Sampler(self.state, backend)
        self._clock: asyncio.Task[None] | None = None
        self.store = Store(settings.state_path, self.state) if settings.state_path else None
        self.restored: dict[str, int] | None = None
        self.settings = settings
        self.encodings: Counter[str] = Counter()  # forward_backward bodies by Content-Encoding

    # ------------------------------------------------------------------ the clock

    CLOCK_S = 1.0

    def start(self) -> None:
        """Start the surface's own clock (idempotent; needs a running loop): sessions whose
        heartbeats stopped expire and their jobs are cancelled when their time is up, not
        when some later request happens to come."""
        if self.store is not None and self.restored is None:
            self.restored = self.store.load()  # before the first request is served
            self.state.changed = self.store.save
            if self.restored:
                log.info("Tinker state restored from %s: %s", self.store.path, self.restored)
        if self._clock is None or self._clock.done():
            self._clock = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            try:
                self.state.expire_sessions(self.ops.end_session)
            except Exception:
                log.exception("the Tinker session clock failed")
            await asyncio.sleep(self.CLOCK_S)

    async def close(self) -> None:
        if self._clock is not None:
            self._clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._clock
        await self.ops.backend.close()
        if self.store is not None:
            self.store.close()

    # ------------------------------------------------------------------ plumbing

    def caller(self, request: web.Request) -> str | object | None:
        return caller_token(request.headers, self.ops.backend.calls.authenticate)

    def _token(self, request: web.Request) -> str | None:
        token = self.caller(request)
        if token is NO_TOKEN:
            raise TinkerError(
                401, "missing or invalid API key: send X-API-Key: tml-<token>", "unauthenticated"
            )
        return token  # type: ignore[return-value]

    async def body(self, request: web.Request, limit: int | None = None) -> bytes:
        """The request body, decoded from its `Content-Encoding` (aiohttp decodes gzip, deflate
        and, with backports.zstd, zstd) and bounded after decoding: past `limit` (default the
        app's `client_max_size`, PROTOCOL.md §13 `max_body_bytes` on our servers) it answers
        413 `body_too_large` having buffered at most the limit, so a zstd bomb costs no more
        memory than an honest body of the limit's size."""
        app_limit = max(int(request.client_max_size) - 1, 0)  # our apps set max_body_bytes + 1
        limit = min(limit or app_limit, app_limit) if app_limit else limit
        enc = request.headers.get("Content-Encoding", "").strip().lower()
        too_large = TinkerError(
            413,
            f"the request body{' (decoded from ' + enc + ')' if enc else ''} is over "
            f"{limit} bytes (PROTOCOL.md §13 max_body_bytes)",
            "body_too_large",
            field="body",
            limit_bytes=limit,
        )
        if limit and request.content_length and request.content_length > limit:
            raise too_large
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            request[_CLOSE] = True
            raise too_large from None
        except RequestPayloadError as exc:
            request[_CLOSE] = True  # aiohttp cannot read on: answer, then close
            request.content.feed_eof()
            msg = " ".join(str(exc).split())
            raise TinkerError(
                400,
                f"the request body does not decode as its Content-Encoding {enc!r}: {msg}",
                "invalid_argument",
                field="body",
            ) from None
        if limit and len(raw) > limit:
            raise too_large
        if not raw and enc not in ("", "identity") and request.content_length:
            raise TinkerError(
                400,
                f"the {request.content_length}-byte {enc} body decoded to nothing "
                "(a truncated frame?)",
                "invalid_argument",
                field="body",
            )
        return raw

    async def _json(self, request: web.Request, model: type[Any]) -> Any:
        raw = await self.body(request, MAX_JSON)
        try:
            return model.model_validate_json(raw or b"{}")
        except pydantic.ValidationError as exc:
            errs = exc.errors()[:5]
            where = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errs)
            field = ".".join(str(x) for x in errs[0]["loc"]) if errs else ""
            raise TinkerError(
                400, f"invalid {model.__name__}: {where}", "invalid_argument", field=field
            ) from None

    async def _free_turn(self, request: web.Request, token: str | None) -> None:
        """Whatever answered a request without queueing it (a refusal by a known route, the
        catch-all of a route this server does not serve, a body that did not parse): when it
        names one of the caller's models and a `seq_id`, that turn is freed — the SDK numbers
        every training call, refused or not, and the model's later calls wait for each turn."""
        if request.method != "POST" or request.get(_CLOSE):
            return
        try:
            raw = await request.read()  # aiohttp keeps what a handler read
        except Exception:
            return
        model_id, seq_id = wire.sequenced(raw, request.content_type)
        m = self.state.models.get(model_id) if model_id and seq_id else None
        if m is not None and m.token == token and seq_id:
            await m.release(seq_id)

    def wrap(self, fn: Callable[..., Any]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            token: str | None = None
            self.start()
            try:
                token = self._token(request)
                return await fn(request, token)  # type: ignore[no-any-return]
            except TinkerError as exc:
                resp = web.json_response(exc.body(), status=exc.status)
            except Exception as exc:  # a protocol error of ours: its status and code
                status = int(getattr(exc, "http_status", 0) or 500)
                if status >= 500:
                    log.exception("tinker route %s failed", request.path)
                body = {"detail": str(exc), "code": str(getattr(exc, "code", "internal"))}
                resp = web.json_response(body, status=status)
            if resp.status != 401:
                await self._free_turn(request, token)
            if request.get(_CLOSE):
                resp.force_close()
            return resp

        return handler
