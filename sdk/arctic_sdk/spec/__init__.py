"""The spec model, public: what the SDK, the servers and the conformance runner all read.

Everything per-op is driven by these records, generated from `proto/` (the authority) or written
once by hand beside them; nothing here does I/O.

- `arctic_sdk.spec.tables.methods`: the method table, one `MethodInfo` per RPC (`METHODS`,
  `BY_NAME`, `BY_ALIAS`, `BY_RPC`, `BY_GRPC_PATH`), generated.
- `arctic_sdk.spec.tables.error_codes`: the error table, `ErrorCode` and `ERRORS` (code → HTTP
  status, gRPC status, fault side, retryability), generated.
- `arctic_sdk.spec.model`: the table types (`MethodInfo`, `ErrorInfo`, `BodyKind`, `Role`,
  `Idempotency`, `Fallback`, `GrpcShape`) and `STANDARD_CONFIG_KEYS`.
- `arctic_sdk.spec.body_check`: the one checker of a body against the field rules that the
  `(arctic.v1.field)` options declare (`check_body`), used by the client before it sends and by
  every server before it runs an op.
- `arctic_sdk.spec.value_rules`: the string and range rules of those options.
- `arctic_sdk.spec.proto_json`: the proto3 JSON mapping the gRPC transport and servers share.
- `arctic_sdk.spec.pb`: the protobuf message modules (`arctic_sdk.spec.pb.arctic.v1.*_pb2`),
  generated.

Regenerate the generated parts with `python tools/codegen/generate.py`.
"""

from arctic_sdk.spec.model import (
    STANDARD_CONFIG_KEYS,
    BodyKind,
    ErrorInfo,
    Fallback,
    GrpcShape,
    Idempotency,
    MethodInfo,
    Role,
)

__all__ = [
    "STANDARD_CONFIG_KEYS",
    "BodyKind",
    "ErrorInfo",
    "Fallback",
    "GrpcShape",
    "Idempotency",
    "MethodInfo",
    "Role",
]
