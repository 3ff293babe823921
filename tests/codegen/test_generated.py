"""The generated modules cover every RPC of the spec, import, type-check, and serve live traffic.

The live tests drive the generated aiohttp routes and gRPC adapters (sync and grpc.aio) with a
generic protocol handler that knows no op: every route and every RPC must reach it with its own
`MethodInfo`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import spec_loader
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from google.protobuf.message import Message

from arctic_sdk._client_base import CallOptions
from arctic_sdk._generated import client, grpc_stubs
from arctic_sdk._misuse import keyword_names
from arctic_sdk.errors import InvalidArgumentError
from arctic_sdk.spec.model import GrpcShape, MethodInfo
from arctic_sdk.spec.pb.arctic.v1 import dssst1_pb2
from arctic_sdk.spec.tables import error_codes, methods
from arctic_servers._generated import grpc_services, http_routes, servicer
from arctic_servers.protocol.context import CallContext
from arctic_servers.rules.errors import ProtocolError

ROOT = Path(__file__).resolve().parents[2]
SDK_GEN = ROOT / "sdk" / "arctic_sdk" / "_generated"
SERVER_GEN = ROOT / "servers" / "arctic_servers" / "_generated"
SPEC_GEN = [ROOT / "sdk" / "arctic_sdk" / "spec" / d for d in ("tables", "pb")]
GENERATED_PY = sorted(
    [
        *SDK_GEN.rglob("*.py"),
        *SERVER_GEN.rglob("*.py"),
        *(p for d in SPEC_GEN for p in d.rglob("*.py")),
    ]
)
HAND_WRITTEN_PY = [p for p in GENERATED_PY if not p.name.endswith("_pb2.py")]
SPEC = spec_loader.methods()
PREFIX = "/api/v2/databases/{db}/schemas/{schema}/{endpoint}"
PARAMS = {
    "job_id": "j1",
    "checkpoint_id": "ck1",
    "filename": "model.safetensors",
    "request_id": "r1",
}


def _module_name(path: Path) -> str:
    base = ROOT / ("servers" if SERVER_GEN in path.parents else "sdk")
    return (
        path.relative_to(base)
        .with_suffix("")
        .as_posix()
        .replace("/", ".")
        .removesuffix(".__init__")
    )


@pytest.mark.parametrize("path", GENERATED_PY, ids=lambda p: p.name)
def test_every_generated_module_imports_and_has_its_banner(path: Path) -> None:
    importlib.import_module(_module_name(path))
    head = "".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:3])
    assert "DO NOT EDIT" in head


def test_method_table_matches_the_spec_options() -> None:
    assert [m.rpc for m in methods.METHODS] == [m.rpc for m in SPEC] or sorted(
        m.rpc for m in methods.METHODS
    ) == sorted(m.rpc for m in SPEC)
    for s in SPEC:
        m = methods.BY_RPC[s.rpc]
        assert methods.BY_NAME[s.name] is m
        assert (m.service, m.name, m.http_method, m.http_path) == (
            s.service,
            s.name,
            s.http_method,
            s.http_path,
        )
        assert (m.body.name, m.role.name, m.idempotency.name, m.fallback.name) == (
            s.body,
            s.role,
            s.idempotency,
            s.fallback,
        )
        assert (m.operation_type, m.aliases, m.request_type) == (
            s.operation_type,
            s.aliases,
            s.request_type,
        )
        # spec_loader falls back to the gRPC output type (Frame) where the op has no result type
        assert m.response_type == s.response_type or (m.response_type, s.response_type) == (
            "",
            "arctic.v1.Frame",
        )
        assert m.job_scoped == m.http_path.startswith("/{job_id}")
        assert methods.BY_GRPC_PATH[m.grpc_path] is m
        for alias in m.aliases:
            assert methods.BY_ALIAS[alias] is m
        assert m.doc, f"{m.rpc} has no doc comment"
    shapes = {m.rpc: m.grpc_shape for m in methods.METHODS}
    assert shapes["ForwardBackward"] is GrpcShape.FRAMES
    assert shapes["GetRequest"] is GrpcShape.UNARY_TO_FRAMES
    assert shapes["CreateJob"] is GrpcShape.UNARY


def test_error_table_matches_the_spec_options() -> None:
    spec = spec_loader.errors()
    assert [e.code for e in spec] == list(error_codes.ERRORS)
    for e in spec:
        info = error_codes.ERRORS[e.code]
        assert error_codes.ErrorCode(e.code) == e.code == info.code
        doc = " ".join(info.doc.split())  # spec_loader joins comment lines with spaces
        assert (info.http_status, info.grpc_status, info.user_fault, info.retryable, doc) == (
            e.http_status,
            e.grpc_status,
            e.user_fault,
            e.retryable,
            e.doc,
        )


@pytest.mark.parametrize("m", methods.METHODS, ids=lambda m: m.python_name)
def test_clients_have_documented_methods_for_every_op(m: MethodInfo) -> None:
    for cls, aio in ((client.Client, False), (client.AsyncClient, True)):
        fn = getattr(cls, m.python_name)
        assert inspect.iscoroutinefunction(fn) is aio
        doc = inspect.getdoc(fn) or ""
        assert m.doc.splitlines()[0] in doc and m.http_path in doc and m.name in doc
        assert inspect.getdoc(getattr(cls, f"submit_{m.python_name}"))


def _answer(method: MethodInfo) -> dict[str, Any]:
    return {"op": method.name, "job_id": "j1"}


class _Recorder:
    """A transport that records what the generated clients hand it."""

    def __init__(self) -> None:
        self.calls: list[tuple[MethodInfo, dict[str, Any], CallOptions | None]] = []

    def call(self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None) -> Any:
        self.calls.append((method, body, options))
        return _answer(method)

    def submit(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> futures.Future[Any]:
        self.calls.append((method, body, options))
        fut: futures.Future[Any] = futures.Future()
        fut.set_result(_answer(method))
        return fut

    def close(self) -> None:
        pass


class _AsyncRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[MethodInfo, dict[str, Any], CallOptions | None]] = []

    async def call(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> Any:
        self.calls.append((method, body, options))
        return _answer(method)

    def submit(
        self, method: MethodInfo, body: dict[str, Any], options: CallOptions | None
    ) -> asyncio.Future[Any]:
        self.calls.append((method, body, options))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(_answer(method))
        return fut

    async def close(self) -> None:
        pass


async def test_clients_delegate_every_op_to_the_transport() -> None:
    opts = CallOptions(timeout=1.0)
    sync_t, async_t = _Recorder(), _AsyncRecorder()
    sync_c = client.Client(transport=sync_t)
    async_c = client.AsyncClient(transport=async_t)
    for m in methods.METHODS:
        names = keyword_names(m)[:-1]  # the op's fields and path parameters ("options" last)
        b = names[0] if names else "b"
        kw = {b: 2} if names else {}
        assert getattr(sync_c, m.python_name)({"a": 1, b: 1}, options=opts, **kw) == _answer(m)
        assert await getattr(async_c, m.python_name)({"a": 1}, **kw) == _answer(m)
        unset = {b: None} if names else {}  # None = unset: not sent
        assert getattr(sync_c, f"submit_{m.python_name}")(**unset).result() == _answer(m)
        assert await getattr(async_c, f"submit_{m.python_name}")() == _answer(m)
        want = {"a": 1, b: 2 if names else 1}
        assert sync_t.calls[-2:] == [(m, want, opts), (m, {}, None)]
        assert async_t.calls[-2:] == [(m, {"a": 1, **kw}, None), (m, {}, None)]
        # every keyword is a named parameter, documented under Args (help() shows them)
        params = inspect.signature(getattr(client.Client, m.python_name)).parameters
        assert [p for p in params if p not in ("self", "body", "unknown")] == [*names, "options"]
        doc = inspect.getdoc(getattr(client.Client, m.python_name)) or ""
        assert all(f"    {n}: " in doc for n in [*names, "options"]), m.name
        # an unknown keyword is refused by name before the transport sees it
        n_calls = len(sync_t.calls)
        for call in (getattr(sync_c, m.python_name), getattr(sync_c, f"submit_{m.python_name}")):
            with pytest.raises(InvalidArgumentError) as err:
                call(bogus_field=1)
            assert err.value.details["unknown_fields"] == ["bogus_field"]
        assert len(sync_t.calls) == n_calls


async def test_servicer_skeleton_answers_unimplemented_for_every_business_op() -> None:
    base = servicer.ServicerBase()
    business = [m for m in methods.METHODS if not m.protocol]
    assert dict(servicer.SERVICER_METHODS) == {m.name: m.python_name for m in business}
    for m in methods.METHODS:
        if m.protocol:
            assert not hasattr(base, m.python_name), m.name
            continue
        fn = getattr(base, m.python_name)
        assert inspect.getdoc(fn) and m.doc.splitlines()[0] in (inspect.getdoc(fn) or "")
        with pytest.raises(ProtocolError) as err:
            await fn(CallContext(method=m), {})
        assert err.value.code == "unimplemented" and err.value.http_status == 501
        assert err.value.details == {"op": m.name}


def _url(m: MethodInfo) -> str:
    prefix = PREFIX.format(db="d", schema="s", endpoint="e")
    return prefix + m.http_path.format(**PARAMS)


async def _echo(method: MethodInfo, request: web.Request) -> web.StreamResponse:
    return web.json_response({"op": method.name, "params": dict(request.match_info)})


async def test_every_route_reaches_its_op_over_live_http() -> None:
    app = web.Application()
    routes = http_routes.add_routes(app.router, PREFIX, _echo)
    assert len(routes) == len(methods.METHODS) == len(http_routes.ROUTES)
    async with TestClient(TestServer(app)) as http:
        for m in methods.METHODS:
            resp = await http.request(m.http_method, _url(m))
            assert resp.status == 200, (m.name, resp.status)
            got = await resp.json()
            assert got["op"] == m.name
            assert {k: got["params"][k] for k in m.path_params} == {
                k: PARAMS[k] for k in m.path_params
            }
        # Colon actions and static segments are never taken for a job id.
        base = PREFIX.format(db="d", schema="s", endpoint="e")
        for verb, path, op in [
            ("GET", "/capacity", methods.GET_CAPACITY),
            ("GET", "/capabilities", methods.GET_CAPABILITIES),
            ("POST", "/j1:cancel", methods.CANCEL_JOB),
            ("GET", "/j1", methods.GET_JOB),
        ]:
            resp = await http.request(verb, base + path)
            assert (await resp.json())["op"] == op.name
        assert (await http.get(base + "/j1:cancel")).status == 405
        assert (await http.get(base + "/j1/nope")).status == 404


class _AsyncEcho:
    """A generic grpc.aio handler: tags the call with its op, echoes frames."""

    async def frames(
        self,
        method: MethodInfo,
        requests: AsyncIterator[dssst1_pb2.Frame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[dssst1_pb2.Frame]:
        await context.send_initial_metadata((("x-op", method.name),))
        async for frame in requests:
            yield dssst1_pb2.Frame(dssst1=b"echo:" + frame.dssst1)

    async def unary_frames(
        self, method: MethodInfo, request: Message, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[dssst1_pb2.Frame]:
        await context.send_initial_metadata((("x-op", method.name),))
        yield dssst1_pb2.Frame(dssst1=type(request).__name__.encode())

    async def unary(
        self, method: MethodInfo, request: Message, context: grpc.aio.ServicerContext
    ) -> Message:
        await context.send_initial_metadata((("x-op", method.name),))
        return grpc_stubs.MESSAGE_TYPES[method.grpc_path][1]()


class _SyncEcho:
    def frames(
        self,
        method: MethodInfo,
        requests: Iterator[dssst1_pb2.Frame],
        context: grpc.ServicerContext,
    ) -> Iterable[dssst1_pb2.Frame]:
        context.send_initial_metadata((("x-op", method.name),))
        return [dssst1_pb2.Frame(dssst1=b"echo:" + f.dssst1) for f in requests]

    def unary_frames(
        self, method: MethodInfo, request: Message, context: grpc.ServicerContext
    ) -> Iterable[dssst1_pb2.Frame]:
        context.send_initial_metadata((("x-op", method.name),))
        return [dssst1_pb2.Frame(dssst1=type(request).__name__.encode())]

    def unary(self, method: MethodInfo, request: Message, context: grpc.ServicerContext) -> Message:
        context.send_initial_metadata((("x-op", method.name),))
        return grpc_stubs.MESSAGE_TYPES[method.grpc_path][1]()


def _frames() -> list[dssst1_pb2.Frame]:
    return [dssst1_pb2.Frame(dssst1=b"a"), dssst1_pb2.Frame(dssst1=b"b")]


def _expected(m: MethodInfo) -> list[bytes] | None:
    req_cls = grpc_stubs.MESSAGE_TYPES[m.grpc_path][0]
    if m.grpc_shape is GrpcShape.FRAMES:
        return [b"echo:a", b"echo:b"]
    if m.grpc_shape is GrpcShape.UNARY_TO_FRAMES:
        return [req_cls.__name__.encode()]
    return None


async def test_every_rpc_reaches_its_op_over_live_grpc_aio() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(grpc_services.generic_handlers(_AsyncEcho(), aio=True))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stubs = grpc_stubs.make_stubs(channel)
            assert set(stubs) == {m.grpc_path for m in methods.METHODS}
            for m in methods.METHODS:
                req_cls, res_cls = grpc_stubs.MESSAGE_TYPES[m.grpc_path]
                if m.grpc_shape is GrpcShape.FRAMES:
                    call = stubs[m.grpc_path](iter(_frames()))
                else:
                    call = stubs[m.grpc_path](req_cls())
                if m.grpc_shape is GrpcShape.UNARY:
                    assert isinstance(await call, res_cls)
                else:
                    assert [f.dssst1 async for f in call] == _expected(m)
                assert ("x-op", m.name) in tuple(await call.initial_metadata())
    finally:
        await server.stop(None)


def test_every_rpc_reaches_its_op_over_live_grpc_sync() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers(grpc_services.generic_handlers(_SyncEcho(), aio=False))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stubs = grpc_stubs.make_stubs(channel)
            for m in methods.METHODS:
                req_cls, res_cls = grpc_stubs.MESSAGE_TYPES[m.grpc_path]
                if m.grpc_shape is GrpcShape.UNARY:
                    resp, call = stubs[m.grpc_path].with_call(req_cls())
                    assert isinstance(resp, res_cls)
                else:
                    arg = iter(_frames()) if m.grpc_shape is GrpcShape.FRAMES else req_cls()
                    call = stubs[m.grpc_path](arg)
                    assert [f.dssst1 for f in call] == _expected(m)
                assert ("x-op", m.name) in tuple(call.initial_metadata())
    finally:
        server.stop(None)


def _mypy(*files: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_generated_code_is_mypy_strict_clean() -> None:
    proc = _mypy(*HAND_WRITTEN_PY)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_typed_bodies_catch_misspelt_fields(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(
        "from arctic_sdk._generated.client import Client\n"
        "def f(c: Client) -> float:\n"
        '    r = c.step({"learning_rate": 1e-5})\n'
        '    return r["metrics"]["loss"]\n'
        "def g(c: Client) -> list[list[int]]:\n"
        '    r = c.generate({"prompts": ["hi", [1, 2]]}, options=None)\n'
        '    return [s["token_ids"] for comp in r["results"] for s in comp["samples"]]\n'
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from arctic_sdk._generated.client import Client\n"
        "def f(c: Client) -> None:\n"
        '    c.step({"learnig_rate": 1e-5})\n'
    )
    proc = _mypy(good)
    assert proc.returncode == 0, proc.stdout
    proc = _mypy(bad)
    assert proc.returncode == 1 and 'expected "StepRequest | None"' in proc.stdout, proc.stdout
