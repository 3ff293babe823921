"""arctic_sdk: the client of the arctic.v1 protocol for remote LLM post-training.

    from arctic_sdk import Client

    with Client("http://127.0.0.1:8080", token="...") as client:
        client.create_job(sub_job_configs=[{"job_type": "training", "model_name": "tiny"}])
        client.wait_until_running()
        client.forward_backward(batch)   # every op of the spec is a method...
        fut = client.submit_step()       # ...with a submit_ twin that returns a future
        print(fut.result()["metrics"])

`AsyncClient` is the same for asyncio (the sync `Client` called inside a running event loop
blocks it, and warns once: `SyncClientInEventLoopWarning`). `transport="http"` (default),
`"grpc"` or `"inproc"` selects the transport; the server's address is its base URL
(`http://host:port`) or the prefix URL it prints (`.../api/v2/databases/{db}/schemas/{schema}/
{endpoint}`), and with `transport="grpc"` its gRPC `host:port` (or `grpc_target=`): an address
that cannot work is refused at once, naming the mistake (`arctic_sdk._urls`); errors are
`ArcticError` subclasses (see `arctic_sdk.errors`);
configuration is `ArcticConfig` (see `arctic_sdk.config`). The wire specification is
`proto/PROTOCOL.md`.
"""

__version__ = "0.1.0"

from . import errors, types
from ._client_base import CallOptions
from ._generated.client import AsyncClient, Client
from ._loop_guard import SyncClientInEventLoopWarning
from .config import (
    ArcticConfig,
    CortexConfig,
    GrpcConfig,
    InprocConfig,
    PollConfig,
    RetryConfig,
)
from .errors import *  # noqa: F403  (every error class: one per stable code)
from .spec.tables.error_codes import ErrorCode
from .types import KlType, LossAggMode, LossFn, SamplingParams

__all__ = [
    "ArcticConfig",
    "AsyncClient",
    "CallOptions",
    "Client",
    "CortexConfig",
    "ErrorCode",
    "GrpcConfig",
    "InprocConfig",
    "KlType",
    "LossAggMode",
    "LossFn",
    "PollConfig",
    "RetryConfig",
    "SamplingParams",
    "SyncClientInEventLoopWarning",
    "__version__",
    "errors",
    "types",
]
__all__ += errors.__all__

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith(__name__):
        _obj.__module__ = __name__
del _name, _obj
