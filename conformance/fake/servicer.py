"""`FakeServicer`: every op of arctic.v1 over the fake gateway's jobs, each sub-job running a
fake engine in process (`engines/fake/engine.py`, the engine gateway workers run; NUMERICS.md).

The protocol layer (`arctic_servers.protocol`) does routing, auth, chunk groups, idempotency,
sequencing and generic body validation; this class adds the semantic checks (`check_request`,
run before a data-plane call is accepted, so bad input is a 4xx, never a failed request) and
what spans the job: the ops the method table marks `engine` (forward-backward, forward,
log-probs) go to the target sub-job's engine through `run_on_engine`, step to the trainer's
engine; generate, weight sync, checkpoints and the lifecycle are the fake gateway's own. Every
executed data-plane call is appended to its job's execution log.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from arctic_sdk.spec.model import MethodInfo
from arctic_sdk.spec.tables import methods as M
from arctic_servers.engines import op_checks
from arctic_servers.engines.fake import checkpoints as ck
from arctic_servers.engines.fake import numerics as nx
from arctic_servers.engines.fake import operations, sampling
from arctic_servers.engines.fake.config import FAKE_CONFIG_KEYS
from arctic_servers.engines.fake.state import Job, SubJob
from arctic_servers.engines.op_checks import CallFacts, vocab_of
from arctic_servers.protocol.context import CallContext
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.rules.fields import step_args
from arctic_servers.rules.lora_config import SUPPORT as LORA_SUPPORT
from arctic_servers.rules.lora_config import adapter_sync, check_adapter, job_lora
from arctic_servers.rules.operation_types import OPERATION_TYPES, forward_body
from arctic_servers.serving.job_control import JobControl

from . import control
from . import operations as run_operation
from .jobs import JobManager

if TYPE_CHECKING:
    from arctic_servers.protocol.core import ProtocolCore

DEFAULT_VOCAB_SIZE = 151_936  # Qwen2's; ids of the byte tokenizer (< 259) always fit
LIFECYCLE = {"applied": False, "reason": "fake gateway: nothing to offload"}


class FakeServicer(JobControl[Job]):
    """The fake gateway's business logic. `behaviour` is the switchboard for behaviour faults.

    Behaviour keys honoured now: `latency_s` ({op name: seconds} slept before the op runs, so a
    test can observe `running` requests, 202 answers and CancelRequest of a running request).
    """

    operation_types = OPERATION_TYPES
    lora_support = LORA_SUPPORT.json()  # the capabilities' `lora` (the on-prem server's)
    config_keys = FAKE_CONFIG_KEYS

    def __init__(
        self,
        jobs: JobManager | None = None,
        *,
        vocab_size: int = DEFAULT_VOCAB_SIZE,
        auth: bool = False,
    ) -> None:
        self.jobs: JobManager = jobs or JobManager()
        self.vocab_size = vocab_size
        self.auth = auth
        self.behaviour: dict[str, Any] = {}
        self.core: ProtocolCore | None = None  # attached by the server (operation cancel-request)

    # ------------------------------------------------------------------ protocol hooks

    async def cancel_running(self, ctx: CallContext, request_id: str) -> bool:
        job = self.jobs.jobs.get(ctx.job_id or "")
        if job is not None:
            self._log(job, ctx, op=M.CANCEL_REQUEST.name, cancelled_request_id=request_id)
        return False  # the core cancels the request's task

    def check_request(self, ctx: CallContext, body: dict[str, Any]) -> None:
        """Semantic checks before a data-plane call is accepted (4xx on failure): the servers'
        one per-op check table (`engines/op_checks.py`) over what this server knows of the
        call; a training op's parsed loss goes to its engine (`ctx.checked`)."""
        job = self._job(ctx)
        ctx.checked = op_checks.check(ctx.method, self._facts(ctx, job), body)

    def _facts(self, ctx: CallContext, job: Job) -> CallFacts:
        base = CallFacts(
            job=job,
            vocab=vocab_of(self.vocab_size),
            engine="fake",
            adapter_job=_lora_job(job),
            visible=functools.partial(self.jobs.visible, owner=self._owner(ctx)),
            check_sync=functools.partial(operations.check_sync, job),
            operation_types=self.operation_types,
            operation_forward=lambda _, payload: (forward_body(payload), base),
        )
        if ctx.method is M.OPERATION:
            return base
        sub = self.target(job, ctx)
        # a forward on a sampler is a vLLM sampler's scoring, as on-prem
        return replace(base, scores_with_vllm=sub.role == "sampling", max_context=sub.max_seq_len)

    # ------------------------------------------------------------------ helpers

    def _log(self, job: Job, ctx: CallContext, **extra: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "index": len(job.execution_log),
            "op": ctx.method.name,
            "request_id": ctx.request_id,
            "seq": ctx.seq,
            "idempotency_key": ctx.idempotency_key,
            "transport": ctx.transport,
            "sub_job_id": ctx.sub_job_id,
            "at": time.time(),
        }
        entry.update(extra)
        job.execution_log.append(entry)
        return entry

    async def _begin(self, ctx: CallContext, **extra: Any) -> tuple[Job, SubJob, dict[str, Any]]:
        """Start executing a data-plane call: latency behaviour, state re-check, log entry."""
        delay = (self.behaviour.get("latency_s") or {}).get(ctx.method.name, 0)
        if delay:
            await asyncio.sleep(float(delay))
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        sub = self.target(job, ctx)
        return job, sub, self._log(job, ctx, target=sub.sub_job_id, **extra)

    # ------------------------------------------------------------------ control plane

    async def create_job(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = control.create(self.jobs, self._owner(ctx), body)
        job.start_engines(self.vocab_size)
        return {"job_id": job.job_id}

    # ------------------------------------------------------------------ training

    async def run_on_engine(
        self, ctx: CallContext, method: MethodInfo, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Every `engine` op of the method table (forward-backward, forward, log-probs): the
        target sub-job's fake engine runs the command of the op's name on the body."""
        job, sub, _ = await self._begin(ctx)
        if method in (M.FORWARD_BACKWARD, M.FORWARD):  # checked in `check_request`: not again
            return engine_command(job, sub, method.python_name, body=body, loss=ctx.checked)
        return engine_command(job, sub, method.python_name, body=body)

    async def step(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub, entry = await self._begin(ctx)
        result = sub.engine.op_step(**step_args(body))  # the trainer's optimizer counters
        metrics = result["metrics"]
        job.global_step = int(metrics["global_step"])
        entry.update(global_step=job.global_step, grad_norm=metrics["grad_norm"], lr=metrics["lr"])
        return result

    # ------------------------------------------------------------------ sampling

    async def generate(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        """The sampler's engine generates; a seed the body leaves out is drawn here, so that the
        execution log can name it (NUMERICS.md: the same seed replays the same samples)."""
        job, sub, entry = await self._begin(ctx)
        p = sampling.parse_params(body)
        seed = p.seed if p.seed is not None else sampling.draw_seed()
        params = {**(body.get("sampling_params") or {}), "seed": seed}
        # adapter "base": a LoRA job's base model, weight version 0 (NUMERICS.md §6)
        adapter = check_adapter(body, _lora_job(job))
        result = sub.engine.op_generate(
            body["prompts"],
            params,
            weight_version=job.weight_version,
            adapter=adapter,
            clamp_max_tokens=bool(body.get("clamp_max_tokens")),
        )
        entry.update(seed=seed, weight_version=result["weight_version"])
        return result

    async def sync_weights(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, _, entry = await self._begin(ctx)
        result = operations.sync(job, body)
        entry.update(weight_version=job.weight_version)
        return result

    async def reset_prefix_cache(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await self._begin(ctx)
        return {"reset": True}

    async def operation(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        delay = (self.behaviour.get("latency_s") or {}).get(ctx.method.name, 0)
        if delay:
            await asyncio.sleep(float(delay))
        job = self._job(ctx)
        self._require_running(job, ctx.method)
        return await run_operation.run(self, job, ctx, body)

    # ------------------------------------------------------------------ checkpoints

    async def save_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, sub, entry = await self._begin(ctx)
        result = ck.save(job, sub, body)
        entry.update(checkpoint_id=result["checkpoint"]["checkpoint_id"])
        return result

    async def load_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job, _, entry = await self._begin(ctx)
        entry.update(checkpoint_id=body.get("checkpoint_id"))
        return ck.load(self.jobs, job, self._owner(ctx), body)

    async def list_checkpoints(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return ck.list_all(self._job(ctx))

    async def export_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        return ck.export(self._job(ctx), str(body["checkpoint_id"]), body)

    async def download_checkpoint_file(self, ctx: CallContext, body: dict[str, Any]) -> bytes:
        return ck.download(self._job(ctx), str(body["checkpoint_id"]), str(body["filename"]))

    async def delete_checkpoint(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        job = self._job(ctx)
        self._log(job, ctx, checkpoint_id=body["checkpoint_id"])
        return ck.delete(job, str(body["checkpoint_id"]))

    # ------------------------------------------------------------------ colocation lifecycle

    async def sleep_inference(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await self._begin(ctx)
        return dict(LIFECYCLE)

    async def wake_inference(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await self._begin(ctx)
        return dict(LIFECYCLE)

    async def sleep_training(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await self._begin(ctx)
        return dict(LIFECYCLE)

    async def wake_training(self, ctx: CallContext, body: dict[str, Any]) -> dict[str, Any]:
        await self._begin(ctx)
        return dict(LIFECYCLE)

    # ------------------------------------------------------------------ admin

    def job_state(self, job_id: str) -> dict[str, Any]:
        """The admin view of a job (conformance/README.md, "Fake gateway")."""
        job = self.jobs.jobs.get(job_id)
        if job is None:
            raise ProtocolError("job_not_found", f"no job {job_id!r}", job_id=job_id)
        trainer = job.trainer
        return {
            "job_id": job.job_id,
            "state": job.state,
            "reason": job.reason,
            "history": list(job.history),
            "applied_steps": trainer.applied_steps,
            "global_step": job.global_step,
            "weight_version": job.weight_version,
            "lr": trainer.lr,
            "adam": dict(trainer.adam),
            "model_steps": {s.sub_job_id: s.model_step for s in job.sub_jobs},
            "accumulated": {
                "loss": trainer.accum_loss,
                "num_tokens": trainer.accum_tokens,
                "grad_norm": nx.grad_norm(trainer.grad),
            },
            "checkpoints": list(job.checkpoints),
            "execution_log": list(job.execution_log),
        }


def engine_command(job: Job, sub: SubJob, command: str, **args: Any) -> dict[str, Any]:
    """Run `command` on the sub-job's fake engine (its `commands()` table, as a gateway worker
    runs it); a forwarded result's metrics carry the job's global step."""
    run = sub.engine.commands().get(command)
    if run is None:
        raise ProtocolError(
            "unimplemented",
            f"the fake engine of sub-job {sub.sub_job_id} has no command {command!r}",
            command=command,
        )
    result = dict(run(**args))
    if isinstance(result.get("metrics"), dict):
        result["metrics"]["global_step"] = job.global_step
    return result


def _lora_job(job: Job) -> bool:
    return adapter_sync(job_lora([(s.role, s.config) for s in job.sub_jobs]))
