"""`GatewayServicer`: the Cortex gateway's business logic on the protocol layer.

The protocol layer (`arctic_servers.protocol`, SQLite stores) does routing, auth, chunk groups,
idempotency, sequencing, the async request queue with polls, cancellation and capabilities;
this class adds jobs (`jobs.py`), the semantic checks run before a call is accepted, and the ops,
each run on a sub-job's worker (`dataplane.py`, `checkpoints.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from arctic_sdk.spec.model import GrpcShape
from arctic_sdk.spec.tables import methods as M

from ..engines import op_checks
from ..engines.fake import operations as fake_operations
from ..engines.op_checks import CallFacts, vocab_of
from ..protocol.context import CallContext
from ..rules.errors import ProtocolError
from ..rules.operation_types import OP_TAIL_LOGS, OPERATION_TYPES, forward_body
from ..serving.lora_pools import lora_support_json
from . import lora
from .base import GatewayBase
from .checkpoints import Checkpoints
from .dataplane import DataPlane
from .model import Job
from .profiles import DEFAULT_VOCAB_SIZE


class GatewayServicer(DataPlane, Checkpoints, GatewayBase):
    operation_types = OPERATION_TYPES

    @property
    def config_keys(self) -> dict[str, list[str]] | None:
        """The capabilities' `config_keys`: the engine profile's (standard keys by default)."""
        keys = getattr(self.profile, "config_keys", None)
        return dict(keys) if keys else None

    @property
    def lora_support(self) -> dict[str, Any]:
        """The capabilities' `lora` (PROTOCOL.md §3.6): the engine profile's."""
        return lora_support_json(self.profile.lora.json(), self.jobs.pools.book)

    # ------------------------------------------------------------------ protocol hooks

    async def authorize_job(self, ctx: CallContext, *, running: bool) -> None:
        job = self.job(ctx)  # 404 for another token's job
        if running and ctx.method.grpc_shape is GrpcShape.FRAMES and ctx.method is not M.OPERATION:
            self.require_running(job, ctx.method)  # /operation: checked by operation type

    def check_request(self, ctx: CallContext, body: dict[str, Any]) -> None:
        """Semantic checks before a data-plane call is accepted (4xx on failure): the servers'
        one per-op check table (`engines/op_checks.py`) over what this gateway and its engine
        profile know of the call."""
        job = self.job(ctx)
        if ctx.method is M.OPERATION and body.get("operation_type") != OP_TAIL_LOGS:
            self.require_running(job, ctx.method)
        op_checks.check(ctx.method, self._facts(ctx, job), body)

    def _facts(self, ctx: CallContext, job: Job) -> CallFacts:
        def check_sync(body: Mapping[str, Any], path: str) -> None:
            fake_operations.check_sync(job, body, path)
            lora.check_sync(job, body, path)
            self.sync_method(job, body, path)

        train = job.sub_job("training")
        base = CallFacts(
            job=job,
            vocab=vocab_of((train.vocab_size if train else 0) or DEFAULT_VOCAB_SIZE),
            adapter_job=lora.adapter_job(job),
            visible=functools.partial(self.jobs.visible, owner=self.owner(ctx)),
            check_sync=check_sync,
            operation_types=self.operation_types,
            operation_forward=lambda _, payload: (forward_body(payload), base),
        )
        if ctx.method is M.OPERATION:
            return base
        return self.profile.facts(base, self.target(job, ctx))

    # ------------------------------------------------------------------ control plane

    async def create_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        owner, key = self.owner(ctx), str(ctx.idempotency_key or "")
        old = self.jobs.find_created(owner, key)
        if old is not None:  # a retried create (even across a restart) is the same job
            return {"job_id": old.job_id}
        # LoRA jobs: the profile's checks are the shared rules (rules/lora_config.py)
        subs = self.profile.sub_jobs(body)
        labels = body.get("labels") or {}
        if any(not k for k in labels):
            raise ProtocolError(
                "invalid_argument",
                "field labels: a label key is empty",
                field="labels",
                expected="non-empty keys",
            )
        self.jobs.check_lease(int(body.get("lease_seconds") or 0), "lease_seconds")
        job = self.jobs.create(owner, body, subs, key)
        return {"job_id": job.job_id}

    # ------------------------------------------------------------------ housekeeping

    def job_ended(self, job: Job) -> None:
        """A job ended: its open chunk groups can never complete; its weight group goes with
        its workers."""
        if self.core is not None:
            self.core.groups.forget_job(job.job_id)
        self._gates.pop(job.job_id, None)
        self._weight_groups.pop(job.job_id, None)

    def worker_views(self, job: Job) -> list[dict[str, Any]]:
        """The admin view of a job's workers (no authkeys)."""
        return [
            {
                "sub_job_id": s.sub_job_id,
                "state": s.state,
                "backend": s.worker.get("backend"),
                "pid": s.worker.get("pid"),
                "address": s.worker.get("address"),
                "node_id": s.worker.get("node_id"),  # the Ray node (Ray placement only)
                "log": s.worker.get("log"),
                "info": s.worker.get("info"),
            }
            for s in job.sub_jobs
        ]
