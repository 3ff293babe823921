"""The suite proven from outside a server: a mutating HTTP proxy in front of a correct server
(the fake gateway, faults off) injects one bug at a time, and the suite must fail the cases that
bug breaks. Unlike conformance/faults.yaml (bugs seeded inside the fake), these faults are on the
wire, so they show that the cases look at what a server answers, not at the fake's internals.

Each fault runs only the areas it touches (the proxy re-frames HTTP, so raw-socket and
declared-length cases are left to the direct runs); without a fault the same selection passes.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from conformance.fake import BackgroundFake
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


def _drop_query(name: str) -> Callable[[Request], None]:
    def fn(req: Request) -> None:
        query = req["query"]
        assert isinstance(query, list)
        req["query"] = [(k, v) for k, v in query if k != name]

    return fn


def _drop_header(name: str) -> Callable[[Request], None]:
    def fn(req: Request) -> None:
        headers = req["headers"]
        assert isinstance(headers, dict)
        for k in [k for k in headers if k.lower() == name]:
            del headers[k]

    return fn


def _plain_errors(req: Request, resp: Response) -> None:
    """A server whose refusals carry text, not the spec's error body."""
    status = resp["status"]
    assert isinstance(status, int)
    if status >= 400:
        resp["body"] = b"Bad Request"
        resp["headers"] = {"Content-Type": "text/plain"}


def _refusals_as_500(req: Request, resp: Response) -> None:
    """A server that crashes (500 internal) on the input it should refuse with a 400."""
    if resp["status"] == 400:
        resp["status"] = 500
        body = {"error": {"code": "internal", "message": "boom", "details": {}}}
        resp["body"] = json.dumps(body).encode()


_TRAVERSAL = re.compile(r"/checkpoints/[^/]*(%2F|%5C)")


def _accepts_traversal(req: Request, resp: Response) -> None:
    """A server that takes a checkpoint id as a path (what the gateway did): it answers the
    traversal attempts as if they had worked."""
    if _TRAVERSAL.search(str(req["path"])) and resp["status"] == 400:
        resp["status"] = 200
        resp["body"] = json.dumps({"deleted": True}).encode()
        resp["headers"] = {"Content-Type": "application/json"}


def _drop_response_header(name: str) -> Callable[[Request, Response], None]:
    def fn(req: Request, resp: Response) -> None:
        headers = resp["headers"]
        assert isinstance(headers, dict)
        for k in [k for k in headers if k.lower() == name]:
            del headers[k]

    return fn


FAULTS = {
    "ignores_cursor": Fault(
        ("polling/*",),
        ("polling/cursor-pages", "polling/bad-cursor", "polling/bad-cursor-paged"),
        on_request=_drop_query("cursor"),
    ),
    "plain_text_errors": Fault(
        ("errors/*", "hostile/json/*", "hostile/checkpoint-id/*"),
        (
            "errors/body/names-the-field",
            "hostile/json/deep-nesting",
            "hostile/checkpoint-id/traversal-delete",
        ),
        on_response=_plain_errors,
    ),
    "refusals_as_500": Fault(
        ("hostile/json/*", "hostile/create-job/*", "hostile/header/*"),
        (
            "hostile/json/deep-nesting",
            "hostile/json/huge-integer",
            "hostile/create-job/non-finite-config",
            "hostile/header/sequence-number",
        ),
        on_response=_refusals_as_500,
    ),
    "checkpoint_ids_are_paths": Fault(
        ("hostile/checkpoint-id/*", "hostile/checkpoint/*"),
        (
            "hostile/checkpoint-id/traversal-delete",
            "hostile/checkpoint-id/traversal-export",
            "hostile/checkpoint/another-tokens-checkpoint",
        ),
        on_response=_accepts_traversal,
    ),
    "drops_idempotency_key": Fault(
        ("idempotency/*",),
        ("idempotency/step-replay", "idempotency/key-conflict"),
        on_request=_drop_header("idempotency-key"),
    ),
    "drops_sequence_numbers": Fault(
        ("sequencing/*",),
        ("sequencing/out-of-order-arrival",),
        on_request=_drop_header("x-arctic-seq"),
    ),
    "no_request_id_header": Fault(
        ("polling/request-id-header",),
        ("polling/request-id-header",),
        on_response=_drop_response_header("x-arctic-request-id"),
    ),
}
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


@pytest.fixture(scope="module")
def proxy(fake: BackgroundFake) -> Iterator[tuple[Proxy, str]]:
    p = Proxy(fake.base_url)
    p.start()
    try:
        yield p, p.url + fake.prefix_url[len(fake.base_url) :]
    finally:
        p.stop()


def _run(target: str, cases: list[Case], fault: Fault) -> dict[str, str]:
    cfg = RunConfig(target=target, transport="http", token=TOKEN, alt_token=ALT_TOKEN)
    report = run_suite(cfg, select(cases, fault.only, SKIP))
    return {r.case.id: r.outcome for r in report.results}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_suite_fails_each_fault_from_outside(
    proxy: tuple[Proxy, str], cases: list[Case], name: str
) -> None:
    p, target = proxy
    fault = FAULTS[name]
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
