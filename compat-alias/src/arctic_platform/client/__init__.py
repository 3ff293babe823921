"""`arctic_platform.client` as the Arctic-Platform verl plugin imports it: arctic_sdk.compat."""

from arctic_sdk.compat import ArcticRLClient
from arctic_sdk.compat.unified import (
    CortexConfig,
    OnPremConfig,
    SamplingConfig,
    SyncArcticRLClient,
    TrainingConfig,
)
from arctic_sdk.compat.unified import UnifiedClientConfig as ArcticRLClientConfig
from arctic_sdk.compat.unified import create_unified_client as create_arctic_rl_client

__all__ = [
    "ArcticRLClient",
    "ArcticRLClientConfig",
    "CortexConfig",
    "OnPremConfig",
    "SamplingConfig",
    "SyncArcticRLClient",
    "TrainingConfig",
    "create_arctic_rl_client",
]
