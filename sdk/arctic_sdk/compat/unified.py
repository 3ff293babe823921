"""The current Arctic-Platform client config (`arctic_platform.client`), for its verl plugin.

The plugin (`arctic_platform/integrations/verl/adapter.py`) builds
`ArcticRLClientConfig(model_name, seed, max_seq_len, training_gpus, sampling_gpus, log_prob_gpus,
backend=OnPremConfig(...), training=TrainingConfig(...), sampling=SamplingConfig(...))` and calls
`create_arctic_rl_client(config)` / `create_arctic_rl_client(reconnect_config,
server_state=...)`. These models take exactly those fields (unknown ones are refused, as
deployed) and become the flat legacy config (`compat.config`), so one client and one CreateJob
mapping (`job_config.py`) serve both generations.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .client import ArcticRLClient, ArcticServerState, create_arctic_rl_client
from .config import ArcticRLClientConfig as FlatConfig

__all__ = [
    "CortexConfig",
    "OnPremConfig",
    "SamplingConfig",
    "SyncArcticRLClient",
    "TrainingConfig",
    "UnifiedClientConfig",
    "create_unified_client",
]

_STRICT = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)


class OnPremConfig(BaseModel):
    """Connection to the on-prem server (the deployed `protocol` "ray" is served over HTTP)."""

    model_config = _STRICT

    type: Literal["onprem"] = "onprem"
    protocol: Literal["http", "ray"] = "http"
    host: str = "localhost"
    port: int = 8000
    colocate: bool = False
    launch_local_server: bool = False
    server_cuda_visible_devices: str | None = None
    startup_timeout: float = 600.0


class CortexConfig(BaseModel):
    """Connection to a Cortex gateway."""

    model_config = _STRICT

    type: Literal["remote"] = "remote"
    protocol: Literal["cortex"] = "cortex"
    base_url: str | None = None
    host: str | None = None
    pat: str | None = None
    pat_env_var: str = "CORTEX_PAT"
    database: str = ""
    schema_: str = Field("", alias="schema")
    endpoint: str = "cortex-training"
    max_retries: int = Field(10, ge=0)


class SamplingConfig(BaseModel):
    model_config = _STRICT

    vllm: dict[str, Any] = Field(default_factory=dict)
    arctic_inference_config: dict[str, Any] | None = None
    log_prob_engine: Literal["vllm", "deepspeed"] = "vllm"
    log_prob_ds_config: dict[str, Any] | None = None


class TrainingConfig(BaseModel):
    model_config = _STRICT

    full_determinism: bool = False
    checkpoint_path: str | None = None
    ds_config: dict[str, Any] | None = None
    ds_worker_config: dict[str, Any] | None = None
    cuda_ipc: bool = False
    low_memory: bool = False


class UnifiedClientConfig(BaseModel):
    """`arctic_platform.client.ArcticRLClientConfig`: one config, the backend nested."""

    model_config = _STRICT

    model_name: str
    seed: int | None = None
    dtype: str | None = None
    max_seq_len: int = 8192
    training_gpus: int = 0
    sampling_gpus: int = 0
    log_prob_gpus: int = 0
    job_ready_timeout: float = 1800.0
    request_timeout: float = 1800.0
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    backend: OnPremConfig | CortexConfig = Field(default_factory=OnPremConfig, discriminator="type")
    training_job_id: int | str | None = None
    sampling_job_id: int | str | None = None
    log_prob_job_id: int | str | None = None

    def to_flat(self) -> FlatConfig:
        """The flat legacy config of the same job (`compat.config.ArcticRLClientConfig`)."""
        tr, sa, be = self.training, self.sampling, self.backend
        flat: dict[str, Any] = {
            "model_name": self.model_name,
            "dtype": self.dtype,
            "max_seq_len": self.max_seq_len,
            "training_gpus": self.training_gpus,
            "sampling_gpus": self.sampling_gpus,
            "log_prob_gpus": self.log_prob_gpus,
            "job_ready_timeout": self.job_ready_timeout,
            "request_timeout": self.request_timeout,
            "full_determinism": tr.full_determinism,
            "checkpoint_path": tr.checkpoint_path,
            "ds_config": dict(tr.ds_config or {}),
            "ds_worker_config": tr.ds_worker_config,
            "cuda_ipc": tr.cuda_ipc,
            "low_memory": tr.low_memory,
            "vllm_config": dict(sa.vllm) or None,
            "arctic_inference_config": sa.arctic_inference_config,
            "log_prob_engine": sa.log_prob_engine,
            "log_prob_ds_config": sa.log_prob_ds_config,
        }
        if self.seed is not None:
            flat["seed"] = self.seed
        if isinstance(be, OnPremConfig):
            flat.update(
                backend="onprem",
                comm_protocol=be.protocol,
                host=be.host,
                port=be.port,
                colocate=be.colocate,
                launch_local_server=True if be.launch_local_server else None,
                server_cuda_visible_devices=be.server_cuda_visible_devices,
                startup_timeout=be.startup_timeout,
            )
        else:
            pat = be.pat if be.pat is not None else os.environ.get(be.pat_env_var)
            flat.update(
                backend="cortex",
                cortex_base_url=be.base_url,
                cortex_host=be.host,
                cortex_database=be.database or None,
                cortex_schema=be.schema_ or None,
                cortex_endpoint=be.endpoint,
                cortex_pat_env_var=be.pat_env_var,
                pat=pat,
                max_retries=be.max_retries,
            )
        job = next(
            (j for j in (self.training_job_id, self.sampling_job_id, self.log_prob_job_id) if j),
            None,
        )
        if job is not None:  # re-attach: "{job}:{role}:{idx}" sub-job ids, or a job id
            flat["job_id"] = str(job).split(":", 1)[0]
        return FlatConfig.model_validate(flat)


def create_unified_client(
    config: UnifiedClientConfig | FlatConfig | Mapping[str, Any],
    *,
    blocking_calls: bool = False,
    server_state: ArcticServerState | None = None,
) -> ArcticRLClient | SyncArcticRLClient:
    """`arctic_platform.client.create_arctic_rl_client`: the async client (or, with
    `blocking_calls`, a blocking one). `config` may also be what `reconnect_config()` returned."""
    if isinstance(config, UnifiedClientConfig):
        flat: FlatConfig | Mapping[str, Any] = config.to_flat()
    elif isinstance(config, Mapping) and _nested(config):
        flat = UnifiedClientConfig.model_validate(config).to_flat()
    else:
        flat = config
    client = create_arctic_rl_client(flat, server_state)
    return SyncArcticRLClient(client) if blocking_calls else client


def _nested(config: Mapping[str, Any]) -> bool:
    """A plain dict of the nested config (a flat one names its backend with a string)."""
    return (
        "training" in config or "sampling" in config or isinstance(config.get("backend"), Mapping)
    )


class SyncArcticRLClient:
    """`arctic_platform.client.SyncArcticRLClient`: every async method of the client, blocking
    (a call made inside a running event loop runs on a worker thread's own loop)."""

    def __init__(self, client: ArcticRLClient) -> None:
        self._client = client
        self.transport = client.transport
        self.config = client.config

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return _blocking(lambda: attr(*args, **kwargs))

        return call

    def __enter__(self) -> SyncArcticRLClient:
        return self

    def __exit__(self, *exc: object) -> None:
        _blocking(self._client.shutdown)


def _blocking(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
