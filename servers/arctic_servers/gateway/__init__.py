"""The Cortex gateway: the arctic.v1 protocol with an async, durable request queue, PAT auth,
job lifecycle, capacity, leases, and sub-jobs as worker processes that outlive a restart.

Start it with `python -m arctic_servers.gateway --db PATH --tokens-file FILE` (servers/GATEWAY.md);
in-process with `start_gateway(GatewaySettings(db=...))`. The names below are loaded
on first use, so that a worker process (`worker_host`) imports nothing of the server.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_PATH", "GatewaySettings", "RunningGateway", "load_tokens", "start_gateway"]


def __getattr__(name: str) -> Any:
    if name in ("DEFAULT_PATH", "RunningGateway", "start_gateway"):
        from . import server

        return getattr(server, name)
    if name in ("GatewaySettings", "load_tokens"):
        from . import settings

        return getattr(settings, name)
    raise AttributeError(name)
