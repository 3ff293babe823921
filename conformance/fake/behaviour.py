"""Behaviour faults: bugs a real server could have, switched on in the fake gateway at run time.

Each fault is a key of the behaviour switchboard (`POST /_admin/behaviour {"<name>": true}`,
`FakeServicer.behaviour`); `install` registers them as the protocol core's declared hooks
(`arctic_servers.protocol.faultpoints.CoreHooks`), so that a switched-on fault changes exactly one
behaviour. The conformance suite proves itself with them: `conformance/faults.yaml` lists, for
each fault, the cases that must fail and only those (`tests/conformance/test_faults.py`). The
faults live here, not in the server runtime (`arctic_servers.protocol`), which only declares where
a hook is called and stays correct.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web
from google.protobuf import descriptor_pool

import dssst1
from arctic_sdk.spec.model import GrpcShape, MethodInfo
from arctic_sdk.spec.tables import methods as M
from arctic_servers.protocol.calls import IncomingCall
from arctic_servers.protocol.chunk_groups import ChunkGroups, ChunkStep
from arctic_servers.protocol.context import CallContext
from arctic_servers.protocol.faultpoints import CoreHooks
from arctic_servers.protocol.sequencer import Sequencer
from arctic_servers.protocol.stores import GroupRecord
from arctic_servers.rules.errors import ProtocolError
from arctic_servers.rules.jobs import JobRecord
from arctic_servers.rules.validate import validate_body

if TYPE_CHECKING:
    from arctic_servers.protocol.core import ProtocolCore

    from .servicer import FakeServicer

FAULTS: dict[str, str] = {
    "result_dtype_f64": "log-prob and entropy outputs come back as F64, not F32",
    "logprobs_unshifted": "log-probs aligned to tokens (first column 0) instead of shifted",
    "replay_executes_twice": "a replayed completed chunk group executes again",
    "internal_error_on_bad_dtype": "a tensor of a dtype the op does not take crashes the op (500)",
    "ignore_max_tokens": "generate ignores sampling_params.max_tokens",
    "seed_ignored": "generate ignores sampling_params.seed",
    "error_body_dropped_404": "HTTP 404 answers lose their error body (a proxy's error page)",
    "no_auth_on_data_plane": "data-plane calls are served without a valid token",
    "cursor_ignored": "polls ignore the cursor and answer from the first event",
    "sequence_ignored": "X-Arctic-Seq is accepted but requests run in arrival order",
    "idempotency_key_ignored": "a keyed data-plane call retried with its key runs again",
    "weight_version_stuck": "sync-weights does not bump weight_version",
    "terminal_job_serves": "a cancelled job keeps serving data-plane calls",
    "restart_not_required": "a chunk of an unknown group other than 0 is cached, not 409",
    "too_many_chunks_unchecked": "total_chunks is not checked against max_chunks",
    "unknown_fields_ignored": "unknown JSON / body fields are ignored instead of refused",
    "loss_fields_ignored": "a field the chosen loss does not read is ignored instead of refused",
    "cross_entropy_weights_ignored": "cross_entropy ignores context.weights",
    "forward_loss_zero": "forward without loss_fn answers loss 0 instead of cross-entropy's",
    "top_logprobs_dropped": "generate answers the sampled log-probs only, never the top k",
    "sampler_load_keeps_weight_version": "a checkpoint loaded into a sampler keeps weight_version",
}
_LOGPROB_OPS = frozenset({M.FORWARD_BACKWARD, M.FORWARD, M.LOG_PROBS, M.OPERATION})


class _NoWaitSequencer(Sequencer):
    async def wait_turn(self, job_id: str, seq: int, concurrent: bool = False) -> None:
        return None


def install(app: web.Application, core: ProtocolCore, servicer: FakeServicer) -> None:
    """Register the behaviour faults as the core's declared hooks (`faultpoints.CoreHooks`),
    and add an HTTP middleware; a switched-off fault leaves its hook's step as it was."""

    def on(name: str) -> bool:
        return bool(servicer.behaviour.get(name))

    # ------------------------------------------------------------------ auth
    def auth_refused(call: IncomingCall, exc: ProtocolError) -> str | None:
        if on("no_auth_on_data_plane") and call.method.grpc_shape is not GrpcShape.UNARY:
            return next(iter(core.config.tokens))  # anyone is taken for the first user
        raise exc

    # ------------------------------------------------------------------ validation
    def body_refused(method: MethodInfo, body: Any, exc: ProtocolError) -> None:
        if on("unknown_fields_ignored") and "unknown_fields" in exc.details:
            # a server that drops unknown fields still checks the rest of the body
            return _validate(method, _known_only(method, body))
        if on("loss_fields_ignored") and "unread_fields" in exc.details:
            return None
        if on("internal_error_on_bad_dtype") and exc.code == "dtype_mismatch":
            raise RuntimeError(f"cannot cast {exc.details.get('field')}") from None
        raise exc

    # ------------------------------------------------------------------ execution
    def request_body(method: MethodInfo, ctx: CallContext, body: Any) -> Any:
        if method is M.GENERATE and isinstance(body, dict):
            params = dict(body.get("sampling_params") or {})
            if on("ignore_max_tokens"):
                params.pop("max_tokens", None)
            if on("seed_ignored"):
                params.pop("seed", None)
            body = {**body, "sampling_params": params}
        proc = body.get("processing") or {} if isinstance(body, dict) else {}
        default_loss = (proc.get("loss_fn") or "cross_entropy") == "cross_entropy"
        weights = (body.get("context") or {}).get("weights") if isinstance(body, dict) else None
        ce = method in (M.FORWARD_BACKWARD, M.FORWARD) and default_loss and weights is not None
        if ce and on("cross_entropy_weights_ignored"):
            body = {**body, "context": {**body["context"], "weights": None}}
        return body

    def result_hook(method: MethodInfo, ctx: CallContext, body: Any, result: Any) -> Any:
        proc = body.get("processing") or {} if isinstance(body, dict) else {}
        if method is M.FORWARD and on("forward_loss_zero") and not proc.get("loss_fn"):
            result["loss"] = result["metrics"]["loss"] = 0.0
        if method is M.GENERATE and on("top_logprobs_dropped"):
            for completion in result.get("results") or []:
                for sample in completion.get("samples") or []:
                    sample.pop("top_logprobs", None)
        if method is M.LOAD_CHECKPOINT and on("sampler_load_keeps_weight_version"):
            job = servicer.jobs.jobs.get(ctx.job_id or "")
            target = job.find_sub_job(str(body.get("target_sub_job_id") or "")) if job else None
            if job is not None and target is not None and target.role != "training":
                job.weight_version -= 1
        if method in _LOGPROB_OPS:
            for outputs in _outputs(result):
                _mutate_outputs(outputs, on)
        if method is M.SYNC_WEIGHTS and on("weight_version_stuck"):
            job = servicer.jobs.jobs.get(ctx.job_id or "")
            if job is not None:
                job.weight_version -= 1
            result["weight_version"] -= 1
        return result

    def identity(method: MethodInfo, kind: str, ident: str) -> tuple[str, str]:
        if kind == "key" and on("idempotency_key_ignored"):
            return "", ""
        if kind == "group" and on("replay_executes_twice"):
            return "", ""
        return kind, ident

    no_wait: list[Sequencer] = []

    def sequencer(real: Sequencer) -> Sequencer:
        if not on("sequence_ignored"):
            return real
        if not no_wait:
            no_wait.append(_NoWaitSequencer(core.config.limits.sequence_gap_timeout_seconds))
        return no_wait[0]

    def poll(call: IncomingCall) -> IncomingCall:
        if on("cursor_ignored"):
            call = dataclasses.replace(
                call, query={k: v for k, v in call.query.items() if k != "cursor"}
            )
        return call

    # ------------------------------------------------------------------ job state
    def job_refused(job: JobRecord[Any], method: MethodInfo, exc: ProtocolError) -> None:
        if job.terminal and on("terminal_job_serves"):
            return
        raise exc

    core.hooks = CoreHooks(
        auth_refused=auth_refused,
        body_refused=body_refused,
        job_refused=job_refused,
        chunk_accept=lambda groups, job_id, method, frame: _accept(
            groups, job_id, method, frame, on
        ),
        identity=identity,
        sequencer=sequencer,
        request_body=request_body,
        result=result_hook,
        poll=poll,
    )

    # ------------------------------------------------------------------ HTTP answers
    @web.middleware
    async def drop_404_body(
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        response = await handler(request)
        if response.status == 404 and on("error_body_dropped_404"):
            return web.Response(status=404)
        return response

    app.middlewares.insert(0, drop_404_body)


def _validate(method: MethodInfo, body: Any) -> None:
    """The core's body checks (`validate_body`), without the hooks."""
    validate_body(descriptor_pool.Default().FindMessageTypeByName(method.request_type), body)


def _outputs(result: Any) -> list[dict[str, Any]]:
    found = []
    for holder in (result, result.get("result") if isinstance(result, dict) else None):
        if isinstance(holder, dict) and isinstance(holder.get("outputs"), dict):
            found.append(holder["outputs"])
    return found


def _mutate_outputs(outputs: dict[str, Any], on: Callable[[str], bool]) -> None:
    for name in ("logprobs_shifted", "entropy"):
        arr = outputs.get(name)
        if not isinstance(arr, np.ndarray):
            continue
        if name == "logprobs_shifted" and on("logprobs_unshifted") and arr.ndim == 2:
            arr = np.concatenate([np.zeros_like(arr[:, :1]), arr[:, :-1]], axis=1)
            arr[:, -1] = np.where(arr[:, -1] == 0, -1.0, arr[:, -1])
        if on("result_dtype_f64"):
            arr = arr.astype(np.float64)
        outputs[name] = arr


def _accept(
    groups: ChunkGroups,
    job_id: str,
    method: MethodInfo,
    frame: bytes | memoryview,
    on: Callable[[str], bool],
) -> ChunkStep:
    """The `chunk_accept` hook: `groups.accept`, with the chunk-group faults."""
    limits = groups.limits
    if on("too_many_chunks_unchecked"):
        groups.limits = dataclasses.replace(limits, max_chunks=1 << 62)
    try:
        step = groups.accept(job_id, method, frame)
        if step.group_id and on("replay_executes_twice"):  # forget the completed group
            record = groups.store.get_group(job_id, step.group_id)
            if record is not None:
                record.complete, record.received, record.request_id = False, set(), ""
                groups.store.put_group(record)
        return step
    except ProtocolError as exc:
        if exc.code == "chunk_group_restart_required" and on("restart_not_required"):
            return _cache_first(groups, job_id, frame)
        raise
    finally:
        groups.limits = limits


def _cache_first(groups: ChunkGroups, job_id: str, frame: bytes | memoryview) -> ChunkStep:
    """Start a group at whatever chunk arrives first (what §3.5 forbids)."""
    asm = dssst1.ChunkAssembler(kind="request", limits=groups.limits)
    try:
        desc = dssst1.read_chunk_descriptor(frame)
        asm.feed(frame)
    except dssst1.DSSError as exc:
        raise ProtocolError(exc.code, str(exc), field=exc.path or "body") from None
    assert desc is not None and desc.chunk_group_id is not None
    gid = desc.chunk_group_id
    record = GroupRecord(
        job_id=job_id,
        group_id=gid,
        frame_sha256=desc.frame_sha256,
        total_chunks=desc.total_chunks,
        frame_size_bytes=desc.frame_size_bytes,
        operation=str(desc.operation or ""),
        received={desc.chunk_idx},
    )
    groups.adopt(job_id, record, asm)
    return ChunkStep(
        cached={
            "chunk_cached": True,
            "chunk_group_id": gid,
            "chunk_idx": desc.chunk_idx,
            "chunks_received": 1,
            "total_chunks": desc.total_chunks,
        }
    )


def _known_only(method: Any, body: Any) -> Any:
    """A copy of `body` without the keys its request message does not have (what a server that
    ignores unknown fields goes on with)."""

    def keep(desc: Any, value: Any) -> Any:
        if not isinstance(value, dict) or desc.full_name.startswith("google.protobuf."):
            return value
        out = {}
        for k, v in value.items():
            fd = desc.fields_by_name.get(k) if isinstance(k, str) else None
            if fd is None:
                continue
            mt = fd.message_type
            if mt is None or mt.GetOptions().map_entry:
                out[k] = v
            elif fd.is_repeated and isinstance(v, list):
                out[k] = [keep(mt, x) for x in v]
            else:
                out[k] = keep(mt, v)
        return out

    if not method.request_type:
        return body
    return keep(descriptor_pool.Default().FindMessageTypeByName(method.request_type), body)
