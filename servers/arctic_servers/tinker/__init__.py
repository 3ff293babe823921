"""A Tinker-compatible service (the `tinker` SDK 0.38 and tinker-cookbook) over our protocol.

    from arctic_servers.tinker import add_tinker_routes, Backend, TinkerSettings

Mounted by the on-prem server and the gateway beside the protocol, as `arctic_servers.openai`
is: `ServiceClient(base_url="http://HOST:PORT")` then trains and samples on the server's jobs.
Modules: `wire` (the SDK's protobuf bodies), `losses` (Tinker's losses on ours), `ops` (each
Tinker op on our ops), `state` (sessions, models, futures), `backend` (our ops on the server's
protocol core, in process), `base` (auth, bodies, errors of every route), `routes` (service,
sessions, sampling, futures), `train_routes` (training), `rest` (REST listings), `cli` (the
`--tinker-*` flags).
"""

from __future__ import annotations

from typing import Any

from .mount import mount

__all__ = [
    "Backend",
    "TinkerError",
    "TinkerRoutes",
    "TinkerSettings",
    "add_tinker_routes",
    "mount",
    "start_tinker_server",
]

_LAZY = {
    "Backend": "backend",
    "TinkerError": "errors",
    "TinkerSettings": "settings",
    "TinkerRoutes": "routes",
    "add_tinker_routes": "routes",
    "start_tinker_server": "serve",
}


def __getattr__(name: str) -> Any:
    """The surface's pieces, imported on first use: they need the `tinker` package (the
    `[tinker]` extra), which a server without it must not import at start (`mount`)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
