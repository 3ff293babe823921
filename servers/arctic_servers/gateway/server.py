"""Start the gateway: SQLite stores, restart recovery, then HTTP and gRPC; drain on close.

Start-up order matters for durability: jobs are loaded and their workers re-attached, then the
protocol core takes up the requests that had not ended (pending ones run from their stored
bodies, running ones are collected from their workers), and only then do the listeners open.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web

from ..openai.gateway import install as install_openai
from ..protocol.config import ProtocolConfig, ProtocolLimits
from ..protocol.core import ProtocolCore
from ..protocol.sqlite_store import SqliteChunkStore, SqliteRequestStore
from ..rules.errors import ProtocolError
from ..serving.grpc_app import start_grpc_server
from ..serving.http_app import DEFAULT_PATH, error_response, make_app
from ..serving.http_server import make_runner
from ..serving.metrics_http import MetricsListener
from ..serving.serve import free_port
from ..tinker.catalog import engine_catalog
from ..tinker.mount import mount as mount_tinker
from .jobs import JobManager
from .metrics import WorkerHostsCollector
from .model import JobStore
from .profiles import make_profile
from .servicer import GatewayServicer
from .settings import GatewaySettings
from .supervisor import Supervisor

log = logging.getLogger("arctic_servers.gateway")


@dataclass
class RunningGateway:
    core: ProtocolCore
    servicer: GatewayServicer
    host: str
    http_port: int
    grpc_port: int
    runner: web.AppRunner
    grpc_server: grpc.aio.Server | None
    stores: tuple[SqliteRequestStore, SqliteChunkStore, JobStore]
    restored: dict[str, Any] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    metrics: MetricsListener | None = None  # --metrics-port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def prefix_url(self) -> str:
        return self.base_url + DEFAULT_PATH

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    async def close(self, drain_timeout: float | None = None) -> int:
        """Stop accepting, let running requests finish (up to the drain timeout), hand the rest
        off to the next start, close the listeners; workers keep running. Returns how many
        requests were handed off."""
        timeout = self.servicer.settings.drain_timeout_s if drain_timeout is None else drain_timeout
        handed = await self.core.hand_off(timeout)
        for t in self.tasks:
            t.cancel()
        if self.grpc_server is not None:
            await self.grpc_server.stop(0.5)
        await self.runner.cleanup()
        if self.metrics is not None:
            await self.metrics.close()
        await self.servicer.jobs.shutdown()
        for s in self.stores:
            s.close()
        if handed:
            log.info("handed %d unfinished requests to the next start", handed)
        return handed


def _admin_routes(servicer: GatewayServicer, core: ProtocolCore) -> Any:
    """`/_admin/jobs/{job}` (history, workers) and `/_admin/jobs/{job}/stats` (each worker's
    counters: the fake engine's applied steps and executions), behind the same tokens."""

    def configure(app: web.Application) -> None:
        def auth(request: web.Request) -> None:
            from ..protocol.config import token_digest

            digests = core.config.token_sha256
            if digests:
                h = request.headers.get("Authorization", "")
                tok = h[7:].strip() if h.lower().startswith("bearer ") else ""
                if not tok or token_digest(tok) not in digests:
                    raise ProtocolError("unauthenticated", "the admin API needs a token")

        async def job_state(request: web.Request) -> web.Response:
            try:
                auth(request)
                return web.json_response(servicer.job_state(request.match_info["job_id"]))
            except ProtocolError as exc:
                return error_response(exc)

        async def stats(request: web.Request) -> web.Response:
            try:
                auth(request)
                job = servicer.jobs.jobs.get(request.match_info["job_id"])
                if job is None:
                    raise ProtocolError("job_not_found", "no such job")
                out = {}
                for s in job.sub_jobs:
                    client = await servicer.jobs.client(s)
                    out[s.sub_job_id] = await client.stats()
                return web.json_response({"job_id": job.job_id, "workers": out})
            except ProtocolError as exc:
                return error_response(exc)

        async def pools(request: web.Request) -> web.Response:
            try:
                auth(request)
                return web.json_response({"pools": servicer.jobs.pools.views()})
            except ProtocolError as exc:
                return error_response(exc)

        app.router.add_get("/_admin/jobs/{job_id}", job_state)
        app.router.add_get("/_admin/jobs/{job_id}/stats", stats)
        app.router.add_get("/_admin/pools", pools)

    return configure


async def _sweep_loop(gw: GatewaySettings, core: ProtocolCore, servicer: GatewayServicer) -> None:
    """Drop results fetched longer than the retention window ago, and the requests and chunk
    groups of jobs that ended longer than that ago (the jobs stay listed)."""
    retention = core.config.limits.retention_seconds
    while True:
        await asyncio.sleep(gw.sweep_interval_s)
        try:
            core.sweep()
            now = time.time()
            for job in list(servicer.jobs.jobs.values()):
                if job.terminal and not job.purged and job.ended_at < now - retention:
                    core.requests.delete_job(job.job_id)
                    core.groups.forget_job(job.job_id)
                    job.purged, job.pending_syncs = True, {}
                    servicer.jobs.save(job)
        except Exception:
            log.exception("retention sweep failed")


async def start_gateway(
    settings: GatewaySettings,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    grpc_port: int | None = 0,
    token_sha256: frozenset[str] = frozenset(),
    limits: ProtocolLimits | None = None,
    answer_mode: str = "async",
    inline_wait_seconds: float = 2.0,
    admin: bool = False,
    tinker: Any = None,
    tools: Any = None,
    **config_fields: Any,
) -> RunningGateway:
    """Serve the gateway on HTTP (and gRPC unless `grpc_port` is None); 0 = a free port.
    `tinker`: the Tinker surface's `TinkerSettings` (default ones when None); other keywords
    are `ProtocolConfig` fields (the metrics listener and operator tokens);
    `tools`: the OpenAI routes' `openai.tool_calls.ToolSettings` (defaults when None)."""
    settings.root.mkdir(parents=True, exist_ok=True)
    settings.db.parent.mkdir(parents=True, exist_ok=True)
    stores = (
        SqliteRequestStore(settings.db),
        SqliteChunkStore(settings.db),
        JobStore(settings.db),
    )
    profile = make_profile(settings)
    jobs = JobManager(settings, stores[2], Supervisor(settings), profile)
    servicer = GatewayServicer(jobs, profile, settings, auth=bool(token_sha256))
    jobs.on_end.append(servicer.job_ended)
    if grpc_port == 0:
        grpc_port = free_port(host)
    config = ProtocolConfig(
        server="gateway",
        token_sha256=token_sha256,
        answer_mode=answer_mode,
        inline_wait_seconds=inline_wait_seconds,
        leases=True,
        lease_default_seconds=settings.lease_default_seconds,
        lease_max_seconds=settings.lease_max_seconds,
        max_inflight_per_token=settings.max_inflight_per_token,
        limits=limits or ProtocolLimits(),
        openai=True,  # /v1/... on the same listener (arctic_servers.openai.gateway)
        **config_fields,
    )
    if grpc_port is not None:
        config = dataclasses.replace(config, grpc_port=grpc_port)
    core = ProtocolCore(servicer, config, request_store=stores[0], chunk_store=stores[1])
    servicer.core = core
    core.metrics.add_collector(WorkerHostsCollector(jobs))  # the gateway's own families
    restored: dict[str, Any] = {"jobs": await jobs.restore()}
    restored["requests"] = await core.restore()
    log.info("restored %s", restored)
    gserver = None
    if grpc_port is not None:
        gserver, grpc_port = await start_grpc_server(core, host=host, port=grpc_port)
    app = make_app(core)
    install_openai(app, core, tools)  # /v1/models, /v1/chat/completions, ...
    # Tinker's /api/v1/... over the models of the gateway's engine (tinker/catalog.py)
    mount_tinker(
        app,
        tinker,
        catalog=engine_catalog(settings.engine),
        state_path=str(settings.root / "tinker_state.sqlite"),
    )
    if admin:
        _admin_routes(servicer, core)(app)
    # after the drain (hand_off) nothing is left to finish: open handlers get 2 s, so SIGTERM
    # exits within drain_timeout + ~2 s
    runner = make_runner(app, config.limits, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    http_port = int(sockets[0].getsockname()[1]) if sockets else port
    gw = RunningGateway(
        core, servicer, host, http_port, grpc_port or 0, runner, gserver, stores, restored
    )
    gw.metrics = await MetricsListener.start(core)
    gw.tasks.append(asyncio.get_running_loop().create_task(_sweep_loop(settings, core, servicer)))
    return gw
