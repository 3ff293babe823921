"""The legacy async client of the SkyRL and verl integrations, on top of `arctic_sdk.AsyncClient`.

`create_arctic_rl_client(config, server_state=None)` returns an `ArcticRLClient` with every
method and keyword the integrations call (`adapters.md` §1.3, §2.2) and the rest of the deployed
legacy surface (`arctic.md` §7.3). Construction is synchronous, as deployed: it launches the
local server when asked to, creates the job (or re-attaches to `config.job_id`) and waits until
it runs, so `reconnect_config()` can name the job at once.

A client pickles (into a Ray worker, a subprocess): the copy re-attaches by job id — it never
creates a job, never launches a server, and its `shutdown()` only closes its connections; the
client that created the job cancels it (and stops a server it launched) on `shutdown()`.
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .._client_base import CallOptions
from .._core.capabilities import config_keys_of
from .._generated.client import AsyncClient, Client
from .._loop_guard import exempt
from ..errors import ArcticError, InvalidArgumentError, UnsupportedOptionError
from .config import ArcticRLClientConfig, LegacyConfigWarning
from .job_config import UnsupportedConfigError, plan_job
from .knobs import LOGPROB_KEYS
from .launch import LaunchedServer, launch_onprem, reachable
from .lifecycle import LegacyLifecycle
from .lowering import Lowered, is_canonical, lower, to_numpy
from .responses import forward_response, generate_results, sampling_params, step_response

__all__ = ["ArcticRLClient", "ArcticServerState", "create_arctic_rl_client"]

ROLES = ("training", "sampling", "log_prob")


@dataclass(frozen=True)
class ArcticServerState:
    """What `get_server_state()` hands to another process (the deployed Ray server handle's role).

    Picklable; `create_arctic_rl_client(reconnect_config, server_state)` re-attaches with it.
    """

    base_url: str | None
    job_id: str
    sub_job_ids: tuple[tuple[str, str], ...] = ()


def create_arctic_rl_client(
    config: ArcticRLClientConfig | Mapping[str, Any],
    server_state: ArcticServerState | None = None,
    *,
    arctic_rl_server_state: ArcticServerState | None = None,
) -> ArcticRLClient:
    """A connected legacy client: a new job from `config`, or the job of a reconnect config."""
    cfg = ArcticRLClientConfig.model_validate(config)
    state = server_state if server_state is not None else arctic_rl_server_state
    return ArcticRLClient(cfg, state)


class ArcticRLClient(LegacyLifecycle):
    """Legacy async surface; every call is lowered to one canonical op (or a short sequence)."""

    def __init__(
        self,
        config: ArcticRLClientConfig,
        server_state: ArcticServerState | None = None,
    ) -> None:
        self._launched: LaunchedServer | None = None
        self._closed = False
        if server_state is not None:
            config = config.model_copy(
                update={
                    "job_id": server_state.job_id,
                    "owner": False,
                    "base_url": server_state.base_url or config.base_url,
                }
            )
            self._sub_jobs = dict(server_state.sub_job_ids)
        else:
            self._sub_jobs = {}
        self._config = config
        self._issued = Issued()
        self.transport = Transport(self.get_server_state)
        self._ensure_server()
        kw = self._config.sdk_kwargs()
        self._control = Client(**kw, job_id=self._config.job_id)
        exempt(self._control)  # create_arctic_rl_client is sync upstream, wherever it is called
        try:
            if self._config.job_id is None:
                self._control.create_job(cast(Any, self._plan_job()))
                self._config = self._config.model_copy(
                    update={"job_id": self._control.job_id, "owner": True}
                )
            if not self._sub_jobs:
                job = self._control.wait_until_running()
                self._sub_jobs = {
                    str(s["job_type"]): str(s["sub_job_id"]) for s in job.get("sub_jobs") or []
                }
        except BaseException:
            self._control.close()
            if self._launched is not None:
                self._launched.stop()
            raise
        self._sdk = AsyncClient(**kw, job_id=self._config.job_id)

    def _plan_job(self) -> dict[str, Any]:
        """The CreateJob body for the server's advertised config keys; the warnings of the
        mapping (each naming its fields) are emitted, its refusals raised (job_config.py)."""
        try:
            doc = dict(self._control.get_capabilities())
        except ArcticError:  # a server without the route (the deployed Cortex): the standard
            doc = {}
        plan = plan_job(self._config, config_keys_of(doc))
        if plan.problems:
            raise UnsupportedConfigError(plan.problems)
        for msg in plan.warnings:
            warnings.warn(msg, LegacyConfigWarning, stacklevel=4)
        return plan.body

    def _ensure_server(self) -> None:
        cfg = self._config
        if cfg.backend != "onprem" or cfg.base_url:
            return
        host, port = cfg.host or "localhost", cfg.port or 7000
        up = reachable(host, port)
        if cfg.should_launch(up):
            tokens = (cfg.pat.get_secret_value(),) if cfg.pat is not None else ()
            self._launched = launch_onprem(
                host,
                port,
                python=cfg.server_python,
                tokens=tokens,
                timeout=cfg.startup_timeout,
                echo=cfg.server_logs,
                env=_server_env(cfg),
            )
            self._config = cfg.model_copy(update={"base_url": self._launched.base_url})

    # ------------------------------------------------------------------ identity, re-attach

    @property
    def config(self) -> ArcticRLClientConfig:
        return self._config

    @property
    def job_id(self) -> str:
        assert self._config.job_id is not None
        return self._config.job_id

    @property
    def training_job_id(self) -> str | None:
        return self._sub_jobs.get("training")

    @property
    def sampling_job_id(self) -> str | None:
        return self._sub_jobs.get("sampling")

    @property
    def log_prob_job_id(self) -> str | None:
        return self._sub_jobs.get("log_prob")

    @property
    def launched_server(self) -> LaunchedServer | None:
        return self._launched

    def reconnect_config(self) -> dict[str, Any]:
        """A config (plain dict) that re-attaches a new client to this job: pass it to
        `create_arctic_rl_client` in any process. It never creates a job or launches a server."""
        data = self._config.model_dump(exclude_none=True)
        data.update(job_id=self.job_id, owner=False, launch_local_server=False)
        if self._config.pat is not None:
            data["pat"] = self._config.pat  # stays a SecretStr: never printed
        url = self._config.base_url or self._config.server_url()
        if url:
            data["base_url"] = url
        return data

    def get_server_state(self) -> ArcticServerState:
        return ArcticServerState(
            self._config.base_url or self._config.server_url(),
            self.job_id,
            tuple(sorted(self._sub_jobs.items())),
        )

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.reconnect_config(), "server_state": self.get_server_state()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        cfg = ArcticRLClientConfig.model_validate(state["config"])
        self.__init__(cfg, state["server_state"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ArcticRLClient(job_id={self.job_id!r}, server={self._config.server_url()!r})"

    def _sub(self, role: str) -> CallOptions | None:
        sub = self._sub_jobs.get(role)
        return CallOptions(sub_job_id=sub) if sub else None

    # ------------------------------------------------------------------ training

    async def fwd_bwd(
        self,
        payload: Mapping[str, Any],
        processing: Mapping[str, Any] | None = None,
        router_replay: Any = None,
    ) -> dict[str, Any]:
        """forward-backward of a `{batch, meta, processing}` body (or a canonical frame)."""
        if router_replay is not None:
            raise UnsupportedOptionError(
                "router_replay is not supported",
                code="unsupported_option",
                details={"options": ["router_replay"]},
            )
        body = _with_processing(payload, processing)
        if is_canonical(body):
            return dict(await self._sdk.forward_backward(cast(Any, body)))
        low = lower(body, train=True, aligned=self._issued.aligned(body.get("batch") or {}))
        result = await self._sdk.forward_backward(cast(Any, low.frame))
        return forward_response(result, self._lift(low, result), self.training_job_id)

    def _lift(self, low: Lowered, result: Mapping[str, Any]) -> dict[str, Any]:
        """The legacy `batch` of a result; its log-prob tensors are remembered (by identity)
        with their alignment, so one sent back unchanged is lowered as what it is."""
        batch = low.lift_outputs(result)
        for name in ("logprobs", "entropy"):
            if batch.get(name) is not None:
                self._issued.add(batch[name], low.align)
        return batch

    async def fwd_no_grad(
        self,
        payload: Mapping[str, Any],
        reference_model: bool = False,
        processing: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """forward (no gradient); `reference_model=True` runs on the log-prob sub-job."""
        body = _with_processing(payload, processing)
        opts = self._sub("log_prob") if reference_model else None
        if is_canonical(body):
            return dict(await self._sdk.forward(cast(Any, body), options=opts))
        low = lower(body, train=False)
        result = await self._sdk.forward(cast(Any, low.frame), options=opts)
        job = self.log_prob_job_id if opts is not None else self.training_job_id
        return forward_response(result, self._lift(low, result), job)

    async def step(self, learning_rate: float | None = None) -> dict[str, Any]:
        fields = {} if learning_rate is None else {"learning_rate": float(learning_rate)}
        result = await self._sdk.step(cast(Any, fields))
        ranks = max(1, self._config.training_gpus)
        return step_response(result, self.training_job_id, ranks)

    async def log_probs(
        self,
        prompts: Sequence[Sequence[int]] | Any,
        completions: Sequence[Sequence[int]] | None = None,
        top_k: int = 1,
    ) -> dict[str, Any]:
        """Score token-id sequences (prompt + completion) with the log-prob sub-job."""
        if top_k != 1:
            raise UnsupportedOptionError(
                f"top_k={top_k}: only the scored token's log-prob (1)",
                code="unsupported_option",
                details={"options": ["top_k"]},
            )
        if any(isinstance(p, str) for p in prompts):
            raise InvalidArgumentError("log_probs scores token ids; tokenize text prompts first")
        tails = list(completions) if completions is not None else [[] for _ in prompts]
        if len(tails) != len(prompts):
            raise InvalidArgumentError(f"{len(prompts)} prompts but {len(tails)} completions")
        rows = [
            [int(t) for t in p] + [int(t) for t in c] for p, c in zip(prompts, tails, strict=True)
        ]
        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), np.int64)
        mask = np.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = r, 1
        result = await self._sdk.log_probs(input_ids=ids, attention_mask=mask)
        lp = to_numpy(result["outputs"]["logprobs_shifted"], "logprobs")
        return forward_response(result, {"logprobs": lp}, self.log_prob_job_id)

    # ------------------------------------------------------------------ sampling

    async def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        sampling_params: Mapping[str, Any] | None = None,
        routing_key: str | None = None,
        strict: bool = False,
        clamp_max_tokens: bool = True,
    ) -> list[dict[str, Any]]:
        """Samples as a flat list of `{text, token_ids, finish_reason, ...}` (prompt-major).

        `clamp_max_tokens` (default on: SkyRL and verl ask for a fixed response length that a
        long prompt may not leave room for, and expect vLLM to stop at the context's end): a
        `max_tokens` past a prompt's room is lowered to it, and that prompt's samples carry
        `clamped_max_tokens`; False refuses such a request (`invalid_argument` naming the room).
        """
        params = _sampling(sampling_params)
        ps = [p if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        fields: dict[str, Any] = {"prompts": ps, "sampling_params": params}
        if clamp_max_tokens:
            fields["clamp_max_tokens"] = True
        if routing_key:
            fields["routing_key"] = routing_key
        if strict:
            fields["strict"] = True
        return generate_results(await self._sdk.generate(**fields))

    async def sync_weights(
        self,
        cuda_ipc: bool | None = None,
        low_memory: bool | None = None,
        *,
        target_sub_job_ids: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """The trainer's weights into the sampling sub-job — as the deployed clients did; the
        log-prob (reference) sub-job only when `target_sub_job_ids` names it, so a KL term's
        reference model stays frozen. `cuda_ipc` / `low_memory` default to the config's."""
        cfg = self._config
        fields: dict[str, Any] = {
            k: v
            for k, v in (
                ("cuda_ipc", cfg.cuda_ipc if cuda_ipc is None else cuda_ipc),
                ("low_memory", cfg.low_memory if low_memory is None else low_memory),
            )
            if v is not None
        }
        default = [self.sampling_job_id] if self.sampling_job_id else []
        targets = list(target_sub_job_ids or default)
        if not targets:
            return {
                "job_id": self.training_job_id,
                "status": "skipped",
                "reason": "the job has no sampling sub-job to sync into",
            }
        fields["target_sub_job_ids"] = targets
        result = await self._sdk.sync_weights(cast(Any, fields))
        return {"job_id": self.training_job_id, "status": "ok", **result}

    async def reset_prefix_cache(
        self, drain: bool = True, timeout_s: float = 60.0, retry_interval_s: float = 0.1
    ) -> dict[str, Any]:
        del retry_interval_s  # client-side polling knob of the deployed client
        result = await self._sdk.reset_prefix_cache(drain=drain, timeout_s=timeout_s)
        return {"job_id": self.sampling_job_id, "sampling": result}

    # ------------------------------------------------------------------ teardown

    async def shutdown(self) -> None:
        """Idempotent. The creating client cancels the job and stops a server it launched."""
        if self._closed:
            return
        self._closed = True
        if self._config.owner:
            with contextlib.suppress(Exception):
                await self._sdk.cancel_job()  # awaited: the sync client would block the loop
        with contextlib.suppress(Exception):
            await self._sdk.close()
        self._control.close()
        if self._launched is not None:
            self._launched.stop()


class Issued:
    """Log-prob arrays this client returned (weakly, by identity) with their alignment."""

    def __init__(self, keep: int = 32) -> None:
        self._refs: deque[tuple[weakref.ref[Any], str]] = deque(maxlen=keep)

    def add(self, obj: Any, align: str) -> None:
        with contextlib.suppress(TypeError):  # not weak-referenceable: nothing to remember
            self._refs.append((weakref.ref(obj), align))

    def aligned(self, batch: Mapping[str, Any]) -> dict[str, str]:
        """The known alignment of each log-prob input that is one of those arrays."""
        out: dict[str, str] = {}
        for name in LOGPROB_KEYS:
            value = batch.get(name)
            for ref, align in self._refs:
                if value is not None and ref() is value:
                    out[name] = align
        return out


class Transport:
    """`client.transport`, as the Arctic-Platform verl plugin reads it (`get_server_state`)."""

    def __init__(self, server_state: Callable[[], Any]) -> None:
        self._server_state = server_state

    def get_server_state(self) -> Any:
        """The client's `get_server_state()`: what re-attaches another process to the job."""
        return self._server_state()


def _server_env(cfg: ArcticRLClientConfig) -> dict[str, str] | None:
    if cfg.server_cuda_visible_devices is None:
        return None
    return {**os.environ, "CUDA_VISIBLE_DEVICES": cfg.server_cuda_visible_devices}


def _with_processing(
    payload: Mapping[str, Any],
    processing: Mapping[str, Any] | None,
) -> dict[str, Any]:
    body = dict(payload)
    if processing is not None:
        body["processing"] = dict(processing)
    return body


def _sampling(params: Mapping[str, Any] | None) -> dict[str, Any]:
    return sampling_params(params)
