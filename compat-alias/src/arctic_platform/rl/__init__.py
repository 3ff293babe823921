"""`arctic_platform.rl` as SkyRL's and verl's Arctic integrations import it: arctic_sdk.compat."""

from arctic_sdk.compat import ArcticRLClientConfig, create_arctic_rl_client

__all__ = ["ArcticRLClientConfig", "create_arctic_rl_client"]
