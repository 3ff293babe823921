"""The legacy client configuration (`ArcticRLClientConfig`), with its deployed names and aliases.

Accepts every field the SkyRL and verl integrations set (`adapters.md` §1.3, §2.1) and the
legacy names of the deployed configs (`arctic.md` §6):

- `backend`: `"local"` (what both integrations pin) and `"onprem"` mean our on-prem server at
  `host:port`; `"cortex"` a Cortex gateway. Deprecated aliases `"dss-platform"`,
  `"dss_platform"` (→ onprem) and `"neutrino"`, `"remote"` (→ cortex) warn once.
- `ARCTIC_BACKEND=cortex` (or the older `ARCTIC_RL_BACKEND=cortex`) in the environment turns a
  local config into a Cortex one (what makes "zero integration change" work: the integrations
  hard-code `backend="local"`); the Cortex fields then fall back to `ARCTIC_CORTEX_*`.
- Field aliases: `sample_gpus` → `sampling_gpus`, `sampling_engine` (a dict) → `vllm_config`,
  `arctic_rl_server_state` → the `server_state` argument. Dropped legacy fields
  (`reference_model`, `job_name`, `ray_auto_attach`, `health_check_interval`) warn and are
  ignored. Any other unknown field is refused (all of them named). The DeepSpeed-shaped fields
  (`ds_config`, `ds_worker_config`, `training_config`, ...) become the CreateJob body in
  `job_config.py`, each honoured, refused or warned about by name.
- `comm_protocol`: `"http"`, `"grpc"`, or `"ray"` (the deployed Ray transport; served over HTTP
  here — no Ray is needed — and, as with Ray, the client launches the local server itself when
  none answers at `host:port`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

__all__ = ["ArcticRLClientConfig", "LegacyConfigWarning"]

BACKEND_ALIASES = {
    "local": "onprem",
    "onprem": "onprem",
    "dss-platform": "onprem",
    "dss_platform": "onprem",
    "cortex": "cortex",
    "neutrino": "cortex",
    "remote": "cortex",
}
DEPRECATED_BACKENDS = frozenset({"dss-platform", "dss_platform", "neutrino", "remote"})
FIELD_ALIASES = {"sample_gpus": "sampling_gpus"}
DROPPED_FIELDS = frozenset(
    {"reference_model", "job_name", "ray_auto_attach", "health_check_interval"}
)
ENV_BACKEND = ("ARCTIC_BACKEND", "ARCTIC_RL_BACKEND")
# Legacy Cortex env names (skyrl-verl-cortex-compat) -> our fields; ARCTIC_CORTEX_* are read by
# the SDK's own config.
LEGACY_CORTEX_ENV = {
    "CORTEX_BASE_URL": "cortex_base_url",
    "CORTEX_HOST": "cortex_host",
    "CORTEX_DATABASE": "cortex_database",
    "CORTEX_SCHEMA": "cortex_schema",
    "CORTEX_ENDPOINT": "cortex_endpoint",
    "CORTEX_PAT_ENV_VAR": "cortex_pat_env_var",
}


class LegacyConfigWarning(DeprecationWarning):
    """A legacy configuration name was translated or dropped."""


def _warn(msg: str) -> None:
    warnings.warn(msg, LegacyConfigWarning, stacklevel=4)


class ArcticRLClientConfig(BaseModel):
    """What `create_arctic_rl_client` takes (a model or a plain dict of the same fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    backend: Literal["onprem", "cortex"] = "onprem"
    comm_protocol: Literal["http", "grpc", "ray"] = "http"
    host: str | None = None
    """On-prem server host (default `localhost`)."""
    port: int | None = None
    """On-prem server port (default 7000, the deployed server's)."""
    base_url: str | None = None
    """Full server URL; wins over host/port and the Cortex fields."""
    grpc_target: str | None = None
    pat: SecretStr | None = None
    """Token sent as `Authorization: Bearer` (on-prem servers with `--token` need it too)."""
    launch_local_server: bool | None = None
    """Start `python -m arctic_servers.onprem serve` at host:port: True = always, False = never,
    None = only for `comm_protocol="ray"` and only when nothing answers there."""
    server_python: str | None = None
    """Interpreter of a launched server (default: this one)."""
    server_cuda_visible_devices: str | None = None
    """`CUDA_VISIBLE_DEVICES` of a launched server (default: this process's environment)."""
    max_retries: int | None = None
    """Retries of one call on 429 / retryable 5xx / connection failures (the SDK's default)."""
    startup_timeout: float = 300.0
    server_logs: bool = False
    """Echo a launched server's output to this process's stdout."""
    job_ready_timeout: float = 600.0
    request_timeout: float = 1800.0

    model_name: str = ""
    dtype: str | None = None
    """Weights dtype of every sub-job (`float32`, `bfloat16`, `float16`; default: the bf16 / fp16
    switch of `ds_config`, else the server's)."""
    max_seq_len: int | None = None
    """Every sub-job's `max_seq_len` (default: `training_config.max_length`, else
    `vllm_config.max_model_len`)."""
    checkpoint_path: str | None = None
    seed: int = 42
    full_determinism: bool = False
    training_gpus: int = 1
    sampling_gpus: int = 0
    log_prob_gpus: int = 0
    log_prob_engine: Literal["deepspeed", "vllm", "hf"] = "deepspeed"
    colocate: bool = False
    cuda_ipc: bool | None = None
    low_memory: bool | None = None
    ds_config: dict[str, Any] = Field(default_factory=dict)
    log_prob_ds_config: dict[str, Any] | None = None
    ds_worker_config: dict[str, Any] | None = None
    training_config: dict[str, Any] | None = None
    vllm_config: dict[str, Any] | None = None
    arctic_inference_config: dict[str, Any] | None = None
    experiment_name: str = ""
    lease_seconds: int = 0

    cortex_base_url: str | None = None
    cortex_host: str | None = None
    cortex_database: str | None = None
    cortex_schema: str | None = None
    cortex_endpoint: str | None = None
    cortex_pat_env_var: str | None = None

    job_id: str | None = None
    """Re-attach to this job instead of creating one (what `reconnect_config()` fills in)."""
    owner: bool = False
    """Set by `reconnect_config()` copies: False = `shutdown()` never cancels the job."""

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        if isinstance(data, BaseModel):
            data = data.model_dump()
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old, new in FIELD_ALIASES.items():
            if old in data:
                _warn(f"config field {old!r} is deprecated; use {new!r}")
                value = data.pop(old)
                data.setdefault(new, value)
        if "sampling_engine" in data:
            value = data.pop("sampling_engine")
            if isinstance(value, dict):
                _warn("config field 'sampling_engine' is deprecated; use 'vllm_config'")
                data.setdefault("vllm_config", value)
            else:
                _warn(f"config field 'sampling_engine'={value!r} is ignored (vLLM always samples)")
        for name in sorted(DROPPED_FIELDS & set(data)):
            _warn(f"config field {name!r} is no longer used and is ignored")
            data.pop(name)
        for name in ("training_job_id", "sampling_job_id", "log_prob_job_id"):
            value = data.pop(name, None)  # legacy reconnect ids: "{job}:{role}:{idx}" or a job
            if value is not None and not data.get("job_id"):
                data["job_id"] = str(value).split(":", 1)[0]
        backend = str(data.get("backend") or "local")
        if backend not in BACKEND_ALIASES:
            raise ValueError(f"backend {backend!r}: expected one of {sorted(BACKEND_ALIASES)}")
        if backend in DEPRECATED_BACKENDS:
            _warn(f"backend {backend!r} is deprecated; use {BACKEND_ALIASES[backend]!r}")
        data["backend"] = BACKEND_ALIASES[backend]
        env = next((os.environ[v] for v in ENV_BACKEND if os.environ.get(v, "").strip()), "")
        if env.strip().lower() == "cortex" and data["backend"] == "onprem":
            data["backend"] = "cortex"
            for var, name in LEGACY_CORTEX_ENV.items():
                if os.environ.get(var, "").strip() and data.get(name) is None:
                    data[name] = os.environ[var].strip()
        return data

    # ------------------------------------------------------------------ derived

    def server_url(self) -> str | None:
        """The base URL the client talks to, or None when the SDK's env fallback decides."""
        if self.base_url:
            return self.base_url.rstrip("/")
        if self.backend == "cortex":
            return self.cortex_base_url
        return f"http://{self.host or 'localhost'}:{self.port or 7000}"

    def should_launch(self, reachable: bool) -> bool:
        if self.backend != "onprem" or (self.job_id is not None and reachable):
            return False
        if self.launch_local_server is not None:
            return self.launch_local_server and not reachable
        return self.comm_protocol == "ray" and not reachable

    def sdk_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `arctic_sdk.AsyncClient` for this config."""
        kw: dict[str, Any] = {
            "transport": "grpc" if self.comm_protocol == "grpc" else "http",
            "job_ready_timeout": self.job_ready_timeout,
            "timeout": self.request_timeout,
            "progress": False,
        }
        url = self.server_url()
        if url:
            kw["base_url"] = url
        elif self.cortex_host:
            kw["host"] = self.cortex_host
        if self.backend == "cortex":
            for name in ("database", "schema", "endpoint", "pat_env_var"):
                value = getattr(self, f"cortex_{name}")
                if value:
                    kw[name] = value
        if self.pat is not None:
            kw["token"] = self.pat
        if self.grpc_target:
            kw["grpc_target"] = self.grpc_target
        if self.max_retries is not None:
            kw["max_retries"] = self.max_retries
        return kw

    def create_job_body(self, keys: Mapping[str, frozenset[str]] | None = None) -> dict[str, Any]:
        """The CreateJob body for a server accepting `keys` (`job_config.plan_job`: refusals
        raise `UnsupportedConfigError`; the warnings are the client's to emit)."""
        from .job_config import UnsupportedConfigError, plan_job

        plan = plan_job(self, keys)
        if plan.problems:
            raise UnsupportedConfigError(plan.problems)
        return plan.body
