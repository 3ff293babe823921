"""Load the arctic.v1 specification from `proto/` with the pinned protoc.

Tools and tests use this to read the method table and the error table straight from the
`.proto` files (the code generator reads the same options through its protoc plugin).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
SPEC_FILES = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))


def compile_python(out_dir: Path, proto_root: Path = PROTO_ROOT) -> None:
    """Compile every .proto under `proto_root` into `out_dir` with grpc_tools' protoc."""
    from grpc_tools import protoc  # pinned with the protobuf runtime in pyproject.toml

    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    files = sorted(p.relative_to(proto_root).as_posix() for p in proto_root.rglob("*.proto"))
    args = ["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={out_dir}", *files]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {proto_root}")


_cache: dict[str, dict[str, ModuleType]] = {}


def load_modules(proto_root: Path = PROTO_ROOT) -> dict[str, ModuleType]:
    """Compile and import the spec's *_pb2 modules; returns them by file stem."""
    key = str(proto_root)
    if key in _cache:
        return _cache[key]
    out = Path(tempfile.mkdtemp(prefix="arctic-spec-"))
    compile_python(out, proto_root)
    sys.path.insert(0, str(out))
    try:
        for name in [m for m in sys.modules if m == "arctic" or m.startswith("arctic.")]:
            del sys.modules[name]
        mods = {
            p.stem: importlib.import_module(
                p.relative_to(out).with_suffix("").as_posix().replace("/", ".")
            )
            for p in sorted(out.rglob("*_pb2.py"))
        }
    finally:
        sys.path.remove(str(out))
    _cache[key] = mods
    return mods


@dataclass(frozen=True)
class Method:
    service: str
    rpc: str
    name: str
    http_method: str
    http_path: str
    body: str
    role: str
    idempotency: str
    fallback: str
    operation_type: str
    aliases: tuple[str, ...]
    request_type: str
    response_type: str


@dataclass(frozen=True)
class ErrorEntry:
    code: str
    number: int
    http_status: int
    grpc_status: str
    user_fault: bool
    retryable: bool
    doc: str


def _enum_suffix(enum_name: str, value_name: str) -> str:
    prefix = "".join("_" + c if c.isupper() else c for c in enum_name).lstrip("_").upper() + "_"
    return value_name.removeprefix(prefix)


def methods(proto_root: Path = PROTO_ROOT) -> list[Method]:
    mods = load_modules(proto_root)
    opts = mods["options_pb2"]
    out: list[Method] = []
    for mod in mods.values():
        for service in mod.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                o = m.GetOptions().Extensions[opts.op]
                out.append(
                    Method(
                        service=service.full_name,
                        rpc=m.name,
                        name=o.name,
                        http_method=o.http_method,
                        http_path=o.http_path,
                        body=_enum_suffix("BodyKind", opts.BodyKind.Name(o.body)),
                        role=_enum_suffix("Role", opts.Role.Name(o.role)),
                        idempotency=_enum_suffix(
                            "IdempotencyClass", opts.IdempotencyClass.Name(o.idempotency)
                        ),
                        fallback=_enum_suffix("Fallback", opts.Fallback.Name(o.fallback)),
                        operation_type=o.operation_type,
                        aliases=tuple(o.aliases),
                        request_type=o.request_type or m.input_type.full_name,
                        response_type=o.response_type or m.output_type.full_name,
                    )
                )
    return out


def errors(proto_root: Path = PROTO_ROOT) -> list[ErrorEntry]:
    mods = load_modules(proto_root)
    opts = mods["options_pb2"]
    enum = mods["errors_pb2"].DESCRIPTOR.enum_types_by_name["ErrorCode"]
    comments = _enum_value_comments(proto_root / "arctic/v1/errors.proto")
    out: list[ErrorEntry] = []
    for v in enum.values:
        if v.number == 0:
            continue
        o = v.GetOptions().Extensions[opts.error]
        out.append(
            ErrorEntry(
                code=_enum_suffix("ErrorCode", v.name).lower(),
                number=v.number,
                http_status=o.http_status,
                grpc_status=o.grpc_status,
                user_fault=o.user_fault,
                retryable=o.retryable,
                doc=comments.get(v.name, ""),
            )
        )
    return out


def _enum_value_comments(path: Path) -> dict[str, str]:
    """Leading `//` comments of each enum value (descriptor pools drop source comments)."""
    out: dict[str, str] = {}
    pending: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("//"):
            pending.append(line[2:].strip())
        elif line.startswith("ERROR_CODE_"):
            out[line.split()[0]] = " ".join(pending)
            pending = []
        else:
            pending = []
    return out
