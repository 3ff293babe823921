"""Drive sans-I/O flows with scripted answers: no network, no sleeping, a fake clock."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arctic_sdk._core.calls import call_flow, prepare
from arctic_sdk._core.effects import (
    ConnectionFailure,
    HttpRequest,
    HttpResponse,
    Progress,
    Send,
    Sleep,
)
from arctic_sdk._core.requests import HttpWire
from arctic_sdk._core.state import CoreState
from arctic_sdk.config import ArcticConfig, build_config
from arctic_sdk.spec.tables import methods as M

PREFIX = "http://test/api/v2/databases/db/schemas/sc/cortex-training"
TOKEN = "pat-secret-0123456789"


def caps_doc(**features: Any) -> dict[str, Any]:
    feats = {
        "idempotency": True,
        "sequencing": True,
        "octet_results": False,
        "chunk_checksum": False,
    }
    routes = features.pop("routes", [m.name for m in M.METHODS])
    limits = features.pop("limits", {})
    feats.update(features)
    return {
        "spec_version": "arctic.v1",
        "routes": routes,
        "features": feats,
        "limits": limits,
        "operation_types": ["weight-sync", "reset-prefix-cache", "forward"],
    }


def resp(status: int, body: Any = None, headers: dict[str, str] | None = None) -> HttpResponse:
    h = {"content-type": "application/json", **(headers or {})}
    data = (
        body if isinstance(body, bytes) else json.dumps(body if body is not None else {}).encode()
    )
    return HttpResponse(status, h, data)


def done(result: Any, request_id: str = "r1") -> HttpResponse:
    return resp(
        200,
        {
            "request_id": request_id,
            "status": "completed",
            "result": result,
            "events": [],
            "next_cursor": "",
        },
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Run:
    """What a driven flow did."""

    requests: list[HttpRequest] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    effects: list[Any] = field(default_factory=list)
    progress: list[Progress] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [r.method + " " + r.url.removeprefix(PREFIX) for r in self.requests]


Answer = HttpResponse | ConnectionFailure
Responder = Callable[[HttpRequest], Answer]


def script(*answers: Answer | Responder) -> Responder:
    """Answers in order; a callable answer is called with the request."""
    queue = list(answers)

    def respond(req: HttpRequest) -> Answer:
        if not queue:
            raise AssertionError(f"unexpected request {req.method} {req.url}")
        a = queue.pop(0)
        return a(req) if callable(a) else a

    return respond


def drive(flow: Any, respond: Responder, clock: Clock, run: Run | None = None) -> Any:
    run = run if run is not None else Run()
    value: Any = None
    while True:
        try:
            effect = flow.send(value)
        except StopIteration as stop:
            return stop.value
        value = None
        run.effects.append(effect)
        if isinstance(effect, Send):
            run.requests.append(effect.request)
            value = respond(effect.request)
        elif isinstance(effect, Sleep):
            run.sleeps.append(effect.seconds)
            clock.now += effect.seconds
        elif isinstance(effect, Progress):
            run.progress.append(effect)


def make_state(clock: Clock, **config: Any) -> CoreState:
    job_id = config.pop("job_id", "job-1")
    cfg: ArcticConfig = build_config(
        config.pop("config", None),
        base_url="http://test",
        database="db",
        schema="sc",
        token=TOKEN,
        job_id=job_id,
        **config,
    )
    wire = HttpWire(PREFIX, cfg.token(), lambda s: s.replace(TOKEN, "***"))
    state = CoreState(cfg, wire, clock=clock, rng=lambda: 0.5)
    state.seq.own(job_id)  # as if this client had created the job
    return state


def call(
    state: CoreState,
    method: Any,
    body: dict[str, Any],
    respond: Responder,
    clock: Clock,
    run: Run | None = None,
    options: Any = None,
) -> Any:
    prep = prepare(state, method, body, options)
    return drive(call_flow(state, prep), respond, clock, run)
