"""`/v1/models`, `/v1/chat/completions`, `/v1/completions` (and vLLM's `/tokenize`,
`/detokenize`) over a `Resolver` (aiohttp).

Responses carry vLLM's RL extensions unconditionally: top-level `prompt_token_ids` (chat and
completions; completions also per choice) and per-choice `token_ids`, plus `weight_version`
(the weights that produced the sample). `stream: true` answers Server-Sent Events, one chunk per
group of tokens the sampler produced since the last chunk (each with the `weight_version` that
produced its tokens), then `data: [DONE]`; with
`stream_options.include_usage` a final usage chunk. With `n > 1` the samples stream
concurrently, each chunk naming its choice `index`. vLLM's `stream_interval` k holds a choice's
tokens back until k have piled up (its first tokens and its finish go out at once).

Every completion, streamed or not, holds one of its job's sampling slots while it runs (the
server's `limits.max_sampling_requests_per_job`, shared with protocol `generate` calls: a whole
completion is a `generate` call of the core, which admits it; a stream holds its slot through
`Sampler.admit`); past the bound it is answered 429 `rate_limited` with `Retry-After` before
anything is generated. A completion whose client disconnects (a client-side timeout, a closed
connection) is cancelled where it is, streamed or not: it never starts if it had not, and a
running one is aborted in the engine (`disconnect.py`; a whole completion's core request is
cancelled as an abandoned in-process call).

`add_openai_routes(app, resolver, authenticate=...)` mounts the routes; every route
authenticates its caller with `authenticate` (an `Authorization` header value -> the token, or
`ProtocolError` `unauthenticated`, answered 401 `invalid_api_key`) and passes the token to the
resolver. A server's routes use its protocol core's rule (`CoreCalls.authenticate`); a
stand-alone server of the routes (tests, a proxy) the same rule over its own `tokens` (in clear,
or as sha256 hex digests; `protocol/auth.py`). Errors of the core's calls (its field rules,
per-op checks, limits) are answered in OpenAI's shape with their HTTP status, `code` and the
field as `param`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from ..protocol.auth import accepted_token
from ..protocol.config import token_digest
from ..rules import limits as input_limits
from ..rules.errors import ProtocolError
from . import request_fields
from .disconnect import DisconnectWatch
from .reply_parts import (
    chat_reply,
    envelope,
    finish_reason,
    ignored_header,
    text_logprobs,
    usage,
)
from .requests import chat_request, completion_request, special_tokens
from .sampler import OpenAIError, Resolver, Sampler
from .sessions import SessionStore, session_id
from .streaming import stream_reply
from .tool_calls import ToolCalls, ToolSettings, load_vllm

__all__ = ["add_openai_routes"]

log = logging.getLogger("arctic_servers.openai")
Handler = Callable[[web.Request], Any]
Authenticate = Callable[[str], "str | None"]  # an Authorization header value -> the token


def bearer_auth(tokens: Iterable[str] = (), token_sha256: Iterable[str] = ()) -> Authenticate:
    """The protocol's bearer rule (`protocol/auth.py`) over these tokens; without any, every
    caller is accepted and none told apart (None)."""
    clear, digests = frozenset(tokens), frozenset(token_sha256)
    if not clear and not digests:
        return lambda authorization: None
    return lambda authorization: accepted_token(authorization, clear, digests)


def _owner(token: str | None) -> str:
    """Whose sessions: a digest of the caller's token ("" on a server without auth)."""
    return token_digest(token) if token else ""


def _openai_param(field: str) -> str:
    """The OpenAI field an arctic.v1 generate field stands for (`sampling_params.top_k` is the
    request's `top_k`); other fields as the core named them."""
    return field.removeprefix("sampling_params.")


def _error_type(status: int) -> str:
    """OpenAI's error `type` of an HTTP status."""
    if status >= 500:
        return "server_error"
    return {401: "authentication_error", 403: "permission_error"}.get(
        status, "invalid_request_error"
    )


class OpenAIRoutes:
    def __init__(
        self,
        resolver: Resolver,
        authenticate: Authenticate,
        *,
        tools: ToolSettings | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        self.resolver = resolver
        self.authenticate = authenticate
        self.tool_calls = ToolCalls(tools)
        self.sessions = sessions or SessionStore()
        self.watch = DisconnectWatch()

    def _token(self, request: web.Request) -> str | None:
        try:
            return self.authenticate(request.headers.get("Authorization", ""))
        except ProtocolError as exc:
            raise OpenAIError(
                401,
                f"missing or invalid API key ({exc.message}): send Authorization: Bearer <token>",
                type="authentication_error",
                code="invalid_api_key",
            ) from None

    def until_disconnect(self, fn: Handler) -> Handler:
        """`fn`'s work is cancelled when its client disconnects (`disconnect.py`)."""

        async def handler(request: web.Request) -> Any:
            return await self.watch.run(request, fn(request))

        return handler

    def wrap(self, fn: Handler) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                return await fn(request)  # type: ignore[no-any-return]
            except (ConnectionResetError, asyncio.CancelledError):
                raise  # the client went away mid-stream
            except OpenAIError as exc:
                return web.json_response(exc.body(), status=exc.status)
            except Exception as exc:
                status = int(getattr(exc, "http_status", 0) or 500)
                code = str(getattr(exc, "code", "") or "internal")
                if status >= 500:
                    log.exception("openai route %s failed", request.path)
                details = getattr(exc, "details", None) or {}
                field = details.get("field")
                err = OpenAIError(
                    status,
                    str(getattr(exc, "message", "") or exc) or code,
                    type=_error_type(status),
                    param=_openai_param(str(field)) if field else None,
                    code="invalid_api_key" if code == "unauthenticated" else code,
                )
                headers = {}
                retry = details.get("retry_after_s")
                if status in (429, 503) and retry is not None:  # the clients wait this long
                    headers["Retry-After"] = str(max(0, int(retry)))
                return web.json_response(err.body(), status=status, headers=headers)

        return handler

    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The JSON body under the protocol's input limits (depth, text, numbers)."""
        try:
            body = input_limits.load_json(await request.read(), input_limits.JSON_MAX_DEPTH)
        except ProtocolError as exc:
            field = exc.details.get("field")
            raise OpenAIError(
                400, exc.message, param=str(field) if field else None, code=exc.code
            ) from None
        if not isinstance(body, dict):
            raise OpenAIError(400, "the body must be a JSON object", code="invalid_json")
        return body

    # ------------------------------------------------------------------ routes

    async def list_models(self, request: web.Request) -> web.Response:
        cards = await self.resolver.models(self._token(request))
        data = [
            {
                "id": c.id,
                "object": "model",
                "created": c.created,
                "owned_by": c.owned_by,
                "root": c.root or c.id,
                "parent": None,
                "max_model_len": c.max_model_len or None,
            }
            for c in cards
        ]
        return web.json_response({"object": "list", "data": data})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        token = self._token(request)
        body = await self._body(request)
        sampler = await self.resolver.sampler(str(body.get("model") or ""), token)
        if body.get("tools") or body.get("tool_choice"):
            await asyncio.to_thread(load_vllm)  # the first time: seconds of imports
        sid = session_id(body, request.headers)
        if sid is None:
            return await self._chat(request, body, sampler, None)
        session = self.sessions.open(_owner(token), sid, sampler.model_id)
        async with session.lock:  # one session's turns run one at a time
            return await self._chat(request, body, sampler, session)

    async def _chat(
        self, request: web.Request, body: dict[str, Any], sampler: Sampler, session: Any
    ) -> web.StreamResponse:
        req = chat_request(body, sampler, self.tool_calls, session)
        headers = ignored_header(request, req.ignored)
        if req.stream:
            with sampler.admit():  # a stream is no request of the core: its slot is held here
                return await stream_reply(request, sampler, req, chat=True)
        results, version = await sampler.generate(req.prompts, req.params)  # the core admits it
        return web.json_response(chat_reply(sampler, req, results[0], version), headers=headers)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        token = self._token(request)
        body = await self._body(request)
        sampler = await self.resolver.sampler(str(body.get("model") or ""), token)
        req = completion_request(body, sampler)
        headers = ignored_header(request, req.ignored)
        if req.stream:
            with sampler.admit():  # a stream is no request of the core: its slot is held here
                return await stream_reply(request, sampler, req, chat=False)
        results, version = await sampler.generate(req.prompts, req.params)  # the core admits it
        choices: list[dict[str, Any]] = []
        n_tokens = 0
        for pi, samples in enumerate(results):
            for s in samples:
                prefix = req.echo_text[pi] if req.echo_text else ""
                choices.append(
                    {
                        "index": len(choices),
                        "text": prefix + s.text,
                        "logprobs": text_logprobs(
                            sampler, req, s.token_ids, s.logprobs, len(prefix)
                        ),
                        "finish_reason": finish_reason(s.finish_reason),
                        "stop_reason": s.stop_reason,
                        "token_ids": s.token_ids,
                        "prompt_token_ids": req.prompts[pi],
                    }
                )
                n_tokens += len(s.token_ids)
        out = envelope("text_completion", "cmpl", req, version)
        out["choices"] = choices
        out["usage"] = usage(req.prompts, n_tokens)
        out["prompt_token_ids"] = req.prompts[0]
        return web.json_response(out, headers=headers)

    async def get_session(self, request: web.Request) -> web.Response:
        """A session's token history (`sessions.py`): 404 for another token's or an expired
        one."""
        token = self._token(request)
        sid = session_id({"session_id": request.match_info["session_id"]}, {})
        return web.json_response(self.sessions.get(_owner(token), str(sid)).record())

    async def delete_session(self, request: web.Request) -> web.Response:
        token = self._token(request)
        sid = str(session_id({"session_id": request.match_info["session_id"]}, {}))
        self.sessions.delete(_owner(token), sid)
        return web.json_response({"id": sid, "object": "session", "deleted": True})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's `/tokenize`: `{model, prompt}` or `{model, messages}` → `{tokens, count}`."""
        token = self._token(request)
        body = await self._body(request)
        sampler = await self.resolver.sampler(str(body.get("model") or ""), token)
        if "messages" in body:
            req = chat_request({**body, "max_tokens": 1}, sampler, sample=False)
            ids, ignored = req.prompts[0], req.ignored
        elif isinstance(body.get("prompt"), str):
            ignored = tuple(request_fields.check(body, chat=False))
            ids = sampler.encode(body["prompt"], add_special_tokens=special_tokens(body, True))
        else:
            raise OpenAIError(400, "prompt: expected a string (or messages)", param="prompt")
        return web.json_response(
            {"tokens": ids, "count": len(ids), "max_model_len": sampler.max_model_len},
            headers=ignored_header(request, ignored),
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's `/detokenize`: `{model, tokens}` → `{prompt}`."""
        token = self._token(request)
        body = await self._body(request)
        sampler = await self.resolver.sampler(str(body.get("model") or ""), token)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in ids
        ):
            raise OpenAIError(400, "tokens: expected a list of token ids", param="tokens")
        vocab = int(getattr(sampler, "vocab_size", 0) or 0)
        bad = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if bad:
            raise OpenAIError(
                400,
                f"tokens: id {bad[0]} is outside the vocabulary [0, {vocab or 'size'})",
                param="tokens",
                code="invalid_value",
            )
        return web.json_response({"prompt": sampler.decode(ids)})


def add_openai_routes(
    app: web.Application,
    resolver: Resolver,
    *,
    authenticate: Authenticate | None = None,
    tokens: Iterable[str] = (),
    token_sha256: Iterable[str] = (),
    tools: ToolSettings | None = None,
    sessions: SessionStore | None = None,
) -> OpenAIRoutes:
    """Mount `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/sessions/{id}`,
    `/tokenize`, `/detokenize` on `app`; callers authenticated by `authenticate` (a server's
    core's rule), else by `bearer_auth(tokens, token_sha256)`."""
    if authenticate is None:
        authenticate = bearer_auth(tokens, token_sha256)
    elif tokens or token_sha256:  # two sources of who may call: refused, never one ignored
        raise ValueError(
            "add_openai_routes: pass authenticate (a server core's rule) or tokens / "
            "token_sha256, not both"
        )
    routes = OpenAIRoutes(resolver, authenticate, tools=tools, sessions=sessions)
    app.router.add_get("/v1/models", routes.wrap(routes.list_models))
    app.router.add_post("/v1/chat/completions", routes.wrap(routes.until_disconnect(routes.chat)))
    app.router.add_get("/v1/sessions/{session_id}", routes.wrap(routes.get_session))
    app.router.add_delete("/v1/sessions/{session_id}", routes.wrap(routes.delete_session))
    app.router.add_post("/v1/completions", routes.wrap(routes.until_disconnect(routes.completions)))
    app.router.add_post("/tokenize", routes.wrap(routes.tokenize))
    app.router.add_post("/detokenize", routes.wrap(routes.detokenize))
    return routes


async def start_openai_server(
    resolver: Resolver,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    tokens: Iterable[str] = (),
    token_sha256: Iterable[str] = (),
    tools: ToolSettings | None = None,
    sessions: SessionStore | None = None,
) -> tuple[web.AppRunner, str]:
    """A standalone server of the routes (tests, a driver-side proxy): (runner, base URL)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    add_openai_routes(
        app, resolver, tokens=tokens, token_sha256=token_sha256, tools=tools, sessions=sessions
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server: Any = site._server
    sock = server.sockets[0] if server is not None and server.sockets else None
    real_port = sock.getsockname()[1] if sock is not None else port
    return runner, f"http://{host}:{real_port}"
