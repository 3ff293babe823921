"""A mutating HTTP proxy in front of a correct server (the fake gateway, faults off): it applies
one `Fault` at a time to what passes, and `fails_its_cases` checks that the suite fails exactly
the cases the fault lists (`test_proxy_faults.py` for arctic.v1, `test_openai_faults.py` for the
OpenAI routes). The `proxy` fixture (conftest.py) serves one per test module.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from conformance.runner import Case, RunConfig, run_suite, select

from .conftest import ALT_TOKEN, TOKEN

Request = dict[str, object]  # method, path, query, headers, body
Response = dict[str, object]  # status, headers, body


@dataclass(frozen=True)
class Fault:
    only: tuple[str, ...]  # the cases run
    fails: tuple[str, ...]  # the cases that must fail
    on_request: Callable[[Request], None] = lambda r: None
    on_response: Callable[[Request, Response], None] = lambda q, r: None


# the proxy re-frames HTTP: raw-socket and declared-length cases are left to the direct runs
SKIP = ["hostile/http/*", "hostile/slow/*", "limits/body-too-large/*", "*/gap-timeout"]


class Proxy:
    """An HTTP proxy (its own thread and loop) that applies one fault to what passes."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.fault: Fault | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    def start(self) -> None:
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> str:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=256 << 20)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        req: Request = {
            "method": request.method,
            "path": request.raw_path.split("?", 1)[0],
            "query": list(request.query.items()),
            "headers": {k: v for k, v in request.headers.items() if k.lower() not in _HOP},
            "body": await request.read(),
        }
        fault = self.fault
        if fault is not None:
            fault.on_request(req)
        async with self.session.request(
            str(req["method"]), self.upstream + str(req["path"]), params=req["query"],  # type: ignore[arg-type]
            headers=req["headers"], data=req["body"], allow_redirects=False,  # type: ignore[arg-type]
        ) as up:  # fmt: skip
            resp: Response = {
                "status": up.status,
                "headers": {k: v for k, v in up.headers.items() if k.lower() not in _HOP},
                "body": await up.read(),
            }
        if fault is not None:
            fault.on_response(req, resp)
        return web.Response(status=resp["status"], headers=resp["headers"], body=resp["body"])  # type: ignore[arg-type]

    def stop(self) -> None:
        async def close() -> None:
            await self.session.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()  # its self-pipe sockets too (else a ResourceWarning in a later test)


_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def _run(target: str, cases: list[Case], fault: Fault) -> dict[str, str]:
    cfg = RunConfig(target=target, transport="http", token=TOKEN, alt_token=ALT_TOKEN)
    report = run_suite(cfg, select(cases, fault.only, SKIP))
    return {r.case.id: r.outcome for r in report.results}


def fails_its_cases(proxy: tuple[Proxy, str], cases: list[Case], name: str, fault: Fault) -> None:
    """Without `fault` the cases it lists pass; with it on the proxy, each of them fails."""
    p, target = proxy
    p.fault = None
    clean = _run(target, cases, fault)
    assert all(clean.get(c) == "pass" for c in fault.fails), f"without the fault: {clean}"
    p.fault = fault
    try:
        faulty = _run(target, cases, fault)
    finally:
        p.fault = None
    missed = [c for c in fault.fails if faulty.get(c) not in ("fail", "error")]
    assert not missed, f"{name}: the suite did not fail {missed} ({faulty})"
