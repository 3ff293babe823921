"""The protocol servers mount the Tinker surface without importing `tinker` (and through it
torch: seconds of CPU on every server start) until the first Tinker request, which then gets
the surface's real answers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from .conftest import ROOT

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    import arctic_servers.gateway.__main__, arctic_servers.onprem.__main__
    from arctic_servers._generated.servicer import ServicerBase
    from arctic_servers.protocol.config import ProtocolConfig
    from arctic_servers.protocol.core import ProtocolCore
    from arctic_servers.serving.http_app import make_app
    from arctic_servers.tinker.mount import mount
    from arctic_servers.tinker.settings import TinkerSettings

    core = ProtocolCore(ServicerBase(), ProtocolConfig(tokens=frozenset({"k"})))
    app = make_app(core)
    lazy = mount(app, TinkerSettings(models=("m",)))  # its callers: the core's tokens
    heavy = sorted(m for m in ("tinker", "torch") if m in sys.modules)
    assert not heavy, f"imported at start: {heavy}"

    async def main():
        async with TestClient(TestServer(app)) as c:
            r = await c.get("/api/v1/healthz")  # no key: the surface's own 401
            assert r.status == 401 and (await r.json())["code"] == "unauthenticated", r.status
            c.session.headers["X-API-Key"] = "tml-k"
            r = await c.get("/api/v1/healthz")
            assert r.status == 200 and await r.json() == {"status": "ok"}, r.status
            assert "tinker" in sys.modules and lazy.routes is not None
            routes = lazy.routes
            r = await c.get("/api/v1/get_server_capabilities")
            body = await r.json()
            assert [m["model_name"] for m in body["supported_models"]] == ["m"], body
            r = await c.post("/api/v1/no_such_route", json={})
            assert r.status == 404 and "no_such_route" in (await r.json())["detail"]
            assert lazy.routes is routes  # built once
            assert routes.ops.backend.calls.core is core  # the app's core, in process

    asyncio.run(main())
    print("ok")
    """
)


def test_tinker_is_imported_on_the_first_tinker_request_only() -> None:
    p = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr[-4000:]


BROKEN = textwrap.dedent(
    """
    import asyncio
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    import importlib
    m = importlib.import_module("arctic_servers.tinker.mount")

    def broken(self):
        raise ImportError("tinker.proto: no module named tinker_public_pb2")

    m.LazyTinker._build = broken
    from arctic_servers._generated.servicer import ServicerBase
    from arctic_servers.protocol.core import ProtocolCore
    from arctic_servers.serving.http_app import make_app

    app = make_app(ProtocolCore(ServicerBase()))
    lazy = m.mount(app)

    async def main():
        async with TestClient(TestServer(app)) as c:
            for _ in range(2):  # each request tries again, none answers a bare 500
                r = await c.get("/api/v1/healthz", headers={"X-API-Key": "tml-k"})
                body = await r.json()
                assert r.status == 503 and body["code"] == "unavailable", (r.status, body)
                assert "tinker_public_pb2" in body["detail"], body
            assert lazy.routes is None

    asyncio.run(main())
    print("ok")
    """
)


def test_a_surface_that_cannot_be_built_answers_503_naming_why() -> None:
    p = subprocess.run(
        [sys.executable, "-c", BROKEN], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr[-4000:]
