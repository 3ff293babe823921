"""The legacy names of the compatibility client: the one place they are spelled out.

`tests/codegen/test_no_literals.py` forbids op names, aliases and routes as string literals
anywhere else in the product code; the legacy surface needs a few of them as *data* (method
names of the deployed clients, keys of the deployed response bodies), so they live here, each
tied to the canonical `MethodInfo` of the generated method table.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from ..spec.model import MethodInfo
from ..spec.tables import methods as M

#: Legacy client method -> the canonical op it runs (`proto` method table aliases).
LEGACY_METHODS: Final = MappingProxyType(
    {
        "fwd_bwd": M.FORWARD_BACKWARD,
        "fwd_no_grad": M.FORWARD,
        "step": M.STEP,
        "generate": M.GENERATE,
        "log_probs": M.LOG_PROBS,
        "sync_weights": M.SYNC_WEIGHTS,
        "reset_prefix_cache": M.RESET_PREFIX_CACHE,
        "save_checkpoint": M.SAVE_CHECKPOINT,
        "save_weights": M.SAVE_CHECKPOINT,
        "load_checkpoint": M.LOAD_CHECKPOINT,
        "sleep_inference": M.SLEEP_INFERENCE,
        "wake_inference": M.WAKE_INFERENCE,
        "sleep_log_prob": M.SLEEP_INFERENCE,
        "wake_log_prob": M.WAKE_INFERENCE,
        "sleep_training": M.SLEEP_TRAINING,
        "wake_training": M.WAKE_TRAINING,
        "empty_training_cache": M.SLEEP_TRAINING,
    }
)

#: Every method the legacy async clients expose (`arctic_platform.rl.create_arctic_rl_client`):
#: the ops above plus the ones with no canonical op.
LEGACY_ASYNC_METHODS: Final = (*LEGACY_METHODS, "weight_norm", "shutdown")

#: Keys of the deployed forward responses: `batch.logprobs`, mirrored as `batch.log_probs`
#: (verl renames one to the other; both are present).
LOGPROBS_KEY: Final = "logprobs"
LOG_PROBS_KEY: Final = "log_probs"


def legacy_method(name: str) -> MethodInfo:
    """The canonical op behind a legacy client method name."""
    try:
        return LEGACY_METHODS[name]
    except KeyError:
        raise KeyError(f"no legacy method {name!r}; known: {sorted(LEGACY_METHODS)}") from None


__all__ = [
    "LEGACY_ASYNC_METHODS",
    "LEGACY_METHODS",
    "LOGPROBS_KEY",
    "LOG_PROBS_KEY",
    "legacy_method",
]
