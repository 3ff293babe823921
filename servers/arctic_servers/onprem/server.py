"""Start the on-prem server in the running event loop (the CLI and tests use this)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from arctic_sdk.spec.tables import methods as M

from ..protocol.config import ProtocolConfig, ProtocolLimits
from ..protocol.context import CallContext
from ..protocol.core import ProtocolCore
from ..rules.errors import ProtocolError
from ..serving.serve import ServerHandle, start_server
from .servicer import OnpremServicer
from .settings import ServerSettings

log = logging.getLogger("arctic_servers.onprem")


@dataclass
class RunningOnprem(ServerHandle):
    servicer: OnpremServicer = field(kw_only=True)

    async def close(self) -> None:
        await self.servicer.jobs.shutdown()
        await self.server.close()


def _admin_routes(servicer: OnpremServicer, tokens: frozenset[str]) -> Any:
    def configure(app: web.Application, core: ProtocolCore) -> None:
        def auth(request: web.Request) -> None:
            if tokens:
                h = request.headers.get("Authorization", "")
                if not h.lower().startswith("bearer ") or h[7:].strip() not in tokens:
                    raise web.HTTPUnauthorized()

        async def jobs(request: web.Request) -> web.Response:
            auth(request)
            out = [
                {"job_id": j.job_id, "state": j.state, "reason": j.reason}
                for j in servicer.jobs.jobs.values()
            ]
            return web.json_response({"jobs": out})

        async def job_state(request: web.Request) -> web.Response:
            auth(request)
            try:
                return web.json_response(servicer.job_state(request.match_info["job_id"]))
            except ProtocolError as exc:
                return web.json_response(exc.body(), status=exc.http_status)

        async def pools(request: web.Request) -> web.Response:
            auth(request)
            return web.json_response({"pools": await servicer.jobs.pools.views()})

        app.router.add_get("/_admin/jobs", jobs)
        app.router.add_get("/_admin/jobs/{job_id}", job_state)
        app.router.add_get("/_admin/pools", pools)

    return configure


def _configure(
    servicer: OnpremServicer,
    tokens: frozenset[str],
    admin: bool,
    tinker: Any = None,
    tools: Any = None,
) -> Any:
    """Routes beside the protocol: the OpenAI-compatible surface, Tinker's (`/api/v1/`,
    `arctic_servers.tinker`; `tinker` = its `TinkerSettings`), and `/_admin/` when asked."""
    from ..openai.onprem import install as install_openai
    from ..tinker.catalog import EmbeddedCatalog
    from ..tinker.mount import mount as mount_tinker

    def configure(app: web.Application, core: ProtocolCore) -> None:
        install_openai(app, core, tools=tools)
        mount_tinker(
            app,
            tinker,
            catalog=EmbeddedCatalog(servicer.settings),
            state_path=str(servicer.settings.data_dir / "tinker_state.sqlite"),
        )
        if admin:
            _admin_routes(servicer, tokens)(app, core)

    return configure


async def start_onprem(
    settings: ServerSettings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    grpc_port: int | None = 0,
    tokens: Sequence[str] = (),
    admin: bool = False,
    create_jobs: Sequence[Mapping[str, Any]] = (),
    limits: ProtocolLimits | None = None,
    tinker: Any = None,
    tools: Any = None,
    **config_fields: Any,
) -> tuple[RunningOnprem, list[str]]:
    """Serve on HTTP (and gRPC unless `grpc_port` is None); the server and pre-created job ids.
    Other keywords are `ProtocolConfig` fields (the metrics listener and operator tokens);
    `tools`: the OpenAI routes' `openai.tool_calls.ToolSettings` (defaults when None)."""
    settings = settings or ServerSettings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    toks = frozenset(tokens)
    servicer = OnpremServicer(settings, auth=bool(toks))
    config = ProtocolConfig(
        server="onprem",
        answer_mode="inline",
        tokens=toks,
        leases=True,
        lease_default_seconds=settings.lease_default_seconds,
        lease_max_seconds=settings.lease_max_seconds,
        limits=limits or ProtocolLimits(),
        **{"openai": True, **config_fields},  # /v1/... beside the protocol (openai/onprem.py)
    )
    running = await start_server(
        servicer,
        config,
        host=host,
        http_port=port,
        grpc_port=grpc_port,
        configure_app=_configure(servicer, toks, admin, tinker, tools),
    )
    servicer.core = running.core
    servicer.jobs.refill_pool()
    out = RunningOnprem(running, admin, servicer=servicer)
    job_ids = []
    for body in create_jobs:
        ctx = CallContext(method=M.CREATE_JOB, token=next(iter(toks), None))
        res = await servicer.create_job(ctx, dict(body))
        job_ids.append(res["job_id"])
    return out, job_ids


def job_body(
    roles: str, *, model: str = "", training_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A CreateJob body from `"training,sampling"` (the CLI's `--job`), or a JSON object."""
    roles = roles.strip()
    if roles.startswith("{"):
        return dict(json.loads(roles))
    configs = []
    for r in (x.strip() for x in roles.split(",") if x.strip()):
        cfg: dict[str, Any] = {"job_type": r, "model_name": model}
        if r == "training" and training_config:
            cfg["training_config"] = dict(training_config)
        configs.append(cfg)
    return {"sub_job_configs": configs}
