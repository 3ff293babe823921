"""The `operation_type`s of the deployed `/operation` envelope (training.proto `OperationRequest`).

Each is the method table's `operation_type` of the op it stands for, plus `tail-logs`, which has
no op of its own; every server accepts these and answers them in `capabilities`.
"""

from __future__ import annotations

from arctic_sdk._generated import methods as M

OP_WEIGHT_SYNC = M.SYNC_WEIGHTS.operation_type
OP_RESET = M.RESET_PREFIX_CACHE.operation_type
OP_CANCEL = M.CANCEL_REQUEST.operation_type
OP_FORWARD = M.FORWARD.operation_type
OP_TAIL_LOGS = "tail-logs"
OPERATION_TYPES = (OP_WEIGHT_SYNC, OP_RESET, OP_CANCEL, OP_TAIL_LOGS, OP_FORWARD)
