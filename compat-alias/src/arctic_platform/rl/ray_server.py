"""`arctic_platform.rl.ray_server`: the server-state handle a re-attaching client takes."""

from arctic_sdk.compat import ArcticServerState as ArcticRLRayServerState

__all__ = ["ArcticRLRayServerState"]
