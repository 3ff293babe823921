"""The fake gateway's admin API under `/_admin/` (off unless the server starts with admin on).

    POST   /_admin/faults                {route, kind, count, status?, body?, delay_s?, gap_s?,
                                          retry_after_s?, transport?}  -> the armed fault
    GET    /_admin/faults                -> {faults: [... fired, remaining], fired: {kind: n}, log}
    DELETE /_admin/faults                -> disarm all, zero the counters
    DELETE /_admin/faults/{id}           -> disarm one
    GET    /_admin/jobs                  -> {jobs: [{job_id, state, owner_set}]} (every token's)
    GET    /_admin/jobs/{job}/state      -> applied_steps, global_step, weight_version, lr,
                                            model_steps, accumulated, history, execution_log
    POST   /_admin/jobs/{job}/end        {state: failed|terminated|cancelled, reason}
    POST   /_admin/jobs/{job}/expire-lease
    GET    /_admin/behaviour             -> the behaviour switchboard
    POST   /_admin/behaviour             {key: value, ...} merged in (null deletes a key)
    POST   /_admin/reset                 -> forget every job, request, chunk group and fault

When the server has tokens, the admin API needs one of them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from arctic_servers.protocol.chunk_groups import ChunkGroups
from arctic_servers.protocol.core import ProtocolCore
from arctic_servers.protocol.stores import MemoryChunkStore, MemoryRequestStore
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.serving.http_app import json_response

from .faults import FaultRegistry
from .servicer import FakeServicer

ADMIN_PREFIX = "/_admin"
Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Admin:
    def __init__(self, servicer: FakeServicer, faults: FaultRegistry, core: ProtocolCore) -> None:
        self.servicer = servicer
        self.faults = faults
        self.core = core

    def add_routes(self, app: web.Application) -> None:
        p = ADMIN_PREFIX
        r = app.router
        r.add_post(f"{p}/faults", self._wrap(self.add_fault))
        r.add_get(f"{p}/faults", self._wrap(self.list_faults))
        r.add_delete(f"{p}/faults", self._wrap(self.clear_faults))
        r.add_delete(f"{p}/faults/{{fault_id}}", self._wrap(self.remove_fault))
        r.add_get(f"{p}/jobs", self._wrap(self.list_jobs))
        r.add_get(f"{p}/jobs/{{job_id}}/state", self._wrap(self.job_state))
        r.add_post(f"{p}/jobs/{{job_id}}/end", self._wrap(self.end_job))
        r.add_post(f"{p}/jobs/{{job_id}}/expire-lease", self._wrap(self.expire_lease))
        r.add_get(f"{p}/behaviour", self._wrap(self.get_behaviour))
        r.add_post(f"{p}/behaviour", self._wrap(self.set_behaviour))
        r.add_post(f"{p}/reset", self._wrap(self.reset))

    def _wrap(self, fn: Callable[[web.Request], Awaitable[Any]]) -> Route:
        async def route(request: web.Request) -> web.StreamResponse:
            tokens = self.core.config.tokens
            if tokens:
                auth = request.headers.get("Authorization", "")
                if auth[7:].strip() not in tokens or auth[:7].lower() != "bearer ":
                    raise ProtocolError("unauthenticated", "the admin API needs a bearer token")
            return json_response(await fn(request))

        return route

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            value = await request.json()
        except ValueError as exc:
            raise ProtocolError("invalid_json", f"the body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ProtocolError("invalid_json", "the body must be a JSON object")
        return value

    def _job(self, request: web.Request) -> Any:
        job_id = request.match_info["job_id"]
        job = self.servicer.jobs.jobs.get(job_id)
        if job is None:
            raise ProtocolError("job_not_found", f"no job {job_id!r}", job_id=job_id)
        return job

    # ------------------------------------------------------------------ faults

    async def add_fault(self, request: web.Request) -> Any:
        return self.faults.add(await self._json(request)).to_json()

    async def list_faults(self, request: web.Request) -> Any:
        return self.faults.to_json()

    async def clear_faults(self, request: web.Request) -> Any:
        self.faults.clear()
        return {"cleared": True}

    async def remove_fault(self, request: web.Request) -> Any:
        raw = request.match_info["fault_id"]
        if not raw.isdigit() or not self.faults.remove(int(raw)):
            raise ProtocolError("not_found", f"no fault {raw!r}", fault_id=raw)
        return {"removed": True}

    # ------------------------------------------------------------------ jobs and behaviour

    async def list_jobs(self, request: web.Request) -> Any:
        jobs = self.servicer.jobs.jobs.values()
        return {"jobs": [{"job_id": j.job_id, "state": j.state, "reason": j.reason} for j in jobs]}

    async def job_state(self, request: web.Request) -> Any:
        return self.servicer.job_state(request.match_info["job_id"])

    async def end_job(self, request: web.Request) -> Any:
        job = self._job(request)
        body = await self._json(request)
        state = body.get("state", "failed")
        if state not in ("failed", "terminated", "cancelled"):
            raise ProtocolError(
                "invalid_argument", f"field state: {state!r} is not terminal", field="state"
            )
        self.servicer.jobs.end(job, state, str(body.get("reason") or f"{state} by the admin API"))
        return job.to_json()

    async def expire_lease(self, request: web.Request) -> Any:
        job = self._job(request)
        self.servicer.jobs.expire_lease(job)
        return job.to_json()

    async def get_behaviour(self, request: web.Request) -> Any:
        return dict(self.servicer.behaviour)

    async def set_behaviour(self, request: web.Request) -> Any:
        for key, value in (await self._json(request)).items():
            if value is None:
                self.servicer.behaviour.pop(key, None)
            else:
                self.servicer.behaviour[key] = value
        return dict(self.servicer.behaviour)

    async def reset(self, request: web.Request) -> Any:
        reset_state(self.servicer, self.faults, self.core)
        return {"reset": True}


def reset_state(servicer: FakeServicer, faults: FaultRegistry, core: ProtocolCore) -> None:
    """Forget everything: jobs (ids are never reused), requests, chunk groups, faults, behaviour."""
    servicer.jobs.reset()
    servicer.behaviour.clear()
    faults.clear()
    core.state.requests = MemoryRequestStore()
    core.state.groups = ChunkGroups(MemoryChunkStore(), core.codec_limits)
