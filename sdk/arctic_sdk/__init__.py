"""arctic_sdk: the client of the arctic.v1 protocol for remote LLM post-training.

    from arctic_sdk import Client

    with Client("http://127.0.0.1:8080", token="...") as client:
        client.create_job(sub_job_configs=[{"job_type": "training", "model_name": "tiny"}])
        client.wait_until_running()
        client.forward_backward(batch)   # every op of the spec is a method...
        fut = client.submit_step()       # ...with a submit_ twin that returns a future
        print(fut.result()["metrics"])

`AsyncClient` is the same for asyncio. `transport="http"` (default), `"grpc"` or `"inproc"`
selects the transport; errors are `ArcticError` subclasses (see `arctic_sdk.errors`);
configuration is `ArcticConfig` (see `arctic_sdk.config`). The wire specification is
`proto/PROTOCOL.md`.
"""

__version__ = "0.1.0"

from ._client_base import CallOptions
from ._generated.client import AsyncClient, Client
from ._generated.error_codes import ErrorCode
from .config import (
    ArcticConfig,
    CortexConfig,
    GrpcConfig,
    InprocConfig,
    PollConfig,
    RetryConfig,
)
from .errors import (
    ArcticConnectionError,
    ArcticError,
    ArcticTimeoutError,
    AuthenticationError,
    BadRequestError,
    ChunkGroupConflictError,
    ChunkGroupError,
    ChunkGroupMissingChunksError,
    ChunkGroupRestartRequiredError,
    ConflictError,
    InternalServerError,
    InvalidArgumentError,
    NotFoundError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    RateLimitError,
    RequestCancelledError,
    RequestFailedError,
    ServerError,
    ServerTimeoutError,
    ServiceUnavailableError,
    TransientError,
    UnimplementedError,
    UserError,
)

__all__ = [
    "ArcticConfig",
    "ArcticConnectionError",
    "ArcticError",
    "ArcticTimeoutError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "CallOptions",
    "ChunkGroupConflictError",
    "ChunkGroupError",
    "ChunkGroupMissingChunksError",
    "ChunkGroupRestartRequiredError",
    "Client",
    "ConflictError",
    "CortexConfig",
    "ErrorCode",
    "GrpcConfig",
    "InprocConfig",
    "InternalServerError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "PollConfig",
    "RateLimitError",
    "RequestCancelledError",
    "RequestFailedError",
    "RetryConfig",
    "ServerError",
    "ServerTimeoutError",
    "ServiceUnavailableError",
    "TransientError",
    "UnimplementedError",
    "UserError",
    "__version__",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
