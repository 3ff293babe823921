"""protoc-gen-arctic: the protoc plugin that turns the spec's options into Python modules.

Run by protoc (`--arctic_out=DIR`, through `tools/codegen/protoc-gen-arctic` or `python
tools/codegen/protoc_gen_arctic.py`): it reads a `CodeGeneratorRequest` on stdin and writes a
`CodeGeneratorResponse` on stdout. From one method model (`arctic_model.build_spec`) it emits

- spec (`spec_out`, public: `arctic_sdk.spec.tables`): `methods.py` (method table),
  `error_codes.py` (error table); the package `__init__.py` files of the protobuf modules under
  `pb2_out` (`arctic_sdk.spec.pb`);
- SDK (`sdk_out`): `error_classes.py` (one exception class per code), `types.py`
  (TypedDicts and field constraints), `client.py` (`Client`, `AsyncClient`), `grpc_stubs.py`;
- server (`server_out`): `servicer.py` (`ServicerBase`), `http_routes.py` (aiohttp),
  `grpc_services.py` (sync and grpc.aio adapters).

The parameter is a comma-separated list of `key=value` (the `Layout` fields: `sdk_out`,
`sdk_package`, `server_out`, `server_package`, `spec_out`, `spec_package`, `pb2_out`,
`pb2_package`, `model_module`, `runtime_package`, `server_runtime_package`,
`server_errors_module`, `proto_root`) and `outputs=sdk+server` to choose what to emit.
Defaults are this repository's layout. Paths in the response are relative to `--arctic_out`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from arctic_grpc_templates import (
    render_grpc_stubs,
    render_pb2_init,
    render_pb2_root_init,
    render_sdk_init,
    render_tables_init,
)
from arctic_model import build_spec
from arctic_render import Layout, banner, pb2_module
from arctic_rules_templates import render_request_rules
from arctic_sdk_templates import render_client, render_types
from arctic_server_templates import (
    render_grpc_services,
    render_http_routes,
    render_server_init,
    render_servicer,
)
from arctic_table_templates import render_error_classes, render_error_codes, render_methods
from arctic_types import Spec, SpecError
from google.protobuf.compiler import plugin_pb2

__version__ = "0.1.0"

Render = Callable[[Spec, Layout, list[str]], str]

SPEC_MODULES: dict[str, Render] = {  # under `spec_out`: the public tables
    "methods.py": render_methods,
    "error_codes.py": render_error_codes,
    "request_rules.py": render_request_rules,
}
SDK_MODULES: dict[str, Render] = {  # under `sdk_out`
    "__init__.py": render_sdk_init,
    "error_classes.py": render_error_classes,
    "types.py": render_types,
    "client.py": render_client,
    "grpc_stubs.py": render_grpc_stubs,
}
SERVER_MODULES: dict[str, Render] = {
    "__init__.py": render_server_init,
    "servicer.py": render_servicer,
    "http_routes.py": render_http_routes,
    "grpc_services.py": render_grpc_services,
}


def parse_parameter(parameter: str) -> Layout:
    """The `Layout` a plugin parameter selects (unknown keys are an error)."""
    layout = Layout()
    known = {f.name for f in fields(Layout)}
    for item in filter(None, (p.strip() for p in parameter.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise SpecError(f"unknown plugin parameter {item!r} (known: {sorted(known)})")
        if key == "outputs":
            chosen = tuple(v for v in value.split("+") if v)
            if not set(chosen) <= {"sdk", "server"}:
                raise SpecError(f"outputs={value!r}: choose from sdk, server")
            layout = replace(layout, outputs=chosen)
        else:
            layout = replace(layout, **{key: value.strip("/")})
    return layout


def render_all(spec: Spec, layout: Layout) -> dict[str, str]:
    """Output path (relative to `--arctic_out`) -> file content."""
    head = banner(spec, layout, __version__)
    out: dict[str, str] = {}
    if "sdk" in layout.outputs:
        for name, render in SDK_MODULES.items():
            out[f"{layout.sdk_out}/{name}"] = render(spec, layout, head)
        for name, render in SPEC_MODULES.items():
            out[f"{layout.spec_out}/{name}"] = render(spec, layout, head)
        if layout.spec_out != layout.sdk_out:
            out[f"{layout.spec_out}/__init__.py"] = render_tables_init(spec, layout, head)
        if layout.pb2_out not in (layout.sdk_out, layout.spec_out):
            out[f"{layout.pb2_out}/__init__.py"] = render_pb2_root_init(spec, layout, head)
        packages: dict[str, list[str]] = {}
        for f in spec.files:
            pkg, mod = pb2_module(f)
            parts = pkg.split(".") if pkg else []
            for i in range(1, len(parts)):
                packages.setdefault(".".join(parts[:i]), [])
            packages.setdefault(pkg, []).append(mod)
        for pkg, mods in sorted(packages.items()):
            if pkg:
                path = f"{layout.pb2_out}/{pkg.replace('.', '/')}/__init__.py"
                out[path] = render_pb2_init(pkg, sorted(mods), layout, head)
    if "server" in layout.outputs:
        for name, render in SERVER_MODULES.items():
            out[f"{layout.server_out}/{name}"] = render(spec, layout, head)
    return out


def generate(request: plugin_pb2.CodeGeneratorRequest) -> plugin_pb2.CodeGeneratorResponse:
    """The plugin as a function: a request in, a response out (errors go in `response.error`)."""
    response = plugin_pb2.CodeGeneratorResponse()
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    try:
        layout = parse_parameter(request.parameter)
        files = render_all(build_spec(request), layout)
    except SpecError as exc:
        response.error = str(exc)
        return response
    for name in sorted(files):
        response.file.add(name=name, content=files[name])
    return response


def main() -> int:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    sys.stdout.buffer.write(generate(request).SerializeToString())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
