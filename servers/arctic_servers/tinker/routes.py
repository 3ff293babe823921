"""The `/api/v1/...` routes of Tinker's service, as the 0.38 SDK calls them (aiohttp).

Auth: `X-API-Key` (the SDK insists on a `tml-` prefix): `tml-<token>` or `<token>` must be one
of the server's tokens (clear, or sha256 digests as the gateway keeps them); a server without
tokens accepts any key. Request bodies are parsed with the SDK's own pydantic request types
(`extra="forbid"`: an unknown field is refused by name).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import pydantic
import tinker.types as T
from aiohttp import web

from . import losses, wire
from .backend import Backend
from .errors import TinkerError, failure_body
from .ops import Ops, TinkerSettings
from .state import Model, Session, State

__all__ = ["TinkerRoutes", "add_tinker_routes"]

log = logging.getLogger("arctic_servers.tinker")
P = "/api/v1"
PROTO = "application/x-protobuf"
LONG_POLL_S = 20.0
MAX_JSON = 16 << 20


def ttl_s(v: int | None) -> float | None:
    """`ttl_seconds`: the checkpoint's tinker:// path stops resolving (404) after it."""
    if v is None:
        return None
    if int(v) <= 0:
        raise TinkerError(
            400, f"ttl_seconds = {v!r}; expected > 0", "invalid_argument", field="ttl_seconds"
        )
    return float(v)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


# CreateSession fields this server accepts but does not keep: named in the reply's warning
UNKEPT_SESSION_FIELDS = ("tags", "user_metadata", "project_id", "display_name")


class TinkerRoutes:
    def __init__(
        self,
        backend: Backend,
        settings: TinkerSettings,
        tokens: Iterable[str] = (),
        token_sha256: Iterable[str] = (),
    ) -> None:
        self.state = State()
        self.ops = Ops(self.state, backend, settings)
        self.settings = settings
        self.tokens, self.sha = frozenset(tokens), frozenset(token_sha256)

    # ------------------------------------------------------------------ plumbing

    def _token(self, request: web.Request) -> str | None:
        if not self.tokens and not self.sha:
            return None
        key = request.headers.get("X-API-Key", "").strip()
        for t in (key.removeprefix("tml-"), key):
            if t and (t in self.tokens or hashlib.sha256(t.encode()).hexdigest() in self.sha):
                return t
        raise TinkerError(
            401, "missing or invalid API key: send X-API-Key: tml-<token>", "unauthenticated"
        )

    async def _json(self, request: web.Request, model: type[Any]) -> Any:
        if request.content_length and request.content_length > MAX_JSON:
            raise TinkerError(413, f"the body is over {MAX_JSON} bytes", "too_large")
        raw = await request.read()
        try:
            return model.model_validate_json(raw or b"{}")
        except pydantic.ValidationError as exc:
            errs = exc.errors()[:5]
            where = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errs)
            field = ".".join(str(x) for x in errs[0]["loc"]) if errs else ""
            raise TinkerError(
                400, f"invalid {model.__name__}: {where}", "invalid_argument", field=field
            ) from None

    def wrap(self, fn: Callable[..., Any]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                return await fn(request, self._token(request))  # type: ignore[no-any-return]
            except TinkerError as exc:
                return web.json_response(exc.body(), status=exc.status)
            except Exception as exc:  # a protocol error of ours: its status and code
                status = int(getattr(exc, "http_status", 0) or 500)
                if status >= 500:
                    log.exception("tinker route %s failed", request.path)
                body = {"detail": str(exc), "code": str(getattr(exc, "code", "internal"))}
                return web.json_response(body, status=status)

        return handler

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        for method, path, fn in [
            ("POST", "/client/config", self.client_config),
            ("POST", "/client/dynamic_config", self.dynamic_config),
            ("GET", "/healthz", self.healthz),
            ("GET", "/get_server_capabilities", self.capabilities),
            ("POST", "/create_session", self.create_session),
            ("POST", "/session_heartbeat", self.heartbeat),
            ("POST", "/sessions/{session_id}/finish", self.finish),
            ("POST", "/telemetry", self.telemetry),
            ("POST", "/create_model", self.create_model),
            ("POST", "/get_info", self.get_info),
            ("POST", "/forward_backward", self.forward_backward),
            ("POST", "/forward", self.forward_backward),
            ("POST", "/optim_step", self.optim_step),
            ("POST", "/save_weights", self.save_weights),
            ("POST", "/save_weights_for_sampler", self.save_for_sampler),
            ("POST", "/load_weights", self.load_weights),
            ("POST", "/create_sampling_session", self.create_sampling_session),
            ("GET", "/samplers/{sampler_id}", self.get_sampler),
            ("POST", "/asample", self.asample),
            ("POST", "/retrieve_future", self.retrieve_future),
            ("GET", "/training_runs", self.training_runs),
            ("GET", "/training_runs/{run_id}", self.training_run),
            ("GET", "/training_runs/{run_id}/checkpoints", self.run_checkpoints),
            ("POST", "/weights_info", self.weights_info),
        ]:
            r.add_route(method, P + path, self.wrap(fn))
        r.add_route("*", P + "/{tail:.*}", self.wrap(self.not_served))

    # ------------------------------------------------------------------ service

    async def not_served(self, request: web.Request, token: str | None) -> web.Response:
        raise TinkerError(
            404,
            f"{request.method} {request.path} is not served by this server",
            "not_found",
            route=request.path,
        )

    async def client_config(self, request: web.Request, token: str | None) -> web.Response:
        await self._json(request, T.ClientConfigRequest)
        return web.json_response(
            {
                "use_pyqwest_transport": False,
                "pjwt_auth_enabled": False,
                "parallel_fwdbwd_chunks": True,
            }
        )

    async def dynamic_config(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response({"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    async def healthz(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response({"status": "ok"})

    async def capabilities(self, request: web.Request, token: str | None) -> web.Response:
        models = [
            {
                "model_name": m,
                "max_context_length": self.settings.max_context_length,
                "trainable": True,
                "sampleable": True,
            }
            for m in self.settings.models
        ]
        return web.json_response({"supported_models": models})

    async def create_session(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.CreateSessionRequest)
        sid = f"sess-{uuid.uuid4().hex[:16]}"
        self.state.sessions[sid] = Session(sid, token)
        notes = []
        if self.settings.lora == "full_finetune":
            notes.append(
                "this server trains full weights for Tinker's LoRA requests "
                "(its operator enabled it; get_info answers is_lora false)"
            )
        # not stored: this server has no session listings to show them in (ROUTES.md)
        unkept = [k for k in UNKEPT_SESSION_FIELDS if getattr(req, k, None)]
        if unkept:
            notes.append(f"session fields not kept by this server: {', '.join(unkept)}")
        msg = "; ".join(notes) or None
        return web.json_response(
            {
                "session_id": sid,
                "type": "create_session",
                **({"warning_message": msg} if msg else {}),
            }
        )

    async def heartbeat(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SessionHeartbeatRequest)
        s = self.state.session(req.session_id, token)
        if s.finished:
            raise TinkerError(410, f"session {s.session_id!r} has finished", "gone")
        s.last_heartbeat = time.time()
        return web.json_response({"type": "session_heartbeat"})

    async def finish(self, request: web.Request, token: str | None) -> web.Response:
        s = self.state.session(request.match_info["session_id"], token)
        s.finished = True
        return web.json_response({})

    async def telemetry(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response({"status": "accepted"})

    # ------------------------------------------------------------------ training

    async def create_model(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.CreateModelRequest)
        s = self.state.session(req.session_id, token)
        opt = req.optimizer_config
        if opt is not None and getattr(opt, "type", "adamw") != "adamw":
            raise TinkerError(
                400,
                f"optimizer_config.type = {opt.type!r}; served: adamw",
                "unsupported_option",
                field="optimizer_config.type",
            )
        lora = req.lora_config.model_dump() if req.lora_config is not None else None
        body = self.ops.job_body(req.base_model, lora, lora.get("seed") if lora else None)
        model_id = f"{s.session_id}:train:{req.model_seq_id}"
        if model_id in self.state.models:
            raise TinkerError(
                409,
                f"model_seq_id {req.model_seq_id} exists",
                "already_exists",
                field="model_seq_id",
            )

        async def run() -> dict[str, Any]:
            job_id = await self.ops.backend.create_job(token, body)
            self.state.models[model_id] = Model(
                model_id,
                s.session_id,
                token,
                req.base_model,
                int(lora["rank"]) if lora else None,
                job_id,
                self.ops.adam(),
                user_metadata=dict(req.user_metadata or {}),
            )
            return {"model_id": model_id, "type": "create_model"}

        return web.json_response(self.state.submit(token, run()))

    async def get_info(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.GetInfoRequest)
        m = self.state.model(req.model_id, token)
        lora = self.settings.lora != "full_finetune" and m.lora_rank is not None
        return web.json_response(
            {
                "model_id": m.model_id,
                "type": "get_info",
                "is_lora": lora,
                "lora_rank": m.lora_rank if lora else None,
                "model_name": m.base_model,
                "model_data": {
                    "arch": "unknown",
                    "model_name": m.base_model,
                    "tokenizer_id": m.base_model,
                },
            }
        )

    async def forward_backward(self, request: web.Request, token: str | None) -> web.Response:
        fb = wire.decode_forward_backward(
            await request.read(), request.headers.get("Content-Encoding", "")
        )
        m = self.state.model(fb.model_id, token)
        losses.check(fb)
        fb.forward_only = fb.forward_only or request.path.endswith("/forward")
        coro = m.in_turn(fb.seq_id, lambda: self.ops.forward_backward(m, fb))
        return web.json_response({**self.state.submit(token, coro), "model_id": m.model_id})

    async def optim_step(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.OptimStepRequest)
        m = self.state.model(req.model_id, token)
        p = req.optim_params
        if not isinstance(p, T.AdamParams):
            raise TinkerError(
                400,
                f"optimizer_params of type {getattr(p, 'type', '?')!r}; served: adam_params",
                "unsupported_option",
                field="optim_params",
            )
        params = p.model_dump()
        coro = m.in_turn(req.seq_id or m.next_seq, lambda: self.ops.optim_step(m, params))
        return web.json_response(self.state.submit(token, coro))

    async def save_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsRequest)
        m = self.state.model(req.model_id, token)
        ttl = ttl_s(req.ttl_seconds)
        name = req.path or f"step-{req.seq_id}"
        self.ops.path(m, "weights", name)  # refused at submit when not a plain name
        coro = m.in_turn(
            req.seq_id or m.next_seq,
            lambda: self.ops.save_weights(m, name, bool(req.overwrite), ttl),
        )
        return web.json_response(self.state.submit(token, coro))

    async def save_for_sampler(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SaveWeightsForSamplerRequest)
        m = self.state.model(req.model_id, token)
        ttl = ttl_s(req.ttl_seconds)
        if req.path is not None:
            self.ops.path(m, "sampler_weights", req.path)
        if req.path is None and req.sampling_session_seq_id is None:
            raise TinkerError(
                400, "send path or sampling_session_seq_id", "missing_field", field="path"
            )
        coro = m.in_turn(
            req.seq_id or m.next_seq,
            lambda: self.ops.save_for_sampler(
                m, req.path, req.sampling_session_seq_id, m.session_id, ttl
            ),
        )
        return web.json_response(self.state.submit(token, coro))

    async def load_weights(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.LoadWeightsRequest)
        path = str(req.path)
        source = self.state.model(path.removeprefix("tinker://").split("/", 1)[0], token)
        if req.model_id is not None:  # TrainingClient.load_state*: into this model
            m = self.state.model(req.model_id, token)
            coro = m.in_turn(
                req.seq_id or m.next_seq,
                lambda: self.ops.load_weights(m, path, source, bool(req.optimizer)),
            )
            return web.json_response(self.state.submit(token, coro))
        s = self.state.session(str(req.session_id), token)
        model_id = f"{s.session_id}:train:{req.model_seq_id}"
        lora = {"rank": source.lora_rank} if source.lora_rank is not None else None
        body = self.ops.job_body(source.base_model, lora, None)

        async def run() -> dict[str, Any]:
            job_id = await self.ops.backend.create_job(token, body)
            m = Model(
                model_id,
                s.session_id,
                token,
                source.base_model,
                source.lora_rank,
                job_id,
                self.ops.adam(),
            )
            self.state.models[model_id] = m
            return await self.ops.load_weights(m, path, source, bool(req.optimizer))

        return web.json_response(self.state.submit(token, run()))

    # ------------------------------------------------------------------ sampling

    async def create_sampling_session(self, request: web.Request, token: str | None) -> Any:
        req = await self._json(request, T.CreateSamplingSessionRequest)
        s = self.state.session(req.session_id, token)
        if req.model_path is None:
            raise TinkerError(
                400,
                f"base_model {req.base_model!r}: sampling a base model without a "
                "training client is not served; sample from save_weights_for_sampler's weights",
                "unsupported_option",
                field="base_model",
            )
        ref = self.ops.sampler_for_path(str(req.model_path), token)
        sid = f"{s.session_id}:sample:{req.sampling_session_seq_id}"
        self.state.samplers[sid] = ref
        return web.json_response({"sampling_session_id": sid})

    async def get_sampler(self, request: web.Request, token: str | None) -> web.Response:
        sid = request.match_info["sampler_id"]
        ref = self.state.sampler(sid, token)
        m = self.state.models[ref.model_id]
        return web.json_response(
            {"sampler_id": sid, "base_model": m.base_model, "model_path": ref.path}
        )

    async def asample(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SampleRequest)
        if req.sampling_session_id is None:
            raise TinkerError(
                400,
                "sampling_session_id is required (base_model / model_path "
                "sampling without a session is not served)",
                "missing_field",
                field="sampling_session_id",
            )
        ref = self.state.sampler(req.sampling_session_id, token)
        fut = self.state.submit(token, self.ops.sample(ref, req))
        ids = [f"{fut['request_id']}:{i}" for i in range(int(req.num_samples))]
        return web.json_response({**fut, "sample_sequence_ids": ids})

    # ------------------------------------------------------------------ futures

    async def retrieve_future(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.FutureRetrieveRequest)
        f = self.state.future(req.request_id, token)
        done, _ = await asyncio.wait({f.task}, timeout=LONG_POLL_S)
        if not done:
            return web.json_response(
                {"type": "try_again", "request_id": f.request_id, "queue_state": "active"}
            )
        exc = f.task.exception()
        if exc is not None:
            return web.json_response(failure_body(exc))
        res = f.task.result()
        if isinstance(res, bytes):
            return web.Response(body=res, content_type=PROTO)
        return web.json_response(res)

    # ------------------------------------------------------------------ REST

    def _run(self, m: Model) -> dict[str, Any]:
        live = self.ops.live(m)
        ck = [p for p, i in live.items() if i["type"] == "training"]
        sk = [p for p, i in live.items() if i["type"] == "sampler"]
        return {
            "training_run_id": m.model_id,
            "base_model": m.base_model,
            "model_owner": "",
            "is_lora": m.lora_rank is not None and self.settings.lora != "full_finetune",
            "lora_rank": m.lora_rank,
            "corrupted": False,
            "last_request_time": _iso(m.last_request),
            "last_checkpoint": self._ckpt(m, ck[-1]) if ck else None,
            "last_sampler_checkpoint": self._ckpt(m, sk[-1]) if sk else None,
            "user_metadata": m.user_metadata or None,
        }

    def _ckpt(self, m: Model, path: str) -> dict[str, Any]:
        info = m.checkpoints[path]
        return {
            "checkpoint_id": path.split("/", 3)[3],
            "checkpoint_type": info["type"],
            "time": _iso(m.last_request),
            "tinker_path": path,
            "size_bytes": info.get("size_bytes"),
            "expires_at": _iso(info["expires_at"]) if info.get("expires_at") else None,
            "public": False,
        }

    async def training_runs(self, request: web.Request, token: str | None) -> web.Response:
        runs = [m for m in self.state.models.values() if m.token == token]
        try:
            limit = int(request.query.get("limit", "20"))
            offset = int(request.query.get("offset", "0"))
        except ValueError:
            raise TinkerError(
                400, "limit and offset must be integers", "invalid_argument", field="limit"
            ) from None
        page = runs[max(offset, 0) : max(offset, 0) + max(min(limit, 1000), 0)]
        return web.json_response(
            {
                "training_runs": [self._run(m) for m in page],
                "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)},
            }
        )

    async def training_run(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response(self._run(self.state.model(request.match_info["run_id"], token)))

    async def run_checkpoints(self, request: web.Request, token: str | None) -> web.Response:
        m = self.state.model(request.match_info["run_id"], token)
        return web.json_response(
            {"checkpoints": [self._ckpt(m, p) for p in self.ops.live(m)], "cursor": None}
        )

    async def weights_info(self, request: web.Request, token: str | None) -> web.Response:
        body = await request.json()
        path = str((body or {}).get("tinker_path", ""))
        m = self.state.model(path.removeprefix("tinker://").split("/", 1)[0], token)
        if path not in self.ops.live(m):
            raise TinkerError(
                404, f"tinker_path {path!r} does not exist", "not_found", field="tinker_path"
            )
        run = self._run(m)
        return web.json_response(
            {
                "base_model": m.base_model,
                "is_lora": run["is_lora"],
                "lora_rank": run["lora_rank"] if run["is_lora"] else None,
            }
        )


def add_tinker_routes(
    app: web.Application,
    backend: Backend,
    settings: TinkerSettings,
    tokens: Iterable[str] = (),
    token_sha256: Iterable[str] = (),
) -> TinkerRoutes:
    routes = TinkerRoutes(backend, settings, tokens, token_sha256)
    routes.add_routes(app)
    return routes
