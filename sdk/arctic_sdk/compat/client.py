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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, cast

import numpy as np

from .._client_base import CallOptions
from .._generated.client import AsyncClient, Client
from ..errors import InvalidArgumentError, UnimplementedError
from .config import ArcticRLClientConfig
from .launch import LaunchedServer, launch_onprem, reachable
from .lowering import is_canonical, lower, to_numpy
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


class ArcticRLClient:
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
        self._ensure_server()
        kw = self._config.sdk_kwargs()
        self._control = Client(**kw, job_id=self._config.job_id)
        try:
            if self._config.job_id is None:
                self._control.create_job(cast(Any, self._config.create_job_body()))
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

    def _ensure_server(self) -> None:
        cfg = self._config
        if cfg.backend != "onprem" or cfg.base_url:
            return
        host, port = cfg.host or "localhost", cfg.port or 7000
        up = reachable(host, port)
        if cfg.should_launch(up):
            tokens = (cfg.pat.get_secret_value(),) if cfg.pat is not None else ()
            self._launched = launch_onprem(
                host, port, python=cfg.server_python, tokens=tokens, timeout=cfg.startup_timeout
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
            raise InvalidArgumentError(
                "router_replay is not supported",
                code="unsupported_option",
                details={"options": ["router_replay"]},
            )
        body = _with_processing(payload, processing)
        if is_canonical(body):
            return dict(await self._sdk.forward_backward(cast(Any, body)))
        low = lower(body, train=True)
        result = await self._sdk.forward_backward(cast(Any, low.frame))
        return forward_response(result, low.lift_outputs(result), self.training_job_id)

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
        return forward_response(result, low.lift_outputs(result), self.training_job_id)

    async def step(self, learning_rate: float | None = None) -> dict[str, Any]:
        fields = {} if learning_rate is None else {"learning_rate": float(learning_rate)}
        return step_response(await self._sdk.step(cast(Any, fields)), self.training_job_id)

    async def log_probs(
        self,
        prompts: Sequence[Sequence[int]] | Any,
        completions: Sequence[Sequence[int]] | None = None,
        top_k: int = 1,
    ) -> dict[str, Any]:
        """Score token-id sequences (prompt + completion) with the log-prob sub-job."""
        if top_k != 1:
            raise InvalidArgumentError(
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

    # ------------------------------------------------------------------ checkpoints

    async def save_checkpoint(
        self,
        checkpoint_id: str | None = None,
        checkpoint_type: str | None = None,
        path: str | None = None,
        *,
        step: int | None = None,
        export_hf: bool = False,
        save_total_limit: int | None = None,
        stage_info: Any = None,
    ) -> dict[str, Any]:
        refused = [
            n
            for n, v in (("save_total_limit", save_total_limit), ("stage_info", stage_info))
            if v is not None
        ]
        if refused:
            raise InvalidArgumentError(
                f"save_checkpoint: {refused} cannot be honoured",
                code="unsupported_option",
                details={"options": refused},
            )
        cid = checkpoint_id or (PurePath(path).name if path else None)
        if cid is None and step is not None:
            cid = f"step-{step}"
        fields: dict[str, Any] = {}
        if cid:
            fields["checkpoint_id"] = cid
        if checkpoint_type:
            fields["checkpoint_type"] = checkpoint_type
        result = await self._sdk.save_checkpoint(**fields)
        ck = dict(result.get("checkpoint") or {})
        out = {
            "job_id": self.training_job_id,
            "path": ck.get("checkpoint_id"),
            "global_step": ck.get("global_steps", 0),
            "hf_path": None,
            **result,
        }
        if export_hf:
            exported = await self._sdk.export_checkpoint(
                checkpoint_id=str(ck.get("checkpoint_id") or "")
            )
            out["hf_path"] = exported.get("checkpoint_id")
            out["export"] = exported
        return out

    async def save_weights(self, path: str) -> dict[str, Any]:
        """A weights-only checkpoint named after the last component of `path`."""
        return await self.save_checkpoint(PurePath(path).name, "weights-only")

    async def load_checkpoint(
        self,
        path: str | None = None,
        *,
        step: int | None = None,
    ) -> dict[str, Any]:
        cid = PurePath(path).name if path else (f"step-{step}" if step is not None else None)
        if cid is None:
            listed = (await self._sdk.list_checkpoints()).get("checkpoints") or []
            if not listed:
                raise InvalidArgumentError("load_checkpoint: the job has no checkpoint yet")
            cid = max(listed, key=lambda c: int(c.get("global_steps") or 0))["checkpoint_id"]
        result = await self._sdk.load_checkpoint(checkpoint_id=cid)
        ck = dict(result.get("checkpoint") or {})
        return {
            "job_id": self.training_job_id,
            "path": cid,
            "global_step": ck.get("global_steps", 0),
            **result,
        }

    # ------------------------------------------------------------------ sampling

    async def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        sampling_params: Mapping[str, Any] | None = None,
        routing_key: str | None = None,
        strict: bool = False,
    ) -> list[dict[str, Any]]:
        """Samples as a flat list of `{text, token_ids, finish_reason, ...}` (prompt-major)."""
        params = _sampling(sampling_params)
        ps = [p if isinstance(p, str) else [int(t) for t in p] for p in prompts]
        fields: dict[str, Any] = {"prompts": ps, "sampling_params": params}
        if routing_key:
            fields["routing_key"] = routing_key
        if strict:
            fields["strict"] = True
        return generate_results(await self._sdk.generate(**fields))

    async def sync_weights(
        self,
        cuda_ipc: bool | None = None,
        low_memory: bool | None = None,
    ) -> dict[str, Any]:
        fields = {
            k: v for k, v in (("cuda_ipc", cuda_ipc), ("low_memory", low_memory)) if v is not None
        }
        result = await self._sdk.sync_weights(cast(Any, fields))
        return {"job_id": self.training_job_id, "status": "ok", **result}

    async def reset_prefix_cache(
        self, drain: bool = True, timeout_s: float = 60.0, retry_interval_s: float = 0.1
    ) -> dict[str, Any]:
        del retry_interval_s  # client-side polling knob of the deployed client
        result = await self._sdk.reset_prefix_cache(drain=drain, timeout_s=timeout_s)
        return {"job_id": self.sampling_job_id, "sampling": result}

    # ------------------------------------------------------------------ colocation lifecycle

    async def sleep_inference(self, level: int = 1) -> dict[str, Any]:
        result = await self._sdk.sleep_inference(level=int(level))
        return {"job_id": self.sampling_job_id, "sampling": result}

    async def wake_inference(self, tags: Sequence[str] | None = None) -> dict[str, Any]:
        fields = {"tags": list(tags)} if tags else {}
        result = await self._sdk.wake_inference(cast(Any, fields))
        return {"job_id": self.sampling_job_id, "sampling": result}

    async def sleep_log_prob(self) -> dict[str, Any]:
        return await self._log_prob_lifecycle(sleep=True)

    async def wake_log_prob(self) -> dict[str, Any]:
        return await self._log_prob_lifecycle(sleep=False)

    async def _log_prob_lifecycle(self, *, sleep: bool) -> dict[str, Any]:
        opts = self._sub("log_prob")
        if opts is None:
            result: Any = {"applied": False, "reason": "the job has no log-prob sub-job"}
        elif sleep:
            result = await self._sdk.sleep_inference(level=1, options=opts)
        else:
            result = await self._sdk.wake_inference(options=opts)
        return {"job_id": self.log_prob_job_id, "log_prob": result}

    async def sleep_training(self, mode: str = "all") -> dict[str, Any]:
        result = await self._sdk.sleep_training(mode=mode)
        return {"job_id": self.training_job_id, "workers": [result]}

    async def wake_training(self) -> dict[str, Any]:
        result = await self._sdk.wake_training()
        return {"job_id": self.training_job_id, "workers": [result]}

    async def empty_training_cache(self) -> dict[str, Any]:
        """Frees the trainer's cached memory (the spec's alias of sleep-training)."""
        return await self.sleep_training()

    async def weight_norm(self) -> dict[str, Any]:
        raise UnimplementedError(
            "weight_norm has no canonical op (neither verl nor SkyRL calls it); export a "
            "checkpoint and compute the norm from its safetensors",
            code="unimplemented",
        )

    # ------------------------------------------------------------------ teardown

    async def shutdown(self) -> None:
        """Idempotent. The creating client cancels the job and stops a server it launched."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self._sdk.close()
        if self._config.owner:
            with contextlib.suppress(Exception):
                self._control.cancel_job()
        self._control.close()
        if self._launched is not None:
            self._launched.stop()


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
