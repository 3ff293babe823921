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

from pathlib import Path
from typing import Any

from arctic_sdk.spec.tables import methods as M

from ..engines import checks
from ..engines.config import (
    DEFAULT_MODEL_NAMES,
    LORA,
    config_keys,
    embedded_model_names,
    sub_job_specs,
)
from ..protocol import checkpoint_ids
from ..protocol import jobs as pj
from ..protocol.context import CallContext
from ..protocol.jobs import sub_job_by_id
from ..protocol.lora_config import check_adapter
from ..protocol.lora_pools import lora_support_json
from .checkpoints import Checkpoints
from .jobs import Job, engine_kind
from .operations import Operations


class OnpremServicer(Operations, Checkpoints):
    #: the capabilities' `config_keys`: the standard keys and the on-prem extensions
    config_keys = pj.config_keys_json(config_keys())

    @property
    def lora_support(self) -> dict[str, Any]:
        """The capabilities' `lora` (PROTOCOL.md §3.6), with this server's LoRA pools."""
        return lora_support_json(LORA.json(), self.jobs.pools.book)

    def check_request(self, ctx: CallContext, body: dict[str, Any]) -> None:
        """Semantic checks before a data-plane call is accepted (4xx on failure); the fields'
        bounds are the spec's, checked by the protocol layer (`tables.request_rules`)."""
        job = self._job(ctx)
        m = ctx.method
        sub = self.target(job, ctx) if m is not M.OPERATION else None
        if m is M.FORWARD_BACKWARD or m is M.FORWARD:
            assert sub is not None
            checks.train_body(body, self._vocab_of(sub))
            if m is M.FORWARD and engine_kind(sub.role, sub.spec.config) == "vllm":
                checks.vllm_forward(body)
        elif m is M.LOG_PROBS:
            assert sub is not None
            checks.log_probs_body(body, self._vocab_of(sub))
        elif m is M.GENERATE:
            assert sub is not None
            checks.sampling_params(body)
            checks.prompts(body, self._vocab_of(sub))
            info = sub.worker.info if sub.worker is not None else {}
            checks.prompt_room(body, int(info.get("max_model_len") or 0))
            check_adapter(body, job.syncs_adapter)
        elif m is M.SAVE_CHECKPOINT:
            checks.save_body(body)
        elif m is M.LOAD_CHECKPOINT:
            if not body.get("checkpoint_id"):
                raise checks.bad("checkpoint_id", "is required", "missing_field")
            checks.checkpoint_id(body["checkpoint_id"])
            checkpoint_ids.check_source_job(
                body, job.job_id, lambda s: self.jobs.visible(s, self._owner(ctx))
            )
            tid = body.get("target_sub_job_id")
            if tid:  # any sub-job: a sampler loads the checkpoint's exported weights
                sub_job_by_id(job, tid)
        elif m is M.SYNC_WEIGHTS:
            self._check_sync(job, body, "")
        elif m in (M.EXPORT_CHECKPOINT, M.DELETE_CHECKPOINT, M.DOWNLOAD_CHECKPOINT_FILE):
            checks.checkpoint_id(body.get("checkpoint_id"))
            if m is M.DOWNLOAD_CHECKPOINT_FILE:
                checks.filename(body.get("filename"))
        elif m is M.OPERATION:
            self._check_operation(job, ctx, body)

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
