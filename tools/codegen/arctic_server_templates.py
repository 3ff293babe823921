"""Templates of the server side: the servicer skeleton, the aiohttp routes, the gRPC adapters."""

# The templates hold generated lines of up to 100 columns inside quotes and indentation.
# ruff: noqa: E501

from __future__ import annotations

import re

from arctic_grpc_templates import grpc_types, pb2_imports
from arctic_render import Layout, docstring, fits, import_block, method_summary, module, py_str
from arctic_types import Method, Spec, SpecError

# ---------------------------------------------------------------------------- servicer.py


def render_servicer(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "The servicer skeleton: one coroutine method per op that a server implements.\n\n"
        "A server subclasses `ServicerBase` and overrides the ops it serves; the protocol layer\n"
        f"(`{layout.server_runtime_package}`) decodes and validates each call's body, then awaits\n"
        "the method named by `SERVICER_METHODS`. An op left alone answers `unimplemented`, except\n"
        "the ops the method table marks `engine`: those are forwarded to the target sub-job's\n"
        "engine by the server's one `run_on_engine` (`protocol/servicer_hooks.py`, where the other\n"
        "hooks the protocol layer calls are declared). Ops that the method table marks `protocol`\n"
        "(polls, capabilities, request cancellation) are answered by the protocol layer and have no\n"
        "method here."
    )
    ops = [m for m in spec.methods if not m.protocol]
    if not any(e.const == "UNIMPLEMENTED" for e in spec.errors):
        raise SpecError("the error enum has no UNIMPLEMENTED code for the servicer's defaults")
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Mapping",
            "from types import MappingProxyType",
            "from typing import Any, Final",
            f"from {layout.model_module} import MethodInfo",
            f"from {layout.spec_package} import methods",
            f"from {layout.spec_package}.error_codes import ErrorCode",
            f"from {layout.server_runtime_package}.context import CallContext",
            f"from {layout.server_errors_module} import ProtocolError",
            f"from {layout.server_runtime_package}.servicer_hooks import ServicerHooks, default_op",
        ],
        layout.server_package,
    )
    body += [
        "",
        "",
        "def _unimplemented(servicer: object, method: MethodInfo) -> ProtocolError:",
        "    return ProtocolError(",
        "        ErrorCode.UNIMPLEMENTED,",
        '        f"{type(servicer).__name__} does not implement {method.name}",',
        "        op=method.name,",
        "    )",
        "",
        "",
        "class ServicerBase(ServicerHooks):",
        *docstring(
            "Business logic of a server: override the ops it implements.\n\n"
            "Each method receives the call's `CallContext` and its body (the request message as a\n"
            "dict, tensors as arrays, already validated against the spec) and returns the result\n"
            "message as a dict (raw bytes for downloads). Raise `ProtocolError` to fail the call.",
            "    ",
        ),
    ]
    for m in ops:
        res = "bytes" if not m.response_type else "dict[str, Any]"
        mdoc = (m.doc or f"The ``{m.name}`` op.") + "\n\n" + "\n".join(method_summary(m))
        if m.engine:
            mdoc += "\nDefault: forwarded to the target sub-job's engine (``run_on_engine``)."
        else:
            mdoc += "\nDefault: raises ``unimplemented``."
        sig = (
            f"    async def {m.python_name}(self, ctx: CallContext, body: dict[str, Any]) -> {res}:"
        )
        if not fits(sig):
            sig = (
                f"    async def {m.python_name}(\n"
                f"        self, ctx: CallContext, body: dict[str, Any]\n    ) -> {res}:"
            )
        body += [
            "",
            "    @default_op",
            *sig.split("\n"),
            *docstring(mdoc, "        "),
            f"        return await self.run_on_engine(ctx, methods.{m.const}, body)"
            if m.engine
            else f"        raise _unimplemented(self, methods.{m.const})",
        ]
    body += [
        "",
        "",
        "SERVICER_METHODS: Final[Mapping[str, str]] = MappingProxyType(",
        "    {",
        *[f"        methods.{m.const}.name: {py_str(m.python_name)}," for m in ops],
        "    }",
        ")",
        '"""Op name -> the `ServicerBase` method that implements it (non-protocol ops only)."""',
    ]
    return module(head, doc, body)


# ---------------------------------------------------------------------------- http_routes.py


def aiohttp_pattern(http_path: str) -> str:
    """`/{job_id}:cancel` -> `/{job_id:[^/:]+}:cancel`: parameters never match `/` or `:`."""
    return re.sub(r"{(\w+)}", r"{\1:[^/:]+}", http_path)


def _route_key(m: Method) -> tuple[list[tuple[int, str]], str]:
    # Per segment, static text sorts before a parameter, so `/capacity` precedes `/{job_id}`.
    segs = [(1 if "{" in seg else 0, seg) for seg in m.http_path.split("/")]
    return segs, m.http_method


def render_http_routes(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "The HTTP routes of the spec for aiohttp.web.\n\n"
        "`ROUTES` pairs each op with its aiohttp path pattern relative to the prefix; `add_routes`\n"
        "registers all of them on a router, each bound to one protocol handler that receives the\n"
        "op's `MethodInfo`. Path parameters match `[^/:]+`, so `/{job_id}` never swallows a colon\n"
        "action such as `/{job_id}:cancel`, and a static segment is registered before a parameter\n"
        "in the same position (`/capacity` before `/{job_id}`)."
    )
    routes = []
    for m in sorted(spec.methods, key=_route_key):
        one = f"    (methods.{m.const}, {py_str(aiohttp_pattern(m.http_path))}),"
        if fits(one):
            routes.append(one)
        else:
            routes += [
                "    (",
                f"        methods.{m.const},",
                f"        {py_str(aiohttp_pattern(m.http_path))},",
                "    ),",
            ]
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import Awaitable, Callable",
            "from typing import Final, TypeAlias",
            "from aiohttp import web",
            f"from {layout.model_module} import MethodInfo",
            f"from {layout.spec_package} import methods",
        ],
        layout.server_package,
    )
    body += [
        "",
        "Handler: TypeAlias = Callable[[MethodInfo, web.Request], Awaitable[web.StreamResponse]]",
        '"""The protocol handler every route is bound to."""',
        "",
        "ROUTES: Final[tuple[tuple[MethodInfo, str], ...]] = (",
        *routes,
        ")",
        '"""(method, aiohttp path pattern relative to the prefix), in registration order."""',
        "",
        "",
        "def _bind(",
        "    handler: Handler, method: MethodInfo",
        ") -> Callable[[web.Request], Awaitable[web.StreamResponse]]:",
        "    async def route_handler(request: web.Request) -> web.StreamResponse:",
        "        return await handler(method, request)",
        "",
        '    route_handler.__name__ = route_handler.__qualname__ = f"route_{method.python_name}"',
        "    return route_handler",
        "",
        "",
        "def add_routes(router: web.UrlDispatcher, prefix: str, handler: Handler) -> list[web.AbstractRoute]:",
        *docstring(
            "Register every route of the spec under `prefix` (no trailing slash) on `router`.\n\n"
            "Each route calls `handler(method, request)` with its op's `MethodInfo`.",
            "    ",
        ),
        "    return [",
        "        router.add_route(method.http_method, prefix + pattern, _bind(handler, method))",
        "        for method, pattern in ROUTES",
        "    ]",
    ]
    return module(head, doc, body)


# ---------------------------------------------------------------------------- grpc_services.py

_HANDLER = {
    "FRAMES": "stream_stream_rpc_method_handler",
    "UNARY_TO_FRAMES": "unary_stream_rpc_method_handler",
    "UNARY": "unary_unary_rpc_method_handler",
}
_BIND = {"FRAMES": "frames", "UNARY_TO_FRAMES": "unary_frames", "UNARY": "unary"}


def _signature(head: str, params: list[str], tail: str) -> list[str]:
    """A def line as ruff format lays it out: one line, else params on one line, else one each."""
    indent = head[: len(head) - len(head.lstrip())]
    one = f"{head}{', '.join(params)}{tail}"
    if fits(one):
        return [one]
    inner = f"{indent}    {', '.join(params)}"
    if fits(inner):
        return [head, inner, f"{indent}{tail}"]
    return [head, *[f"{indent}    {p}," for p in params], f"{indent}{tail}"]


def render_grpc_services(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "gRPC service adapters of the spec, for `grpc.server` and `grpc.aio.server`.\n\n"
        "`generic_handlers(handler, aio=...)` returns one generic handler per service that binds\n"
        "every RPC to the protocol handler by its shape: `handler.frames(method, requests, context)`\n"
        "for stream-to-stream RPCs, `handler.unary_frames(method, request, context)` for\n"
        "unary-to-stream, `handler.unary(method, request, context)` for unary RPCs, with the\n"
        "request deserializers and response serializers of the right message classes. The handler\n"
        "types are the `GrpcHandler` (sync server) and `AsyncGrpcHandler` (grpc.aio) protocols."
    )
    modules: dict[str, str] = {}
    frame_types: set[str] = set()
    table: list[str] = []
    for s in spec.services:
        table += [
            "        grpc.method_handlers_generic_handler(",
            f"            {py_str(s.full_name)},",
            "            {",
        ]
        for m in s.methods:
            req, res = grpc_types(m, spec, modules)
            if m.grpc_shape == "FRAMES":
                frame_types |= {req, res}
            elif m.grpc_shape == "UNARY_TO_FRAMES":
                frame_types.add(res)
            table += [
                f"                {py_str(m.rpc)}: grpc.{_HANDLER[m.grpc_shape]}(",
                f"                    bind.{_BIND[m.grpc_shape]}(handler, methods.{m.const}),",
                f"                    request_deserializer={req}.FromString,",
                f"                    response_serializer={res}.SerializeToString,",
                "                ),",
            ]
        table += ["            },", "        ),"]
    frame = frame_types.pop() if len(frame_types) == 1 else "Message"
    services = ", ".join(py_str(s.full_name) for s in spec.services)
    if len(spec.services) == 1:
        services += ","
    body = import_block(
        [
            "from __future__ import annotations",
            "from collections.abc import AsyncIterator, Callable, Iterable, Iterator",
            "from typing import Any, Final, Literal, Protocol, overload",
            "import grpc",
            "from google.protobuf.message import Message",
            f"from {layout.model_module} import MethodInfo",
            f"from {layout.spec_package} import methods",
            *pb2_imports(modules, layout),
        ],
        layout.server_package,
    )
    body += [
        "",
        f"SERVICES: Final[tuple[str, ...]] = ({services})",
        '"""Full names of the services, for reflection and health checks."""',
        "",
        "",
        "class GrpcHandler(Protocol):",
        '    """What a sync `grpc.server` binds every RPC to."""',
        "",
        *_signature(
            "    def frames(",
            [
                "self",
                "method: MethodInfo",
                f"requests: Iterator[{frame}]",
                "context: grpc.ServicerContext",
            ],
            f") -> Iterable[{frame}]: ...",
        ),
        "",
        *_signature(
            "    def unary_frames(",
            ["self", "method: MethodInfo", "request: Message", "context: grpc.ServicerContext"],
            f") -> Iterable[{frame}]: ...",
        ),
        "",
        "    def unary(",
        "        self, method: MethodInfo, request: Message, context: grpc.ServicerContext",
        "    ) -> Message: ...",
        "",
        "",
        "class AsyncGrpcHandler(Protocol):",
        '    """What a `grpc.aio.server` binds every RPC to (async generators and a coroutine)."""',
        "",
        *_signature(
            "    def frames(",
            [
                "self",
                "method: MethodInfo",
                f"requests: AsyncIterator[{frame}]",
                "context: grpc.aio.ServicerContext",
            ],
            f") -> AsyncIterator[{frame}]: ...",
        ),
        "",
        *_signature(
            "    def unary_frames(",
            ["self", "method: MethodInfo", "request: Message", "context: grpc.aio.ServicerContext"],
            f") -> AsyncIterator[{frame}]: ...",
        ),
        "",
        "    async def unary(",
        "        self, method: MethodInfo, request: Message, context: grpc.aio.ServicerContext",
        "    ) -> Message: ...",
        "",
        "",
        "class _SyncBind:",
        "    # grpc.server iterates a streaming behaviour's result with next(): any iterable will do.",
        "    @staticmethod",
        "    def frames(handler: GrpcHandler, method: MethodInfo) -> Callable[..., Any]:",
        *_signature(
            "        def behavior(",
            [f"requests: Iterator[{frame}]", "context: Any"],
            f") -> Iterator[{frame}]:",
        ),
        "            return iter(handler.frames(method, requests, context))",
        "",
        "        return behavior",
        "",
        "    @staticmethod",
        "    def unary_frames(handler: GrpcHandler, method: MethodInfo) -> Callable[..., Any]:",
        *_signature(
            "        def behavior(",
            ["request: Message", "context: Any"],
            f") -> Iterator[{frame}]:",
        ),
        "            return iter(handler.unary_frames(method, request, context))",
        "",
        "        return behavior",
        "",
        "    @staticmethod",
        "    def unary(handler: GrpcHandler, method: MethodInfo) -> Callable[..., Any]:",
        "        def behavior(request: Message, context: Any) -> Message:",
        "            return handler.unary(method, request, context)",
        "",
        "        return behavior",
        "",
        "",
        "class _AsyncBind:",
        "    # grpc.aio tells streaming behaviours apart by being async generator functions.",
        "    @staticmethod",
        "    def frames(handler: AsyncGrpcHandler, method: MethodInfo) -> Callable[..., Any]:",
        *_signature(
            "        async def behavior(",
            [f"requests: AsyncIterator[{frame}]", "context: Any"],
            f") -> AsyncIterator[{frame}]:",
        ),
        "            async for frame in handler.frames(method, requests, context):",
        "                yield frame",
        "",
        "        return behavior",
        "",
        "    @staticmethod",
        "    def unary_frames(handler: AsyncGrpcHandler, method: MethodInfo) -> Callable[..., Any]:",
        *_signature(
            "        async def behavior(",
            ["request: Message", "context: Any"],
            f") -> AsyncIterator[{frame}]:",
        ),
        "            async for frame in handler.unary_frames(method, request, context):",
        "                yield frame",
        "",
        "        return behavior",
        "",
        "    @staticmethod",
        "    def unary(handler: AsyncGrpcHandler, method: MethodInfo) -> Callable[..., Any]:",
        "        async def behavior(request: Message, context: Any) -> Message:",
        "            return await handler.unary(method, request, context)",
        "",
        "        return behavior",
        "",
        "",
        "@overload",
        "def generic_handlers(handler: GrpcHandler, *, aio: Literal[False]) -> list[Any]: ...",
        "",
        "",
        "@overload",
        "def generic_handlers(handler: AsyncGrpcHandler, *, aio: Literal[True]) -> list[Any]: ...",
        "",
        "",
        "def generic_handlers(handler: Any, *, aio: bool) -> list[Any]:",
        *docstring(
            "One `grpc.GenericRpcHandler` per service, every RPC bound to `handler`.\n\n"
            "Pass the result to `server.add_generic_rpc_handlers`; `aio` selects the grpc.aio\n"
            "behaviours (async generators and coroutines) or the sync ones.",
            "    ",
        ),
        "    bind: Any = _AsyncBind if aio else _SyncBind",
        "    return [",
        *table,
        "    ]",
    ]
    return module(head, doc, body)


def render_server_init(spec: Spec, layout: Layout, head: list[str]) -> str:
    doc = (
        "Generated from the spec by protoc-gen-arctic (`tools/codegen`); nothing here is hand-written.\n\n"
        "`servicer` (the `ServicerBase` skeleton), `http_routes` (aiohttp routes), `grpc_services`\n"
        "(gRPC adapters). The protocol runtime that uses them is `arctic_servers.protocol`.\n"
        "Regenerate with `python tools/codegen/generate.py`."
    )
    return module(head, doc, [])
