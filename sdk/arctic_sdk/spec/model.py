"""The spec model's hand-written types: what the generated tables instantiate from the spec.

The generated modules (`arctic_sdk.spec.tables.methods`, `.error_codes`) hold one `MethodInfo` per
RPC and one `ErrorInfo` per error code, read from the `(arctic.v1.op)` and `(arctic.v1.error)`
options of `proto/arctic/v1/*.proto`. Everything per-op in the SDK and the servers is driven by
these records, never by op-name literals. `STANDARD_CONFIG_KEYS` are the sub-job config keys of
jobs.proto that every server knows.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass


class BodyKind(enum.Enum):
    """How a request body travels over HTTP."""

    NONE = "none"
    JSON = "json"
    DSSST1 = "dssst1"


class Role(enum.Enum):
    """The sub-job role that executes an op by default."""

    GATEWAY = "gateway"
    TRAINING = "training"
    SAMPLING = "sampling"
    LOG_PROB = "log_prob"


class Idempotency(enum.Enum):
    """What makes a retry of an op safe (PROTOCOL.md §7)."""

    SAFE = "safe"
    KEYED = "keyed"
    CHUNK_GROUP = "chunk_group"


class Fallback(enum.Enum):
    """What the SDK does against a server that lacks the op's route (PROTOCOL.md §11)."""

    NONE = "none"
    OPERATION = "operation"
    NOOP = "noop"
    WEIGHT_SYNC_SEQUENCE = "weight_sync_sequence"


class GrpcShape(enum.Enum):
    """The gRPC method shape."""

    FRAMES = "frames"  # stream Frame -> stream Frame (data plane)
    UNARY_TO_FRAMES = "unary_to_frames"  # Message -> stream Frame (GetRequest)
    UNARY = "unary"  # Message -> Message (control plane)


@dataclass(frozen=True)
class MethodInfo:
    """One row of the method table."""

    rpc: str  # "ForwardBackward"
    name: str  # canonical op name, "forward-backward"
    python_name: str  # "forward_backward"
    service: str  # "arctic.v1.TrainingService"
    http_method: str
    http_path: str  # relative to the prefix, "/{job_id}/forward-backward"
    body: BodyKind
    role: Role
    idempotency: Idempotency
    fallback: Fallback
    operation_type: str
    aliases: tuple[str, ...]
    request_type: str  # full proto name of the logical body
    response_type: str  # full proto name of the logical result ("" for raw downloads)
    inline_preferred: bool
    protocol: bool  # answered by the protocol layer, not the servicer
    concurrent: bool  # reads the weights, changes nothing: consecutive sequenced calls run at once
    engine: bool  # forwarded as is to the target sub-job's engine command `python_name`
    grpc_shape: GrpcShape
    job_scoped: bool  # the route starts with /{job_id}
    path_params: tuple[str, ...]
    doc: str

    @property
    def grpc_path(self) -> str:
        return f"/{self.service}/{self.rpc}"

    @property
    def mutating(self) -> bool:
        return self.idempotency is not Idempotency.SAFE


@dataclass(frozen=True)
class ErrorInfo:
    """One row of the error table."""

    code: str
    http_status: int
    grpc_status: str
    user_fault: bool
    retryable: bool
    doc: str


def _num(x: float) -> str:
    return str(int(x)) if x.is_integer() else repr(x)


@dataclass(frozen=True)
class Bound:
    """One row of the request-rule table: a number field's `(arctic.v1.field)` bounds, at a
    dotted path from the request body's root (`arctic_sdk.spec.tables.request_rules`)."""

    path: str  # "sampling_params.top_p"
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    expected: str = ""  # the refusal's `expected`; "" = `bounds`

    @property
    def bounds(self) -> str:
        """The bounds as text: ">= 1", "<= 2", "in (0, 1]"."""
        lo = self.gt if self.gt is not None else self.ge
        hi = self.lt if self.lt is not None else self.le
        if lo is not None and hi is not None:
            left, right = "(" if self.gt is not None else "[", ")" if self.lt is not None else "]"
            return f"in {left}{_num(lo)}, {_num(hi)}{right}"
        if lo is not None:
            return f"{'>' if self.gt is not None else '>='} {_num(lo)}"
        if hi is not None:
            return f"{'<' if self.lt is not None else '<='} {_num(hi)}"
        return "any number"

    def holds(self, x: float) -> bool:
        """Whether the finite number `x` respects the bounds."""
        return math.isfinite(x) and not (
            (self.ge is not None and x < self.ge)
            or (self.gt is not None and x <= self.gt)
            or (self.le is not None and x > self.le)
            or (self.lt is not None and x >= self.lt)
        )


#: `SubJobConfig` keys every server knows (jobs.proto), per role; servers advertise their own set
#: (`config_keys`), a server without it accepts these.
STANDARD_CONFIG_KEYS: Mapping[str, frozenset[str]] = {
    "training": frozenset(
        {
            "max_seq_len",
            "n_gpus",
            "train_batch_size",
            "gradient_clipping",
            "optimizer",
            "zero_stage",
            "micro_batch_size",
            "deepspeed",
        }
    ),
    "sampling": frozenset({"max_seq_len", "n_gpus", "vllm_config"}),
    "log_prob": frozenset({"max_seq_len", "n_gpus", "vllm_config"}),
}
