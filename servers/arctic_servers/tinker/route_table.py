"""Every `/api/v1/...` route of the Tinker surface: (HTTP method, path, the handler it calls).

One table, read by `TinkerRoutes.add_routes` (a standalone Tinker server, `serve.py`) and by
`mount` (a protocol server), which registers these paths at start without importing the
`tinker` package and builds the `TinkerRoutes` on the first Tinker request. Free of `tinker`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from .routes import TinkerRoutes

__all__ = ["ROUTES", "Handler", "P"]

P = "/api/v1"
Handler = Callable[[web.Request, "str | None"], Awaitable[Any]]

ROUTES: tuple[tuple[str, str, Callable[[TinkerRoutes], Handler]], ...] = (
    ("POST", "/client/config", lambda r: r.client_config),
    ("POST", "/client/dynamic_config", lambda r: r.dynamic_config),
    ("GET", "/healthz", lambda r: r.healthz),
    ("GET", "/get_server_capabilities", lambda r: r.capabilities),
    ("POST", "/create_session", lambda r: r.create_session),
    ("POST", "/session_heartbeat", lambda r: r.heartbeat),
    ("POST", "/sessions/{session_id}/finish", lambda r: r.finish),
    ("POST", "/telemetry", lambda r: r.telemetry),
    ("POST", "/create_model", lambda r: r.create_model),
    ("POST", "/get_info", lambda r: r.get_info),
    ("POST", "/forward_backward", lambda r: r.forward_backward),
    ("POST", "/forward", lambda r: r.forward_backward),
    ("POST", "/optim_step", lambda r: r.optim_step),
    ("POST", "/save_weights", lambda r: r.save_weights),
    ("POST", "/save_weights_for_sampler", lambda r: r.save_for_sampler),
    ("POST", "/load_weights", lambda r: r.load_weights),
    ("POST", "/create_sampling_session", lambda r: r.create_sampling_session),
    ("GET", "/samplers/{sampler_id}", lambda r: r.get_sampler),
    ("POST", "/asample", lambda r: r.asample),
    ("GET", "/sequences/{sequence_id}", lambda r: r.sequence),  # ours: a sample's version
    ("POST", "/retrieve_future", lambda r: r.retrieve_future),
    ("POST", "/cancel_future", lambda r: r.cancel_future),
    ("GET", "/training_runs", lambda r: r.training_runs),
    ("GET", "/training_runs/{run_id}", lambda r: r.training_run),
    ("GET", "/training_runs/{run_id}/checkpoints", lambda r: r.run_checkpoints),
    ("POST", "/weights_info", lambda r: r.weights_info),
    ("*", "/{tail:.*}", lambda r: r.not_served),  # last: any other path answers 404 by name
)
