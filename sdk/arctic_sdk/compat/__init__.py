"""The legacy compatibility surface of the SkyRL and verl Arctic integrations.

    from arctic_sdk.compat import ArcticRLClientConfig, create_arctic_rl_client

    client = create_arctic_rl_client(ArcticRLClientConfig(backend="local", model_name="tiny"))
    out = await client.fwd_bwd({"batch": ..., "meta": ..., "processing": ...})
    handle = client.reconnect_config()          # pickles; another process re-attaches:
    again = create_arctic_rl_client(handle, client.get_server_state())

The `{batch, meta, processing}` body is lowered to the canonical frame once, here
(`arctic_sdk.compat.lowering`, in the deployed alignment contract); responses carry the legacy
mirrors (`avg_loss`, `batch.logprobs` / `batch.log_probs`, per-rank `metrics["grad_norm"]`,
`mfu`). The config's DeepSpeed-shaped fields become the CreateJob body in `job_config.py`; the
current Arctic-Platform client's nested config is `arctic_sdk.compat.unified`; the opt-in
`arctic_platform` import alias is the `compat-alias/` distribution (docs/FRAMEWORKS.md).
"""

from .client import ArcticRLClient, ArcticServerState, create_arctic_rl_client
from .config import ArcticRLClientConfig, LegacyConfigWarning
from .job_config import UnsupportedConfigError
from .launch import LaunchedServer, launch_onprem
from .lowering import Lowered, UnsupportedKnobsError, lower

__all__ = [
    "ArcticRLClient",
    "ArcticRLClientConfig",
    "ArcticServerState",
    "LaunchedServer",
    "LegacyConfigWarning",
    "Lowered",
    "UnsupportedConfigError",
    "UnsupportedKnobsError",
    "create_arctic_rl_client",
    "launch_onprem",
    "lower",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = __name__
del _name, _obj
