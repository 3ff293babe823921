"""Driven by test_toy_op.py in a subprocess, inside a temporary copy of the repository whose spec
has the toy op `toy-sum` and whose generated folders were regenerated from it.

    python toy_op_drive.py static     # the generated table, types, clients, skeleton, adapters
    python toy_op_drive.py adapters   # live HTTP and gRPC through the generated adapters
    python toy_op_drive.py runtime    # live HTTP and gRPC through the protocol runtime
    python toy_op_drive.py sdk        # the same through the SDK's clients
    python toy_op_drive.py engine     # the `engine` op toy-count on the fake gateway and the
                                      # gateway's fake workers, with no servicer code

It imports the copy's `arctic_sdk` and `arctic_servers` (PYTHONPATH), so nothing here or in the
hand-written code knows the op: everything per-op comes from the regenerated modules.
Exit status 0 = passed, 77 = not implemented yet (the test skips), anything else = failed.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import AsyncIterator
from typing import Any

NOT_IMPLEMENTED = 77


def static() -> None:
    from arctic_sdk._generated import client, grpc_stubs, types
    from arctic_sdk.spec.model import BodyKind, GrpcShape, Idempotency, Role
    from arctic_sdk.spec.tables import methods
    from arctic_servers._generated import grpc_services, http_routes, servicer

    toy = methods.BY_NAME["toy-sum"]
    assert toy is methods.TOY_SUM is methods.BY_ALIAS["toy_sum"] is methods.BY_RPC["ToySum"]
    assert toy in methods.METHODS and toy.mutating
    assert (toy.body, toy.idempotency, toy.role) == (
        BodyKind.DSSST1,
        Idempotency.CHUNK_GROUP,
        Role.TRAINING,
    )
    assert toy.grpc_shape is GrpcShape.FRAMES and toy.grpc_path == (
        "/arctic.v1.TrainingService/ToySum"
    )
    assert (toy.request_type, toy.response_type) == (
        "arctic.v1.ToySumRequest",
        "arctic.v1.ToySumResult",
    )
    assert toy.doc.startswith("Toy: sums a tensor")
    rule = types.TENSOR_FIELDS["arctic.v1.ToySumRequest"]["values"]
    assert (rule.required, rule.dtypes, rule.shape) == (True, ("F32", "F64"), ("B", "S"))
    assert types.REQUIRED_FIELDS["arctic.v1.ToySumRequest"] == ("values",)
    assert set(types.ToySumRequest.__annotations__) == {"values", "scale"}
    for cls in (client.Client, client.AsyncClient):
        assert "Toy: sums a tensor" in (inspect.getdoc(cls.toy_sum) or "")
        assert cls.submit_toy_sum
    assert inspect.iscoroutinefunction(servicer.ServicerBase.toy_sum)
    assert servicer.SERVICER_METHODS["toy-sum"] == "toy_sum"
    assert (toy, "/{job_id:[^/:]+}/toy-sum") in http_routes.ROUTES
    assert toy.grpc_path in grpc_stubs.make_stubs(_FakeChannel())
    handlers = grpc_services.generic_handlers(object(), aio=True)  # type: ignore[call-overload]
    assert any(h.service_name() == "arctic.v1.TrainingService" for h in handlers)


class _FakeChannel:
    def __getattr__(self, name: str) -> Any:
        return lambda path, **kw: (name, path)


async def adapters() -> None:
    """The new op over live HTTP and gRPC, through the generated router and adapters only."""
    import grpc
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from arctic_sdk._generated import grpc_stubs
    from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2
    from arctic_sdk.spec.tables import methods
    from arctic_servers._generated import grpc_services, http_routes

    async def handle(method: Any, request: web.Request) -> web.StreamResponse:
        return web.json_response({"op": method.name, "job": request.match_info["job_id"]})

    app = web.Application()
    http_routes.add_routes(app.router, "/p", handle)
    async with TestClient(TestServer(app)) as http:
        resp = await http.post("/p/j7/toy-sum", data=b"frame")
        assert await resp.json() == {"op": "toy-sum", "job": "j7"}

    class Echo:
        async def frames(
            self, method: Any, requests: AsyncIterator[Any], context: Any
        ) -> AsyncIterator[Any]:
            async for f in requests:
                yield dssst1_pb2.Frame(dssst1=method.name.encode() + b":" + f.dssst1)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(grpc_services.generic_handlers(Echo(), aio=True))  # type: ignore[call-overload]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = grpc_stubs.make_stubs(channel)[methods.TOY_SUM.grpc_path](
                iter([dssst1_pb2.Frame(dssst1=b"x")])
            )
            assert [f.dssst1 async for f in call] == [b"toy-sum:x"]
    finally:
        await server.stop(None)


async def runtime() -> None:
    """The toy op end to end through the protocol runtime, over live HTTP and live gRPC.

    The runtime (`arctic_servers.protocol`), the codec and the generated modules are the copy's;
    the only per-op code is `ToySumServicer`. Requests are raw chunk frames on the wire, as the
    SDK's transports send them; a resent chunk group (a retry after a lost answer) executes once.
    """
    import uuid

    import grpc
    import numpy as np
    from aiohttp.test_utils import TestClient, TestServer

    import dssst1
    from arctic_sdk._generated import grpc_stubs
    from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2
    from arctic_sdk.spec.tables import methods
    from arctic_servers.protocol.core import ProtocolCore
    from arctic_servers.serving.grpc_app import start_grpc_server
    from arctic_servers.serving.http_app import make_app

    toy = methods.TOY_SUM
    servicer = toy_sum_servicer()
    core = ProtocolCore(servicer)
    expected = {"total": 12.0, "count": 6}

    def chunks(value: dict[str, Any]) -> list[bytes]:
        return dssst1.encode_chunks(
            dssst1.dumps(value),
            kind="request",
            max_bytes=1 << 20,
            operation=toy.name,
            chunk_group_id=str(uuid.uuid4()),
        )

    body = {"values": np.ones((2, 3), np.float32), "scale": 2.0}
    octet = {"Content-Type": "application/octet-stream"}
    url = "/p" + toy.http_path.format(job_id="j1")
    async with TestClient(TestServer(make_app(core, prefix="/p"))) as http:
        group = chunks(body)
        answers = []
        for _ in range(2):  # the second send is a retry of the same chunk group
            resp = await http.post(url, data=group[0], headers=octet)
            assert resp.status == 200, await resp.text()
            answers.append(await resp.json())
        assert answers[0]["request_id"] == answers[1]["request_id"]
        assert answers[0]["status"] == "completed", answers[0]
        result = dssst1.loads(dssst1.decode_inline_envelope(answers[0]["result"]))
        assert result == expected, result
        assert type(servicer).executions == 1
        for bad, code in [
            ({"scale": 1.0}, "missing_field"),
            ({"values": np.ones((2, 3), np.int64)}, "dtype_mismatch"),
        ]:
            resp = await http.post(url, data=chunks(bad)[0], headers=octet)
            assert (await resp.json())["error"]["code"] == code
    server, port = await start_grpc_server(core)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = grpc_stubs.make_stubs(channel)[toy.grpc_path]
            group = chunks(body)
            statuses = []
            for _ in range(2):
                frames = [dssst1_pb2.Frame(dssst1=c) for c in group]
                call = stub(iter(frames), metadata=(("x-arctic-job-id", "j1"),))
                out = [f.dssst1 async for f in call]
                statuses.append(dssst1.loads(dssst1.decode_chunks(out)))
            assert statuses[0]["request_id"] == statuses[1]["request_id"]
            assert statuses[0]["result"] == expected, statuses[0]
        assert type(servicer).executions == 2  # one HTTP group, one gRPC group
    finally:
        await server.stop(None)


async def sdk() -> int:
    """The same drive through the SDK's `AsyncClient`, over HTTP and over gRPC.

    `client.toy_sum(values=..., scale=2.0)` answers `{"total": 12.0, "count": 6}` on both
    transports; the first HTTP answer is lost after the op executed (the server aborts the
    connection), the SDK resends the same chunk group, and the op still executes once per
    transport (`ToySumServicer.executions`).
    """
    import asyncio

    import numpy as np
    from aiohttp import web

    from arctic_sdk import AsyncClient
    from arctic_servers.serving.serve import start_server

    servicer = toy_sum_servicer()
    lost = {"answers": 1}

    @web.middleware
    async def lose_first_answer(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)  # the op executes
        if lost["answers"] and request.method == "POST":
            lost["answers"] -= 1
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError()  # aiohttp answers nothing: the client sees a drop
        return response  # type: ignore[no-any-return]

    def configure(app: web.Application, core: Any) -> None:
        app.middlewares.append(lose_first_answer)

    srv = await start_server(servicer, configure_app=configure)
    try:
        for transport in ("http", "grpc"):
            async with AsyncClient(
                srv.base_url, transport=transport, job_id="j1", grpc_target=srv.grpc_target
            ) as client:
                result = await client.toy_sum(values=np.ones((2, 3), np.float32), scale=2.0)
            assert result == {"total": 12.0, "count": 6}, (transport, result)
        assert lost["answers"] == 0, "the injected loss never happened"
        assert type(servicer).executions == 2, type(servicer).executions
    finally:
        await srv.close()
    return 0


async def engine() -> int:
    """`toy-count`, an `engine` op: its only hand-written code is the fake engine's
    `op_toy_count` (test_toy_op.TOY_ENGINE_METHOD). The fake gateway (its sub-jobs' engines in
    process) and the gateway (its sub-jobs' engines in worker processes) serve it through the
    generated `ServicerBase.toy_count` -> the server's `run_on_engine`, list it in their
    capabilities' routes, and add the job's global step to the engine's metrics; a sampler's
    engine, which the op cannot run on, is never reached (the op's role is training)."""
    import tempfile
    from pathlib import Path

    import numpy as np

    from arctic_sdk import AsyncClient
    from arctic_servers.gateway.server import start_gateway
    from arctic_servers.gateway.settings import GatewaySettings
    from conformance.fake.server import start_fake

    job = {
        "sub_job_configs": [
            {"job_type": "training", "model_name": "fake-model"},
            {"job_type": "sampling", "model_name": "fake-model"},
        ]
    }
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)

    async def drive(base_url: str, grpc_target: str) -> None:
        for transport in ("http", "grpc"):
            kw = {"transport": transport, "grpc_target": grpc_target}
            async with AsyncClient(base_url, **kw) as client:  # type: ignore[arg-type]
                assert "toy-count" in (await client.get_capabilities())["routes"]
                await client.create_job(job)
                try:
                    await client.wait_until_running(timeout=120)
                    result = await client.toy_count(input_ids=ids)
                    assert result == {
                        "count": 6,
                        "metrics": {"model_step": 0, "global_step": 0},
                    }, (transport, result)
                finally:
                    # the gateway's worker hosts outlive the gateway (a restart reattaches):
                    # the job's end is what stops them
                    await client.cancel_job()

    fake = await start_fake()
    try:
        await drive(fake.base_url, fake.grpc_target)
    finally:
        await fake.close()
    with tempfile.TemporaryDirectory() as tmp:
        gw = await start_gateway(GatewaySettings(db=Path(tmp) / "state.db", engine="fake"))
        try:
            await drive(gw.base_url, gw.grpc_target)
        finally:
            await gw.close()
    return 0


def toy_sum_servicer() -> Any:
    """The toy servicer: the toy op's business logic only (the generated skeleton does the rest)."""
    from arctic_servers._generated.servicer import ServicerBase
    from arctic_servers.protocol.context import CallContext

    class ToySumServicer(ServicerBase):
        executions = 0

        async def toy_sum(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
            type(self).executions += 1
            values = body["values"]
            return {"total": float(values.sum()) * body.get("scale", 1.0), "count": values.size}

    return ToySumServicer()


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else "static"
    if mode == "static":
        static()
        return 0
    if mode == "adapters":
        asyncio.run(adapters())
        return 0
    if mode == "runtime":
        asyncio.run(runtime())
        return 0
    if mode == "sdk":
        return asyncio.run(sdk())
    if mode == "engine":
        return asyncio.run(engine())
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
