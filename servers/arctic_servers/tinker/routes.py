"""The `/api/v1/...` routes of Tinker's service, as the 0.38 SDK calls them (aiohttp): the
service and session routes, sampling and futures here; training in `train_routes.py`, the REST
listings in `rest.py`, auth and body parsing in `base.py`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pydantic
import tinker.types as T
from aiohttp import web
from aiohttp.compression_utils import HAS_ZSTD

from .auth import NO_TOKEN
from .backend import Backend
from .base import RouteBase
from .errors import TinkerError, failure_body
from .hf_files import add_hf_routes
from .rest import RestRoutes
from .route_table import ROUTES, P
from .sampling import prompt_tokens, sampling_params
from .settings import TinkerSettings
from .state import SamplerRef, Session, owner_of
from .train_routes import TrainRoutes

__all__ = ["TinkerRoutes", "add_tinker_routes"]

PROTO = "application/x-protobuf"
LONG_POLL_S = 20.0

# CreateSession fields this server accepts but does not keep: named in the reply's warning
UNKEPT_SESSION_FIELDS = ("tags", "user_metadata", "project_id", "display_name")


class TinkerRoutes(TrainRoutes, RestRoutes, RouteBase):
    def add_routes(self, app: web.Application) -> None:
        for method, path, handler in ROUTES:
            app.router.add_route(method, P + path, self.wrap(handler(self)))

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
                # zstd forward_backward bodies, when aiohttp can decode them (backports.zstd)
                "proto_compress_fwdbwd": HAS_ZSTD,
            }
        )

    async def dynamic_config(self, request: web.Request, token: str | None) -> web.Response:
        # the SDK sends cancel_future for a sample future it abandons (a cancelled task, a
        # result_async timeout)
        return web.json_response({"refresh_interval_sec": 300, "sample_cancel_enabled": True})

    async def healthz(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response({"status": "ok"})

    async def capabilities(self, request: web.Request, token: str | None) -> web.Response:
        """Every model the server serves (the operator's list, else the engines'), with the
        context window every route then enforces."""
        models = []
        for name in self.ops.listed():
            try:
                window = (await self.ops.model_info(name)).context_length
            except TinkerError:
                continue  # listed by the operator, not served by the engines
            models.append(
                {
                    "model_name": name,
                    "max_context_length": window,
                    "trainable": True,
                    "sampleable": True,
                }
            )
        return web.json_response({"supported_models": models})

    async def create_session(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.CreateSessionRequest)
        sid = self.state.new_session_id()
        self.state.sessions[sid] = Session(sid, owner_of(token))
        self.state.changed()
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
        """410 (the SDK then stops its heartbeat loop) for a finished, expired or lost session."""
        req = await self._json(request, T.SessionHeartbeatRequest)
        s = self.state.sessions.get(req.session_id)
        if s is None or s.owner != owner_of(token):
            err = self.state.missing("session_id", req.session_id)
            if err.extra.get("reason") == "server_restarted":
                err.status = 410
            raise err
        if s.finished or s.expired:
            raise self.state.gone(s, "session_id", s.session_id)
        s.last_heartbeat = time.time()
        return web.json_response({"type": "session_heartbeat"})

    async def finish(self, request: web.Request, token: str | None) -> web.Response:
        """`ServiceClient.close()`: the session ends now, its jobs are cancelled at once. A
        session lost in a restart has nothing left to finish: 200 with a `warning`, so
        `close()` (the end of every `with ServiceClient`) does not raise."""
        sid = request.match_info["session_id"]
        try:
            s = self.state.session(sid, token, live=False)
        except TinkerError as exc:
            if exc.extra.get("reason") != "server_restarted":
                raise
            return web.json_response({"warning": exc.message})
        s.finished = True
        self.state.expire_sessions(self.ops.end_session)
        return web.json_response({})

    async def telemetry(self, request: web.Request, token: str | None) -> web.Response:
        return web.json_response({"status": "accepted"})

    # ------------------------------------------------------------------ sampling

    async def create_sampling_session(self, request: web.Request, token: str | None) -> Any:
        req = await self._json(request, T.CreateSamplingSessionRequest)
        s = self.state.session(req.session_id, token)
        sid = f"{s.session_id}:sample:{req.sampling_session_seq_id}"
        if req.model_path is not None:
            ref = self.ops.sampler_for_path(str(req.model_path), token, s.session_id)
        elif req.base_model is not None:
            ref = await self._base_sampler(s, str(req.base_model), token)
        else:
            raise TinkerError(
                400, "send model_path or base_model", "missing_field", field="model_path"
            )
        self.state.samplers[sid] = ref
        self.state.changed()
        return web.json_response({"sampling_session_id": sid})

    async def _base_sampler(self, s: Session, base_model: str, token: str | None) -> SamplerRef:
        """A sampler of the base model alone (Harbor's Tinker backend opens one): a job with
        one sampling sub-job, shared by the session's base-model samplers of that model and
        cancelled with the session."""
        info = await self.ops.model_info(base_model)
        for ref in self.state.samplers.values():
            if (
                ref.session_id == s.session_id
                and ref.model_id is None
                and ref.base_model == info.name
            ):
                return ref
        body = {"sub_job_configs": [self.ops.sampler_config(info)], "experiment_name": "tinker"}
        job_id = await self.ops.backend.create_job(token, body)
        return SamplerRef(
            s.owner, s.session_id, job_id, info.name, info.context_length, token=token
        )

    async def asample(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.SampleRequest)
        if req.sampling_session_id is None:
            raise TinkerError(
                400,
                "sampling_session_id is required (sampling without a session is not served: "
                "the SDK opens one with create_sampling_session)",
                "missing_field",
                field="sampling_session_id",
            )
        sid = str(req.sampling_session_id)
        ref = self.state.sampler(sid, token)
        prompt = prompt_tokens(req.prompt)
        sampling_params(req, len(prompt), ref.context_length)  # refused at submit
        rid = self.state.new_future_id()
        ids = [f"{rid}:{i}" for i in range(int(req.num_samples))]
        spec = {
            "sampling_session_id": sid,
            "request": req.model_dump(mode="json"),
            "sequence_ids": ids,
        }
        fut = self.submit_op(token, "sample", spec, req, rid)
        return web.json_response({**fut, "sample_sequence_ids": ids})

    async def sequence(self, request: web.Request, token: str | None) -> web.Response:
        """Our extension: which sampling session, model and weight version produced a sampled
        sequence (an inflight sampler's samples may come from any version at or after the
        one it was created with; Tinker's responses do not say which)."""
        sid = request.match_info["sequence_id"]
        info = self.state.sequence(sid, token)
        return web.json_response(
            {"sequence_id": sid, **{k: v for k, v in info.items() if k != "owner"}}
        )

    # ------------------------------------------------------------------ futures

    async def retrieve_future(self, request: web.Request, token: str | None) -> web.Response:
        req = await self._json(request, T.FutureRetrieveRequest)
        f = self.state.future(req.request_id, token)
        if f.task is None:  # running when the server stopped: its owner is back (store.py)
            self.redrive(f, token)
        assert f.task is not None
        done, _ = await asyncio.wait({f.task}, timeout=LONG_POLL_S)
        if not done:
            return web.json_response(
                {"type": "try_again", "request_id": f.request_id, "queue_state": "active"}
            )
        if f.task.cancelled():
            return web.json_response(failure_body(self._cancelled(f)))
        exc = f.task.exception()
        if exc is not None:
            return web.json_response(failure_body(exc))
        res = f.task.result()
        if isinstance(res, bytes):
            return web.Response(body=res, content_type=PROTO)
        return web.json_response(res)

    async def cancel_future(self, request: web.Request, token: str | None) -> web.Response:
        """The SDK abandoned a sample future (`sample_cancel_enabled`): its task is cancelled,
        and with it its generate (a pending one never runs, a running one is aborted in the
        engine). Other futures cannot be cancelled (Tinker's SDK cancels only samples): refused
        by name. A future that has ended answers as it is."""
        req = await self._json(request, CancelFutureRequest)
        f = self.state.future(req.request_id, token)
        if f.kind != "sample":
            raise TinkerError(
                400,
                f"request_id {req.request_id!r} is a {f.kind or 'finished'} future; only sample "
                "futures can be cancelled (a training op runs in its model's turn)",
                "unsupported_option",
                field="request_id",
            )
        running = f.task is not None and not f.task.done()
        if running:
            assert f.task is not None
            f.task.cancel()
        return web.json_response({"request_id": f.request_id, "cancelled": running})

    def _cancelled(self, f: Any) -> TinkerError:
        """The answer of a future whose task was cancelled: by `cancel_future`, or because its
        session ended."""
        ref = self.state.samplers.get(str(f.spec.get("sampling_session_id") or ""))
        s = self.state.sessions.get(ref.session_id) if ref is not None else None
        why = (
            f"its session {s.session_id!r} ended"
            if s is not None and (s.expired or s.finished)
            else "cancel_future asked for it"
        )
        return TinkerError(
            409, f"future {f.request_id!r} was cancelled ({why})", "request_cancelled",
            field="request_id",
        )  # fmt: skip


class CancelFutureRequest(pydantic.BaseModel):
    """`POST /cancel_future`'s body, as the 0.38 SDK sends it (it has no type of its own)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    request_id: str


def add_tinker_routes(
    app: web.Application,
    backend: Backend,
    settings: TinkerSettings,
) -> TinkerRoutes:
    """Tinker's routes on `app`, its callers authenticated by `backend`'s core."""
    routes = TinkerRoutes(backend, settings)
    routes.add_routes(app)
    if settings.catalog is not None:  # the models' tokenizer files (hf_files.py)
        add_hf_routes(app, settings.catalog, lambda r: routes.caller(r) is not NO_TOKEN)
    app.on_cleanup.append(lambda _: routes.close())
    return routes
