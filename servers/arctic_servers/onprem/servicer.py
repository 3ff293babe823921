"""`OnpremServicer`: every op of arctic.v1 over local DeepSpeed and vLLM worker processes.

The protocol layer does routing, auth, chunk groups, idempotency, sequencing, polling and the
generic body checks; `check_request` adds the semantic ones (a 4xx before anything runs); each op
then runs on the worker of its target sub-job (`X-Arctic-Sub-Job`, else the op's role). A worker
that dies fails its calls with `sub_job_failed` and the job with a reason (jobs.py).

This module holds those checks and the control plane; the ops live in `dataplane.py` (training,
sampling, weight sync, lifecycle), `operations.py` (`/operation`) and `checkpoints.py`, over
`base.py` (jobs, targeting, worker calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..engines import checks, op_checks
from ..engines.config import (
    DEFAULT_MODEL_NAMES,
    LORA,
    config_keys,
    embedded_model_names,
    engine_kind,
    sub_job_specs,
)
from ..engines.op_checks import CallFacts
from ..protocol.context import CallContext
from ..rules import jobs as pj
from ..rules.operation_types import operation_sub
from ..serving.lora_pools import lora_support_json
from .checkpoints import Checkpoints
from .jobs import Job, SubJob
from .operations import Operations, operation_forward_body


class OnpremServicer(Operations, Checkpoints):
    #: the capabilities' `config_keys`: the standard keys and the on-prem extensions
    config_keys = pj.config_keys_json(config_keys())

    @property
    def lora_support(self) -> dict[str, Any]:
        """The capabilities' `lora` (PROTOCOL.md §3.6), with this server's LoRA pools."""
        return lora_support_json(LORA.json(), self.jobs.pools.book)

    def check_request(self, ctx: CallContext, body: dict[str, Any]) -> None:
        """Semantic checks before a data-plane call is accepted (4xx on failure): the servers'
        one per-op check table (`engines/op_checks.py`) over what this server knows of the
        call."""
        job = self._job(ctx)
        base = CallFacts(
            job=job,
            adapter_job=job.syncs_adapter,
            visible=lambda s: self.jobs.visible(s, self._owner(ctx)),
            check_sync=lambda b, path: self._check_sync(job, b, path),
            operation_types=self.operation_types,
            operation_forward=lambda env, payload: self._operation_forward(job, env, payload),
        )
        facts = base if ctx.method is M.OPERATION else self._facts(base, self.target(job, ctx))
        op_checks.check(ctx.method, facts, body)

    def _facts(self, base: CallFacts, sub: SubJob) -> CallFacts:
        """What the checks know of a target sub-job: its vocabulary, its engine, and a
        sampler's context once its worker reported it."""
        engine = engine_kind(sub.role, sub.spec.config)
        info = sub.worker.info if sub.worker is not None else {}
        return replace(
            base,
            vocab=lambda: self._vocab_of(sub),
            engine=engine,
            scores_with_vllm=engine == "vllm",
            max_context=int(info.get("max_model_len") or 0),
        )

    def _operation_forward(
        self, job: Job, envelope: Mapping[str, Any], payload: Mapping[str, Any]
    ) -> tuple[dict[str, Any], CallFacts]:
        """An /operation forward's body and the facts of the sub-job it runs on (its target,
        else the trainer)."""
        sub = operation_sub(job, envelope, "training")
        return operation_forward_body(payload), self._facts(CallFacts(job=job), sub)

    # ------------------------------------------------------------------ control plane

    async def create_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        specs = sub_job_specs(body, cuda=self.cuda)
        labels = dict(body.get("labels") or {})
        if any(not k for k in labels):
            raise checks.bad("labels", "a label key is empty", expected="non-empty keys")
        lease = int(body.get("lease_seconds") or 0)
        self.jobs.check_lease(lease, "lease_seconds")
        for i, spec in enumerate(specs):  # fail fast on a model directory that does not exist
            name = spec.model_name.strip()
            known = name in DEFAULT_MODEL_NAMES or name in embedded_model_names()
            if not known and not (Path(name).expanduser() / "config.json").is_file():
                raise checks.bad(
                    f"sub_job_configs[{i}].model_name",
                    f"{name!r} is not a local Hugging Face directory (no config.json) and not "
                    f"a model this server knows ('' = the embedded tiny model; "
                    f"{', '.join(embedded_model_names())})",
                    expected="a local HF directory, empty, or an embedded model name",
                )
        job = self.jobs.create(
            self._owner(ctx),
            specs,
            labels=labels,
            comment=str(body.get("comment") or ""),
            experiment_name=str(body.get("experiment_name") or ""),
            lease_seconds=lease or self.settings.lease_default_seconds,
        )
        return {"job_id": job.job_id}

    # ------------------------------------------------------------------ admin

    def worker_views(self, job: Job) -> list[dict[str, Any]]:
        """The admin view of a job's workers: pids, engine info and recent output."""
        return [
            {
                "sub_job_id": s.sub_job_id,
                "role": s.role,
                "state": s.state,
                "reason": s.reason,
                "model_dir": str(s.model_dir or ""),
                "pid": s.worker.pid if s.worker else None,
                "alive": bool(s.worker and s.worker.alive),
                "threads": s.worker.threads if s.worker else None,
                "info": dict(s.worker.info) if s.worker else {},
                "weight_version": s.weight_version,
                "resumed": s.resumed,
                "log_tail": list(s.worker.logs)[-20:] if s.worker else [],
            }
            for s in job.sub_jobs
        ]
